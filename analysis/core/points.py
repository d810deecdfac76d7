"""What every experiment's points share: input draws, sampled rows, the row of a point, the gate's numbers.

``randn`` and ``generator`` draw seeded inputs on the point's device; ``sample_rows`` picks the rows the
float64 gate checks (the first and last ones: under a causal mask they see the fewest and the most keys);
``make_row`` builds a row from a point's identity and whatever metrics it measured (NaN for the rest);
``failed`` is the row of an implementation that raised; ``gate`` the error columns of one output against its
float64 reference under the tolerance policy (``kernels.tolerance``); ``rate`` an amount per time. Timing
itself is ``analysis.core.harness``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from analysis.core import harness
from analysis.core.provenance import now_utc
from kernels import tolerance

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def generator(device, seed: int) -> torch.Generator:
    return torch.Generator(device=torch.device(device)).manual_seed(seed)


def randn(shape, gen: torch.Generator, dtype: torch.dtype, device, scale: float = 1.0) -> torch.Tensor:
    """Normal inputs drawn on ``device`` (fast for the long K/V of decoding), in float32, scaled, then cast."""
    x = torch.randn(shape, generator=gen, dtype=torch.float32, device=device)
    return (x * scale if scale != 1.0 else x).to(dtype)


def sample_rows(count: int, n_rows: int) -> torch.Tensor:
    """The first and last ``n_rows // 2`` of ``count`` rows (all of them when there are not more)."""
    half = max(1, n_rows // 2)
    if count <= 2 * half:
        return torch.arange(count)
    # the first rows see the fewest keys under a causal mask, the last rows the most
    return torch.cat([torch.arange(half), torch.arange(count - half, count)])


def short(message: str) -> str:
    """A message shortened for a progress line ("" stays "")."""
    return f" ({message[:120]})" if message else ""


def make_row(base: dict, impl: str, status: str, message: str, columns: Sequence[str], **metrics) -> dict:
    """One row: ``base`` (identity and provenance), this implementation's outcome, the metric ``columns``
    from ``metrics`` (NaN where absent) and its kernel configuration ("" where none)."""
    row = {**base, "impl": impl, "status": status, "message": message, "timestamp": now_utc()}
    for key in columns:
        row[key] = metrics.get(key, math.nan)
    row["kernel_config"] = metrics.get("kernel_config", "")
    return row


def failed(make: Callable[..., dict], base: dict, impl: str, exc: BaseException, **metrics) -> dict:
    """The row (``make(base, impl, status, message, **metrics)``) of an implementation that raised ``exc``:
    its status and message (``harness.classify``), with the metrics gathered before it failed; the GPU
    memory is released first."""
    status, message = harness.classify(exc)
    harness.release_memory()
    return make(base, impl, status, message, **metrics)


def gate(name: str, out: torch.Tensor, ref: torch.Tensor, same: torch.Tensor, dtype) -> tuple[dict, str]:
    """The error columns of ``out`` against the float64 ``ref`` (bounded by same-precision ``same``) and the
    failure text ("" when the gate passes)."""
    c = tolerance.check(name, out, ref, same, dtype)
    scale = ref.detach().abs().max().item() if ref.numel() else 0.0
    metrics = dict(
        max_abs_err=c.max_abs,
        rms_err=c.rms,
        rel_err=c.max_abs / scale if scale else math.nan,
        ref_err=c.ref_err,
        err_bound=c.bound,
    )
    return metrics, "" if c.ok else c.describe()


def rate(amount: float, ms: float, unit: float) -> float:
    """``amount`` per ``ms`` milliseconds in ``unit``s per second (1e12: TFLOP/s; 1e9: GB/s)."""
    return amount / (ms * 1e-3) / unit if ms and math.isfinite(ms) and amount == amount else math.nan
