"""The tolerance policy, in one place, for tests and for the benchmark's correctness gate.

Rule (after the FlashAttention test suite): a kernel's max-abs error against a float64 reference must be
at most ``RATIO`` (2) times the error of plain PyTorch computing the same thing in the same precision,
plus a per-dtype floor of about one unit in the last place of an O(1) output (so that a reference that
happens to round exactly does not demand the impossible). NaN or Inf where the reference is finite never
passes. Failures name the tensor and print max-abs and RMS error, the PyTorch error and the bound.
"""

from __future__ import annotations

import dataclasses

import torch

RATIO = 2.0
FLOOR = {
    torch.float32: 1e-5,
    torch.float16: 1e-3,  # fp16 has 10 mantissa bits: 2^-10 ≈ 9.8e-4
    torch.bfloat16: 8e-3,  # bf16 has 7 mantissa bits: 2^-7 ≈ 7.8e-3
}


@dataclasses.dataclass(frozen=True)
class ErrorCheck:
    name: str
    max_abs: float
    rms: float
    ref_err: float
    bound: float

    @property
    def ok(self) -> bool:
        return self.max_abs <= self.bound  # False for NaN

    def describe(self) -> str:
        return (
            f"{self.name}: max-abs error {self.max_abs:.3e}, RMS {self.rms:.3e}; same-precision PyTorch "
            f"max-abs {self.ref_err:.3e}; bound {RATIO:g}×{self.ref_err:.3e} + floor = {self.bound:.3e}"
        )


def error_stats(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(max-abs, RMS) of ``out - ref`` in float64; NaN/Inf in ``out`` give NaN."""
    diff = out.detach().to(torch.float64) - ref.detach().to(torch.float64)
    if diff.numel() == 0:
        return 0.0, 0.0
    if not torch.isfinite(diff).all():
        return float("nan"), float("nan")
    return diff.abs().max().item(), diff.pow(2).mean().sqrt().item()


def check(
    name: str, out: torch.Tensor, ref: torch.Tensor, same_precision: torch.Tensor, dtype: torch.dtype
) -> ErrorCheck:
    """Compare ``out`` with the float64 ``ref``, bounded by the error of ``same_precision`` PyTorch."""
    if dtype not in FLOOR:
        raise ValueError(f"no tolerance floor for {dtype}")
    max_abs, rms = error_stats(out, ref)
    ref_err, _ = error_stats(same_precision, ref)
    if ref_err != ref_err:  # PyTorch itself gave NaN: fall back to the floor alone
        ref_err = 0.0
    return ErrorCheck(name, max_abs, rms, ref_err, RATIO * ref_err + FLOOR[dtype])


def assert_close(
    name: str, out: torch.Tensor, ref: torch.Tensor, same_precision: torch.Tensor, dtype: torch.dtype
) -> ErrorCheck:
    result = check(name, out, ref, same_precision, dtype)
    if not result.ok:
        raise AssertionError(result.describe())
    return result
