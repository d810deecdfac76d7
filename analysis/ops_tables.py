"""The result table of the operator experiments (W4A16 / W8A16 linear layers and MoE layers): ``ops.csv``.

One row per attempted point, in long format, like the attention rows of ``analysis.tables`` (same outcome,
telemetry and provenance columns, the same statuses), with the identity of a GEMM or MoE point instead of
an attention shape. ``workflow/schemas/ops_result.schema.yaml`` describes every column for users.

identity       experiment (w4a16 / moe), family (quant / moe), op (linear, grouped-gemm, moe-layer), impl,
               dtype, model (the layer shape's name), m, n, k (GEMM dimensions: rows, out features, in
               features; MoE: m = tokens·top_k rows, n = the expert FFN width, k = hidden), group_size,
               experts, top_k, tokens, routing (uniform / zipf), stage (MoE time split: routing, dispatch,
               gemm, combine; "total" for a whole call)
outcome        status, message, timed
metrics        ms_median, ms_p20, ms_p80 (GPU time), host_ms (host-side cost of one eager call), tflops,
               model_bytes (weight bytes the point reads, from ``analysis.models``), gbps, peak_mem_mib,
               max_abs_err, rms_err, rel_err (max-abs error over the reference's max-abs value), ref_err,
               err_bound, quant_err (quantised layer against the unquantised weights: relative RMS error)
telemetry, provenance: as ``analysis.tables``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from analysis.core.tables import PROVENANCE, STATUSES, TELEMETRY, frame, read_tables, write_frame

IDENTITY = ["experiment", "family", "op", "impl", "dtype", "model", "m", "n", "k", "group_size", "experts", "top_k",
            "tokens", "routing", "stage"]  # fmt: skip
OUTCOME = ["status", "message", "timed"]
METRICS = ["ms_median", "ms_p20", "ms_p80", "host_ms", "tflops", "model_bytes", "gbps", "peak_mem_mib", "max_abs_err",
           "rms_err", "rel_err", "ref_err", "err_bound", "quant_err"]  # fmt: skip
COLUMNS = IDENTITY + OUTCOME + METRICS + TELEMETRY + PROVENANCE
# Added after results were shipped (the schema does not require them): NaN in an older table.
OPTIONAL = ["host_ms"]
STAGES = ("routing", "dispatch", "gemm", "combine", "total")
SCHEMA = Path(__file__).resolve().parents[1] / "workflow" / "schemas" / "ops_result.schema.yaml"


def to_frame(rows: Iterable[dict]) -> pd.DataFrame:
    """Ops rows to a frame with exactly ``COLUMNS``; unknown columns or statuses are an error."""
    return frame(rows, COLUMNS, STATUSES, "ops result")


def write_rows(rows: Iterable[dict], path: str | Path) -> pd.DataFrame:
    return write_frame(to_frame(rows), path)


def read_rows(paths: Iterable[str | Path]) -> pd.DataFrame:
    """Concatenate ops CSVs (one per job) into one table with ``COLUMNS``, each file validated against the
    schema first (``analysis.validate``)."""
    return read_tables(paths, COLUMNS, OPTIONAL, what="ops result", schema=SCHEMA.name)


COPY_KEYS = ["model", "dtype", "group_size"]  # a quant shard: one copy-weight row per layer, dtype and group


def with_copy_gbps(rows: pd.DataFrame, table: pd.DataFrame) -> pd.Series:
    """The copy bandwidth of the packed weight (``copy-weight`` rows of ``table``) for each of ``rows``, by
    layer, dtype and group size (and GPU where there is a ``gpu`` column): NaN where none was measured."""
    keys = COPY_KEYS + (["gpu"] if "gpu" in rows.columns and "gpu" in table.columns else [])
    copy = table[table["impl"] == "copy-weight"][[*keys, "gbps"]].dropna(subset=["gbps"])
    copy = copy.drop_duplicates(keys, keep="last").rename(columns={"gbps": "_copy_gbps"})
    return rows[keys].merge(copy, on=keys, how="left")["_copy_gbps"].set_axis(rows.index)


def moe_stage_split(rows: pd.DataFrame) -> pd.DataFrame:
    """Our MoE layer's time split: per (model, experts, top_k, dtype, routing, tokens) point whose four stages
    all finished, each stage's ms (``<stage>_ms``) and share of their sum (``<stage>_share``), and the
    data-movement share (routing + dispatch + combine). Points missing a stage are left out, not counted as 0."""
    stages = list(STAGES[:-1])
    keys = ["model", "experts", "top_k", "dtype", "routing", "tokens"]
    d = rows[(rows["impl"] == "ours-moe") & rows["stage"].isin(stages)]
    d = d.assign(stage=d["stage"] + "_ms")  # "routing" is also a column of the index
    wide = d.pivot_table(index=keys, columns="stage", values="ms_median", dropna=False)
    cols = [f"{s}_ms" for s in stages]
    wide = wide.reindex(columns=cols).dropna().reset_index()
    wide.columns.name = None
    total = wide[cols].sum(axis=1)
    for s in stages:
        wide[f"{s}_share"] = wide[f"{s}_ms"] / total
    wide["movement_share"] = 1.0 - wide["gemm_share"]
    return wide
