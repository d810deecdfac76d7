"""Tidy result tables: the one row format every experiment writes, and the collect step.

Every benchmark point is one row in long format. A row is written for every point that was attempted,
whatever happened to it: ``status`` says how it ended and ``message`` why, so a failed or out-of-memory
point is visible in the tables and figures instead of silently missing.

Columns (see ``COLUMNS``; ``workflow/schemas/result.schema.yaml`` describes each one for users):

identity       experiment, family, op, impl, dtype, mode, batch, heads, heads_kv, seqlen_q, seqlen_k,
               head_dim, causal
outcome        status (ok / oom / unsupported / error / mismatch), message, timed (False for
               correctness-only rows, e.g. the interpreter on a CPU)
metrics        ms_median, ms_p20, ms_p80, tflops (from ``analysis.flops``), peak_mem_mib (peak allocated
               during one call minus what was allocated before it), max_abs_err, rms_err (against the
               float64 reference), ref_err (max-abs error of plain PyTorch at the same precision),
               err_bound (the tolerance the policy allowed)
telemetry      sm_clock_mhz, mem_clock_mhz, temp_c, power_w (NVML samples taken while the point was timed)
provenance     gpu_name, gpu, driver, cuda, torch, triton, python, git_sha, timestamp, kernel_config
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

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
]
OUTCOME = ["status", "message", "timed"]
METRICS = [
    "ms_median",
    "ms_p20",
    "ms_p80",
    "tflops",
    "peak_mem_mib",
    "max_abs_err",
    "rms_err",
    "ref_err",
    "err_bound",
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

STATUSES = ("ok", "oom", "unsupported", "error", "mismatch")


def to_frame(rows: Iterable[dict]) -> pd.DataFrame:
    """Rows (dicts) to a frame with exactly ``COLUMNS`` in order; unknown keys are an error."""
    rows = list(rows)
    for r in rows:
        extra = set(r) - set(COLUMNS)
        if extra:
            raise ValueError(f"row has columns outside the schema: {sorted(extra)}")
        if r.get("status") not in STATUSES:
            raise ValueError(f"row status must be one of {STATUSES}, got {r.get('status')!r}")
    df = pd.DataFrame(rows, columns=COLUMNS)
    return df


def write_rows(rows: Iterable[dict], path: str | Path) -> pd.DataFrame:
    """Write one job's rows to ``path`` (CSV), creating the folder. Returns the frame written."""
    df = to_frame(rows)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    df.to_csv(tmp, index=False)
    tmp.replace(path)  # a job killed mid-write leaves no half file that looks finished
    return df


def read_rows(paths: Iterable[str | Path]) -> pd.DataFrame:
    """Concatenate result CSVs (one per job) into one table with the schema's columns."""
    frames = [pd.read_csv(p, keep_default_na=True) for p in paths]
    frames = [f for f in frames if len(f.columns)]
    if not frames:
        return pd.DataFrame(columns=COLUMNS)
    df = pd.concat(frames, ignore_index=True)
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"result files lack columns {missing}")
    return df[COLUMNS]


def load_provenance(path: str | Path) -> dict:
    with open(path) as f:
        return json.load(f)
