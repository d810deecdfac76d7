"""What the operator experiments (``quant``, ``moe``) share: their rows and the correctness gate's numbers.

Timing is ``analysis.harness.measure``; the input helpers (dtype names, generator, normal draws, sampled
rows, short messages) are the attention experiment's, re-exported here. ``timed=False`` (the interpreter
on a CPU) stops after the correctness gate, as attention's interpreter check does.
"""

from __future__ import annotations

import math

import torch

from analysis.core import harness
from analysis.core.provenance import now_utc
from analysis.experiments.attention import DTYPES, generator, randn, short  # noqa: F401 (re-exported)
from analysis.experiments.attention import _check_rows as sample_rows  # noqa: F401 (re-exported)
from analysis.ops_tables import METRICS, TELEMETRY
from kernels import tolerance


def make_row(base: dict, impl: str, status: str, message: str, **metrics) -> dict:
    """One ops row: ``base`` (identity and provenance) with this impl's outcome and metrics (NaN if absent)."""
    row = {**base, "impl": impl, "status": status, "message": message, "timestamp": now_utc()}
    for key in METRICS + TELEMETRY:
        row[key] = metrics.get(key, math.nan)
    row["kernel_config"] = metrics.get("kernel_config", "")
    row.setdefault("stage", "total")
    return row


def failed_row(base: dict, impl: str, exc: BaseException, **metrics) -> dict:
    """The row of an impl that raised ``exc``: its status and message (``harness.classify``), with the
    metrics gathered before it failed; the GPU memory is released first."""
    status, message = harness.classify(exc)
    harness.release_memory()
    return make_row(base, impl, status, message, **metrics)


def gate(name: str, out: torch.Tensor, ref: torch.Tensor, same: torch.Tensor, dtype) -> tuple[dict, str]:
    """The error columns of ``out`` against the float64 ``ref`` (bounded by same-precision ``same``) and the
    failure text ("" when the gate passes)."""
    c = tolerance.check(name, out, ref, same, dtype)
    scale = ref.detach().abs().max().item() if ref.numel() else 0.0
    metrics = dict(max_abs_err=c.max_abs, rms_err=c.rms, rel_err=c.max_abs / scale if scale else math.nan,
                   ref_err=c.ref_err, err_bound=c.bound)  # fmt: skip
    return metrics, "" if c.ok else c.describe()


def rate(amount: float, ms: float, unit: float) -> float:
    """``amount`` per ``ms`` milliseconds in ``unit``s per second (1e12: TFLOP/s; 1e9: GB/s)."""
    return amount / (ms * 1e-3) / unit if ms and math.isfinite(ms) and amount == amount else math.nan
