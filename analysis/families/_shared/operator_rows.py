"""The rows of the operator table (``ops.csv``), which the W4A16 and MoE families share: one row of a point,
and the row of a point that failed."""

from __future__ import annotations

from analysis.core import points

# the metric and telemetry columns of an operator row (NaN where a point does not measure one)
METRICS = (
    "ms_median",
    "ms_p20",
    "ms_p80",
    "host_ms",
    "spread_rounds",
    "ms_round_min",
    "ms_round_max",
    "tflops",
    "model_bytes",
    "gbps",
    "peak_mem_mib",
    "max_abs_err",
    "rms_err",
    "rel_err",
    "ref_err",
    "err_bound",
    "quant_err",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "temp_c",
    "power_w",
)


def make_row(base: dict, impl: str, status: str, message: str, **metrics) -> dict:
    """One operator row: ``base`` (identity and provenance) with this impl's outcome and metrics (NaN if absent)."""
    row = points.make_row(base, impl, status, message, METRICS, **metrics)
    row.setdefault("stage", "total")
    return row


def failed_row(base: dict, impl: str, exc: BaseException, **metrics) -> dict:
    """The row of an impl that raised ``exc``: its status and message, with the metrics gathered before it
    failed; the GPU memory is released first (``analysis.core.points.failed``)."""
    return points.failed(make_row, base, impl, exc, **metrics)
