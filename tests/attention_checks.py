"""Checks shared by the attention kernel tests: inputs, and outputs and gradients against float64.

Every comparison goes through the tolerance policy (kernels/tolerance.py): error against the float64
reference at most twice that of plain PyTorch (three-step attention) at the same precision, plus a floor.
"""

from __future__ import annotations

import torch

from kernels import tolerance
from kernels.attention import reference


def random_tensors(shapes, dtype, device, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Normal random tensors of the given shapes, drawn on the CPU (same values on every device)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return tuple(torch.randn(s, generator=gen).to(device=device, dtype=dtype) for s in shapes)


def assert_matches_reference(name, out, q, k, v, causal=False, sm_scale=None) -> None:
    """The output of an attention kernel against float64 attention."""
    ref = reference.reference_attention(q, k, v, causal, sm_scale)
    same_precision = reference.naive_attention(q, k, v, causal, sm_scale)
    tolerance.assert_close(name, out, ref, same_precision, q.dtype)


def output_and_grads(fn, q, k, v, do, dtype=None) -> list[torch.Tensor]:
    """[out, dq, dk, dv] of ``fn(q, k, v)`` with upstream gradient ``do`` (inputs cast to ``dtype``)."""
    leaves = [x.detach().to(dtype or x.dtype).requires_grad_(True) for x in (q, k, v)]
    out = fn(*leaves)
    out.backward(do.to(dtype or do.dtype))
    return [out.detach(), *(x.grad for x in leaves)]


def assert_gradients_match(name, fn, q, k, v, do, causal=False, sm_scale=None) -> list[torch.Tensor]:
    """Output and every gradient of ``fn`` against float64 autograd; returns ours [out, dq, dk, dv]."""
    ours = output_and_grads(fn, q, k, v, do)
    ref = output_and_grads(lambda *t: reference.reference_attention(*t, causal, sm_scale), q, k, v, do, torch.float64)
    same = output_and_grads(lambda *t: reference.naive_attention(*t, causal, sm_scale), q, k, v, do)
    for part, g, r, s in zip(("out", "dq", "dk", "dv"), ours, ref, same, strict=True):
        assert g.shape == r.shape and g.dtype == q.dtype, f"{part} {name}: {g.shape}/{g.dtype}"
        tolerance.assert_close(f"{part} {name}", g, r, s, q.dtype)
    return ours


class PoisonedTorch:
    """``torch`` as a kernel module sees it (monkeypatch it in), except that fresh buffers come filled with
    NaN instead of garbage: an element a kernel should write but does not shows up in the result."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty_like(t, **kwargs):
        return torch.full_like(t, float("nan"), **kwargs)

    @staticmethod
    def empty(*shape, **kwargs):
        return torch.full(*shape, float("nan"), **kwargs)
