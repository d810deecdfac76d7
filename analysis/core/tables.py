"""Tidy result tables: the one row format every experiment writes, and the collect step.

Every benchmark point is one row in long format. A row is written for every point that was attempted,
whatever happened to it: ``status`` says how it ended and ``message`` why, so a failed or out-of-memory
point is visible in the tables and figures instead of silently missing.

Columns (see ``COLUMNS``; ``workflow/schemas/result.schema.yaml`` describes each one for users):

identity       experiment, family, op, impl, dtype, mode (fwd / bwd / fwd+bwd), batch, heads, heads_kv,
               seqlen_q, seqlen_k, head_dim, causal, tokens (total tokens of a variable-length batch),
               inputs (the input distribution: normal, or fp8-accuracy's outliers / large)
outcome        status (ok / oom / unsupported / error / mismatch), message, timed (False for
               correctness-only rows, e.g. the interpreter on a CPU)
metrics        ms_median, ms_p20, ms_p80 (GPU time), host_ms (the host-side cost of one eager call,
               ``analysis.harness``), tflops (from ``analysis.flops``, for the row's mode),
               model_bytes (bytes the point must move at minimum, where a byte model applies), gbps
               (model_bytes / median time), pad_waste (share of a padded batch's FLOPs spent on padding),
               peak_mem_mib (peak allocated during one timed call minus what was allocated before it),
               max_abs_err, rms_err (against the float64 reference; for gradient modes the worst of the
               output and dq, dk, dv relative to its bound), ref_err (max-abs error of plain PyTorch at
               the same precision), err_bound (the tolerance the policy allowed), p_underflow and
               p_mass_lost (FP8 rows of fp8-accuracy: share of P's entries, and of its mass, flushed to 0)
telemetry      sm_clock_mhz, mem_clock_mhz, temp_c, power_w (NVML samples taken while the point was timed)
provenance     gpu_name, gpu, driver, cuda, torch, triton, python, git_sha, timestamp, kernel_config

Columns in ``OPTIONAL`` were added after tables had been shipped; a table without them still loads and
gets them as NaN (or ``OPTIONAL_DEFAULTS``). They are exactly the schema's columns that it does not
require (a test keeps the two equal). Any other missing column is an error.

Every file read is validated first (``analysis.validate``: the schema's columns, types, status vocabulary,
value ranges and row rules), so a truncated, corrupted or inconsistent table fails the step that reads
it, with the file, line and column named.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from analysis.core import outputs, validate

IDENTITY = [
    "experiment",
    "family",
    "op",
    "impl",
    "dtype",
    "mode",
    "batch",
    "heads",
    "heads_kv",
    "seqlen_q",
    "seqlen_k",
    "head_dim",
    "causal",
    "tokens",
    "inputs",
]
OUTCOME = ["status", "message", "timed"]
METRICS = [
    "ms_median",
    "ms_p20",
    "ms_p80",
    "host_ms",
    "tflops",
    "model_bytes",
    "gbps",
    "pad_waste",
    "peak_mem_mib",
    "max_abs_err",
    "rms_err",
    "ref_err",
    "err_bound",
    "p_underflow",
    "p_mass_lost",
]
TELEMETRY = ["sm_clock_mhz", "mem_clock_mhz", "temp_c", "power_w"]
PROVENANCE = [
    "gpu_name",
    "gpu",
    "driver",
    "cuda",
    "torch",
    "triton",
    "python",
    "git_sha",
    "timestamp",
    "kernel_config",
]
COLUMNS = IDENTITY + OUTCOME + METRICS + TELEMETRY + PROVENANCE
# Added after results were shipped: filled with NaN when an older table lacks them.
OPTIONAL = ["tokens", "model_bytes", "gbps", "pad_waste", "inputs", "p_underflow", "p_mass_lost", "host_ms"]
# What an OPTIONAL column means in a table written before it existed (else NaN).
OPTIONAL_DEFAULTS = {"inputs": "normal"}

STATUSES = ("ok", "oom", "unsupported", "error", "mismatch")


def frame(rows: Iterable[dict], columns: list[str], statuses: tuple[str, ...], schema: str) -> pd.DataFrame:
    """Rows (dicts) to a frame with exactly ``columns`` in order; unknown keys or statuses are an error."""
    rows = list(rows)
    for r in rows:
        extra = set(r) - set(columns)
        if extra:
            raise ValueError(f"row has columns outside the {schema} schema: {sorted(extra)}")
        if r.get("status") not in statuses:
            raise ValueError(f"row status must be one of {statuses}, got {r.get('status')!r}")
    return pd.DataFrame(rows, columns=columns)


def to_frame(rows: Iterable[dict]) -> pd.DataFrame:
    """Result rows to a frame with exactly ``COLUMNS``."""
    return frame(rows, COLUMNS, STATUSES, "result")


def write_frame(df: pd.DataFrame, path: str | Path) -> pd.DataFrame:
    """Write a table to ``path`` (CSV) through a temporary file (``analysis.outputs``), creating the folder:
    a job killed mid-write leaves no half file that looks finished."""
    outputs.write_csv(df, path)
    return df


def write_rows(rows: Iterable[dict], path: str | Path) -> pd.DataFrame:
    """Write one job's result rows to ``path`` (CSV). Returns the frame written."""
    return write_frame(to_frame(rows), path)


SCHEMA = "result.schema.yaml"


def read_rows(paths: Iterable[str | Path]) -> pd.DataFrame:
    """Concatenate result CSVs (one per job) into one table with the schema's columns, each file validated."""
    return read_tables(paths, COLUMNS, OPTIONAL, OPTIONAL_DEFAULTS, "result", SCHEMA)


def read_tables(paths, columns: list[str], optional=(), defaults=None, what: str = "result",
                schema: str | None = None) -> pd.DataFrame:  # fmt: skip
    """Concatenate CSVs (one per job) into one table with exactly ``columns``, each validated against
    ``schema`` (a file of ``workflow/schemas``; ``analysis.validate``) first. A file without some of the
    ``optional`` columns (written before they existed) gets them as ``defaults`` or NaN, each file on its
    own; any other missing column is an error."""
    defaults = defaults or {}
    if schema is not None:
        frames = [validate.read_csv(p, schema) for p in paths]
    else:
        frames = [pd.read_csv(p, keep_default_na=True) for p in paths]
    if not frames:
        return pd.DataFrame(columns=columns)
    frames = [f.assign(**{c: defaults.get(c, float("nan")) for c in optional if c not in f.columns})
              for f in frames]  # fmt: skip
    df = pd.concat(frames, ignore_index=True)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{what} files lack columns {missing}")
    return df[columns]


def load_provenance(path: str | Path) -> dict:
    """An ``environment.json``, validated (``analysis.validate.read_environment``)."""
    return validate.read_environment(path)
