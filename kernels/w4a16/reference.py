"""The W4A16 / W8A16 reference: the product with the dequantised weight, for tests and benchmark gates.

``linear_reference(x, weight, bias, dtype)`` is ``x @ dequantize(weight).T (+ bias)`` computed in ``dtype``:
float64 for the ground truth, or x's own dtype for the "same-precision PyTorch" of the tolerance policy
(``kernels.tolerance``; the dequantised weight rounded to that dtype, the product accumulated in float32
and rounded once, as a dequantise-then-``F.linear`` would). Works for both formats on any device.
"""

from __future__ import annotations

import torch

from kernels.w4a16.formats import W4Weight, W8Weight, dequantize, dequantize_w8

__all__ = ["dequantized", "linear_reference"]


def dequantized(weight: W4Weight | W8Weight, dtype: torch.dtype) -> torch.Tensor:
    """The ``[N, K]`` weight a kernel multiplies by, in ``dtype``."""
    return dequantize(weight, dtype) if isinstance(weight, W4Weight) else dequantize_w8(weight, dtype)


def linear_reference(
    x: torch.Tensor, weight: W4Weight | W8Weight, bias: torch.Tensor | None = None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``x @ dequantize(weight).T (+ bias)`` in ``dtype`` (default: x's), shaped ``[..., N]``."""
    dtype = dtype or x.dtype
    if dtype == torch.float64:
        out = x.double() @ dequantized(weight, torch.float64).T
        return out + bias.double() if bias is not None else out
    low = dequantized(weight, dtype)
    out = (x.float() @ low.float().T).to(dtype) if dtype != torch.float32 else x @ low.T
    return (out.float() + bias.float()).to(dtype) if bias is not None else out
