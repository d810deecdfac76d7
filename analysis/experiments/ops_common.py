"""What the operator experiments (``quant``, ``moe``) share: rows, the correctness gate's numbers, timing.

The timing method is the harness's (``analysis.harness``): peak extra memory of one call, then
``time_gpu`` with NVML telemetry sampled while it runs. ``timed=False`` (the interpreter on a CPU) stops
after the correctness gate, as attention's interpreter check does.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from analysis import harness
from analysis.ops_tables import METRICS, TELEMETRY
from analysis.provenance import now_utc
from kernels import tolerance

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


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


def sample_rows(m: int, n_rows: int) -> torch.Tensor:
    """The first and last ``n_rows // 2`` of ``m`` rows (all of them when there are few)."""
    half = max(1, n_rows // 2)
    if m <= 2 * half:
        return torch.arange(m)
    return torch.cat([torch.arange(half), torch.arange(m - half, m)])


def gate(name: str, out: torch.Tensor, ref: torch.Tensor, same: torch.Tensor, dtype) -> tuple[dict, str]:
    """The error columns of ``out`` against the float64 ``ref`` (bounded by same-precision ``same``) and the
    failure text ("" when the gate passes)."""
    c = tolerance.check(name, out, ref, same, dtype)
    scale = ref.detach().abs().max().item() if ref.numel() else 0.0
    metrics = dict(max_abs_err=c.max_abs, rms_err=c.rms, rel_err=c.max_abs / scale if scale else math.nan,
                   ref_err=c.ref_err, err_bound=c.bound)  # fmt: skip
    return metrics, "" if c.ok else c.describe()


def time_call(call: Callable[[], object], warmup_ms: float, rep_ms: float) -> dict:
    """Peak extra memory of one call, then its timing and telemetry (the harness's method)."""
    metrics = {"peak_mem_mib": harness.peak_extra_memory_mib(call)}
    with harness.Telemetry() as tel:
        t = harness.time_gpu(call, warmup_ms, rep_ms)
    metrics.update(tel.summary())
    metrics.update(ms_median=t.ms_median, ms_p20=t.ms_p20, ms_p80=t.ms_p80)
    return metrics


def rate(amount: float, ms: float, unit: float) -> float:
    """``amount`` per ``ms`` milliseconds in ``unit``s per second (1e12: TFLOP/s; 1e9: GB/s)."""
    return amount / (ms * 1e-3) / unit if ms and math.isfinite(ms) and amount == amount else math.nan


def short(message: str) -> str:
    return f" ({message[:120]})" if message else ""


def generator(device, seed: int) -> torch.Generator:
    return torch.Generator(device=torch.device(device)).manual_seed(seed)


def randn(shape, gen: torch.Generator, dtype: torch.dtype, device, scale: float = 1.0) -> torch.Tensor:
    """Normal values drawn on ``device`` in float32, scaled, then cast."""
    return (torch.randn(shape, generator=gen, dtype=torch.float32, device=device) * scale).to(dtype)
