"""FP8 attention (kernels/attention/fp8.py): quantisation, incoherent processing, the kernel, its errors.

How the kernel is judged. FP8 inputs lose far more than the kernel's own arithmetic does, so the tolerance
policy's "same-precision PyTorch" is ``fp8.emulate``: the same quantised inputs, dequantised, through the
kernel's algorithm in float64 torch (online softmax over the same K/V tiles, P · 256 rounded to e4m3 by
torch's cast). Three checks per case:

1. kernel vs emulation: max-abs ≤ r·max|emulation| plus 2⁻⁶·max|V| for the rare element of P that fp32
   and float64 round to neighbouring e4m3 values (one e4m3 step is 2⁻³ relative; a step in an element of
   weight ≤ 1/8 moves the output by ≤ 2⁻⁶·max|V|); and RMS ≤ 2r·RMS(emulation), where flips weigh little
   and a missing rounding of P or a scale off by 0.4 % does not pass. r is the output's rounding with a
   margin: 2⁻⁹ for float16 (half an ulp is 2⁻¹¹ relative), 2⁻⁶ for bfloat16 (the interpreter's bfloat16
   store does not round to nearest: up to 2⁻⁷ relative). Measured in the interpreter: RMS ratio 2·10⁻⁴
   (float16), 3·10⁻³ (bfloat16);
2. kernel vs float64 attention of the original inputs: max-abs ≤ 2 × the emulation's + the output dtype's
   floor (kernels/tolerance.py with the emulation as the same-precision computation);
3. kernel vs float64 attention of the dequantised inputs (what remains is P's rounding): max-abs ≤
   2⁻⁴·max|V| + output rounding, the worst case of a relative error ≤ 2⁻⁴ in every weight of a convex
   combination (ℓ is the sum of the unrounded weights).
"""

from __future__ import annotations

import ast
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from attention_checks import random_tensors

from kernels import tolerance
from kernels.attention import fa3, fp8, fp8_quant, reference

F16, BF16 = torch.float16, torch.bfloat16
ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------------
# Quantisation
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "granularity, expected", [("tensor", ()), ("head", (2, 3)), ("block", (2, 3, 7))], ids=["tensor", "head", "block"]
)
def test_quantize_scale_shapes(granularity, expected):
    (x,) = random_tensors([(2, 3, 97, 40)], torch.float32, "cpu")
    x8, scale = fp8.quantize(x, granularity, block=16)
    assert x8.dtype == torch.float8_e4m3fn and x8.shape == x.shape
    assert scale.dtype == torch.float32 and tuple(scale.shape) == expected


@pytest.mark.parametrize("granularity", fp8.GRANULARITIES)
@pytest.mark.parametrize("dtype", [torch.float32, F16, BF16], ids=["f32", "f16", "bf16"])
def test_quantize_round_trip_error_bound(granularity, dtype):
    """|x − deq(x)| ≤ half an e4m3 step: 2⁻⁴|x| in the normal range, 2⁻¹⁰·scale in the subnormal one."""
    (x,) = random_tensors([(2, 2, 130, 64)], dtype, "cpu", seed=3)
    x8, scale = fp8.quantize(x, granularity, block=32)
    deq = fp8.dequantize(x8, scale, block=32)
    per_row = fp8._expanded_scale(scale, x.shape, 32)
    bound = (2.0**-4 * x.float().abs() + 2.0**-10 * per_row) * (1 + 1e-5)
    err = (deq - x.float()).abs()
    assert bool((err <= bound).all()), f"worst excess {(err - bound).max().item():.3e}"
    # the group's largest magnitude lands exactly on ±448
    assert x8.float().abs().max().item() == fp8.E4M3_MAX


def test_quantize_zero_blocks_and_zero_tensor():
    (x,) = random_tensors([(1, 2, 70, 16)], torch.float32, "cpu")
    x[:, :, 16:32] = 0.0  # one whole block of 16 rows
    x[:, 1] = 0.0  # one whole head
    for granularity in fp8.GRANULARITIES:
        x8, scale = fp8.quantize(x, granularity, block=16)
        assert bool(torch.isfinite(scale).all()) and bool((scale > 0).all())
        assert not x8.float().isnan().any()
        assert bool((fp8.dequantize(x8, scale, 16)[:, :, 16:32] == 0).all())
    _, scale = fp8.quantize(x, "block", block=16)
    assert scale[0, 0, 1].item() == 1.0 and bool((scale[0, 1] == 1.0).all())
    x8, scale = fp8.quantize(torch.zeros(1, 1, 5, 8), "tensor")
    assert scale.item() == 1.0 and not x8.float().any()


def test_quantize_saturates():
    """No value can land past 448 (torch's cast would give NaN there), whatever the division's rounding."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, 4, 64, 64, generator=gen) * torch.logspace(-3, 3, 64)[None, None, :, None]
    for granularity in fp8.GRANULARITIES:
        x8, _ = fp8.quantize(x, granularity, block=8)
        assert bool(torch.isfinite(x8.float()).all()) and x8.float().abs().max().item() <= fp8.E4M3_MAX


def test_per_block_beats_per_tensor_on_outliers():
    """One block of large values: per-tensor scaling pushes every other block toward e4m3's subnormals."""
    (x,) = random_tensors([(1, 2, 128, 64)], torch.float32, "cpu", seed=7)
    x[:, :, 32:48] *= 1e5
    errs = {}
    for granularity in ("tensor", "block"):
        x8, scale = fp8.quantize(x, granularity, block=16)
        diff = fp8.dequantize(x8, scale, 16) - x
        errs[granularity] = diff[:, :, :32].pow(2).mean().sqrt().item()  # the ordinary rows
    assert errs["block"] * 4 < errs["tensor"], errs


def test_quantize_rejects_bad_input():
    x = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match="granularity must be one of"):
        fp8.quantize(x, "row")
    with pytest.raises(ValueError, match="positive block size"):
        fp8.quantize(x, "block")
    with pytest.raises(ValueError, match="batch, heads, seq, head_dim"):
        fp8.quantize(x[0], "tensor")
    with pytest.raises(TypeError, match="to quantise"):
        fp8.quantize(x.to(torch.float8_e4m3fn), "tensor")
    bad = x.clone()
    bad[0, 0, 1, 2] = float("inf")
    with pytest.raises(ValueError, match="NaN or Inf"):
        fp8.quantize(bad, "head", check_finite=True)
    with pytest.raises(ValueError, match="NaN or Inf"):
        fp8.quantize(bad, "none", check_finite=True)
    with pytest.raises(ValueError, match="block size"):
        fp8.dequantize(x.to(torch.float8_e4m3fn), torch.ones(1, 1, 1))


# ---------------------------------------------------------------------------------------------------
# Incoherent processing
# ---------------------------------------------------------------------------------------------------


def test_hadamard():
    h = fp8.hadamard(16)
    assert bool((h.abs() == 1).all())
    assert torch.equal(h @ h.T, 16 * torch.eye(16))
    with pytest.raises(ValueError, match="powers of two"):
        fp8.hadamard(12)


@pytest.mark.parametrize("d", [64, 128, 40], ids=["d64-hadamard", "d128-hadamard", "d40-qr"])
def test_rotation_is_orthogonal_and_keeps_scores(d):
    m = fp8.rotation(d, seed=1, dtype=torch.float64)
    assert torch.allclose(m @ m.T, torch.eye(d, dtype=torch.float64), atol=1e-12)
    assert torch.equal(m, fp8.rotation(d, seed=1, dtype=torch.float64))  # reproducible
    assert not torch.equal(m, fp8.rotation(d, seed=2, dtype=torch.float64))
    q, k = random_tensors([(2, 3, 33, d), (2, 3, 47, d)], torch.float64, "cpu")
    scores = q @ k.transpose(-1, -2)
    assert torch.allclose((q @ m) @ (k @ m).transpose(-1, -2), scores, atol=1e-11)
    m32 = fp8.rotation(d, seed=1)  # float32 rounding only: relative to the scores' size
    rotated = (q.float() @ m32) @ (k.float() @ m32).transpose(-1, -2)
    assert (rotated.double() - scores).abs().max().item() < 1e-5 * scores.abs().max().item() * d**0.5


def test_rotation_spreads_outliers():
    q, k = random_tensors([(1, 2, 97, 64), (1, 2, 97, 64)], torch.float32, "cpu")
    q[..., 5] *= 50.0  # an outlier channel
    k[:, :, 10, 3] = 500.0  # an outlier entry
    m = fp8.rotation(64)
    for x in (q, k):
        before = (x.abs().max() / x.pow(2).mean().sqrt()).item()
        after = ((x @ m).abs().max() / (x @ m).pow(2).mean().sqrt()).item()
        assert after < before / 3, (before, after)


# ---------------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------------


@triton.jit
def _round_kernel(X, Y, N: tl.constexpr, EMULATE: tl.constexpr):
    x = tl.load(X + tl.arange(0, N))
    if EMULATE:
        y = fp8_quant.round_to_e4m3(x)
    else:
        y = x.to(tl.float8e4nv).to(tl.float32)
    tl.store(Y + tl.arange(0, N), y)


def _rounding_inputs() -> torch.Tensor:
    """Every non-negative finite e4m3 value, every midpoint between neighbours, and random values."""
    values = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # 0 … 448
    mids = (values[1:] + values[:-1]) / 2
    rand = torch.rand(1024, generator=torch.Generator().manual_seed(0)) * 256
    small = torch.rand(256, generator=torch.Generator().manual_seed(1)) * 2**-5
    x = torch.cat([values, mids, rand, small])
    return torch.nn.functional.pad(x, (0, 2048 - x.numel()))


def test_emulated_p_cast_matches_torch(device):
    """The interpreter path's rounding of P·256 to e4m3 (ties to even) equals torch's cast everywhere."""
    x = _rounding_inputs()
    y = torch.empty_like(x)
    xd, yd = x.to(device), y.to(device)
    _round_kernel[(1,)](xd, yd, x.numel(), True)
    assert torch.equal(yd.cpu(), x.to(torch.float8_e4m3fn).float())


@pytest.mark.gpu
def test_hardware_p_cast_matches_torch():
    if torch.cuda.get_device_capability() < fp8.MIN_CAPABILITY:
        pytest.skip("no FP8 conversion instructions below compute capability 8.9")
    x = _rounding_inputs().cuda()
    y = torch.empty_like(x)
    _round_kernel[(1,)](x, y, x.numel(), False)
    assert torch.equal(y.cpu(), x.cpu().to(torch.float8_e4m3fn).float())


KERNELS = ("triton", "fa3")


def _kernel_on(kernel: str, device: str, head_dim: int) -> None:
    """Skip unless ``kernel`` runs here: FA-3 needs a Hopper GPU (it does not run in the interpreter)."""
    if device == "cuda" and torch.cuda.get_device_capability() < fp8.MIN_CAPABILITY:
        pytest.skip("needs FP8 tensor cores (compute capability ≥ 8.9)")
    if kernel == "fa3":
        if device != "cuda" or torch.cuda.get_device_capability()[0] != 9:
            pytest.skip("the FA-3 kernel runs on Hopper GPUs only (its Gluon code has no interpreter path)")
        if head_dim not in fa3.HEAD_DIMS:
            pytest.skip(f"the FA-3 kernel has no head_dim {head_dim}")


def _tiles(kernel: str, head_dim: int) -> tuple[int, int, int]:
    """(Q rows, K/V rows) per block scale and the keys per online-softmax step of ``kernel``."""
    q_block, kv_block = fp8.blocks(kernel, head_dim)
    config = fa3.config_in_effect(head_dim, fp8=True) if kernel == "fa3" else fp8.config_in_effect(head_dim)
    block_n = config.block_n
    return q_block, kv_block, block_n


def _row_sums(kernel: str, head_dim: int, schedule: str | None = None) -> str:
    """What ``kernel``'s ℓ sums (``fp8.emulate``'s ``row_sums``; the FA-3 kernel's by head dim and schedule,
    None its FP8 default)."""
    return fa3.fp8_row_sums(head_dim, schedule) if kernel == "fa3" else "p"


def _check_against_emulation(name, out, quantised, tiles, causal, p_scale=fp8.P_SCALE, kernel="triton", schedule=None):
    """Checks 1 and 3 of the module docstring; returns the emulation (float64, on the CPU). ``tiles``:
    (q_block, kv_block, block_n) of the scales and the kernel's online softmax (``_tiles``); ``kernel``: which
    ran, ``schedule`` the FA-3 kernel's (which may take ℓ from the rounded P, ``_row_sums``)."""
    q8, k8, v8, qs, ks, vs = (t.cpu() for t in quantised)
    q_block, kv_block, block_n = tiles
    emu = fp8.emulate(
        q8,
        k8,
        v8,
        qs,
        ks,
        vs,
        causal,
        q_block=q_block,
        kv_block=kv_block,
        block_n=block_n,
        p_scale=p_scale,
        row_sums=_row_sums(kernel, q8.shape[-1], schedule),
    )
    out_rel = 2.0**-9 if out.dtype == F16 else 2.0**-6
    out = out.cpu().double()
    v_max = fp8.dequantize(v8, vs, kv_block).abs().max().item()
    err, rms = tolerance.error_stats(out, emu)
    bound = out_rel * emu.abs().max().item() + 2.0**-6 * v_max
    assert err <= bound, f"{name}: kernel vs emulation max-abs {err:.3e} > {bound:.3e}"
    rms_bound = 2 * out_rel * emu.pow(2).mean().sqrt().item()
    assert rms <= rms_bound, f"{name}: kernel vs emulation RMS {rms:.3e} > {rms_bound:.3e}"
    deq = [fp8.dequantize(t, s, b).double() for t, s, b in ((q8, qs, q_block), (k8, ks, kv_block), (v8, vs, kv_block))]
    exact = reference.reference_attention(*deq, causal)
    err, _ = tolerance.error_stats(out, exact)
    bound = 2.0**-4 * v_max + out_rel * exact.abs().max().item()
    assert err <= bound, f"{name}: kernel vs float64 on dequantised inputs max-abs {err:.3e} > {bound:.3e}"
    return emu


# (batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, causal, granularity, dtype)
CASES = [
    pytest.param((1, 2, 2, 1, 1, 64, False, "block", F16), id="n1-d64-block-f16"),
    pytest.param((1, 2, 1, 97, 97, 64, True, "block", F16), id="gqa-n97-d64-causal-block-f16"),
    pytest.param((2, 2, 2, 130, 130, 128, False, "tensor", F16), id="n130-d128-tensor-f16"),
    pytest.param((1, 4, 2, 97, 130, 128, True, "head", BF16), id="gqa-nq97-nk130-d128-causal-head-bf16"),
    pytest.param((1, 2, 2, 130, 97, 64, True, "block", F16), id="nq130-nk97-d64-causal-block-f16"),
    pytest.param((1, 3, 1, 33, 70, 40, False, "block", F16), id="mqa-n33-70-d40-block-f16"),
    pytest.param(
        (2, 8, 2, 1024, 1024, 128, True, "block", BF16), id="gqa-n1024-d128-causal-block-bf16", marks=pytest.mark.gpu
    ),
    pytest.param((1, 8, 8, 2048, 2048, 64, False, "tensor", F16), id="n2048-d64-tensor-f16", marks=pytest.mark.gpu),
    pytest.param(
        (1, 4, 4, 1000, 1537, 256, True, "head", BF16), id="n1000-1537-d256-causal-head-bf16", marks=pytest.mark.gpu
    ),
]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("case", CASES)
def test_attention_matches_emulation_and_float64(case, kernel, device):
    b, h, hk, nq, nk, d, causal, granularity, dtype = case
    _kernel_on(kernel, device, d)
    q, k, v = random_tensors([(b, h, nq, d), (b, hk, nk, d), (b, hk, nk, d)], dtype, device, seed=nq + d)
    name = f"{kernel} {case[:8]} {'f16' if dtype == F16 else 'bf16'}"
    out = fp8.attention(q, k, v, causal=causal, granularity=granularity, kernel=kernel)
    assert out.shape == q.shape and out.dtype == dtype
    tiles = _tiles(kernel, d)
    quantised = fp8.quantize_qkv(q, k, v, granularity, blocks=tiles[:2])
    emu = _check_against_emulation(name, out, quantised, tiles, causal, kernel=kernel)
    # check 2: the tolerance policy, with the emulation as the same-precision computation
    ref = reference.reference_attention(q.cpu(), k.cpu(), v.cpu(), causal)
    tolerance.assert_close(f"out {name}", out.cpu(), ref, emu, dtype)
    if causal and nq > nk:  # the first nq − nk rows see no key
        assert not out[:, :, : nq - nk].any()


@pytest.mark.parametrize("kernel", KERNELS)
def test_rotated_attention(kernel, device):
    """rotate=True: the kernel on rotated, quantised Q and K, judged like any case."""
    _kernel_on(kernel, device, 64)
    q, k, v = random_tensors([(1, 2, 97, 64), (1, 2, 97, 64), (1, 2, 97, 64)], F16, device, seed=11)
    q[..., 3] *= 20.0
    out = fp8.attention(q, k, v, causal=True, granularity="tensor", rotate=True, kernel=kernel)
    tiles = _tiles(kernel, 64)
    quantised = fp8.quantize_qkv(q, k, v, "tensor", blocks=tiles[:2], rotate=True)
    emu = _check_against_emulation(f"{kernel} rotated f16", out, quantised, tiles, True, kernel=kernel)
    ref = reference.reference_attention(q.cpu(), k.cpu(), v.cpu(), True)
    tolerance.assert_close("out rotated f16", out.cpu(), ref, emu, F16)


@pytest.mark.parametrize("kernel", KERNELS)
def test_mixed_granularities_and_coarser_blocks(kernel, device):
    """forward_quantized directly, V row-major: Q per block of 2 tiles' rows, K per head, V per block of 2 tiles."""
    _kernel_on(kernel, device, 64)
    q_tile, kv_tile, block_n = _tiles(kernel, 64)
    qb, kvb = 2 * q_tile, 2 * kv_tile
    n = 2 * kvb + 7
    q, k, v = random_tensors([(2, 4, n - 33, 64), (2, 2, n, 64), (2, 2, n, 64)], torch.float32, device, seed=2)
    v[:, :, 40:50] *= 30.0  # V blocks of very different sizes: the per-tile V scale matters
    (q8, qs), (k8, ks), (v8, vs) = fp8.quantize(q, "block", qb), fp8.quantize(k, "head"), fp8.quantize(v, "block", kvb)
    out = fp8.forward_quantized(
        q8, k8, v8, qs, ks, vs, causal=True, q_block=qb, kv_block=kvb, out_dtype=F16, kernel=kernel
    )
    quantised = (q8, k8, v8, qs, ks, vs)
    _check_against_emulation(f"{kernel} mixed f16", out, quantised, (qb, kvb, block_n), True, kernel=kernel)
    # and per-tensor K scales given as a 0-d tensor, V per head
    (k8, ks), (v8, vs) = fp8.quantize(k, "tensor"), fp8.quantize(v, "head")
    out = fp8.forward_quantized(q8, k8, v8, qs, ks, vs, q_block=qb, out_dtype=F16, kernel=kernel)
    _check_against_emulation(
        f"{kernel} mixed2 f16", out, (q8, k8, v8, qs, ks, vs), (qb, kvb, block_n), False, kernel=kernel
    )


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("p_scale", [1.0, 16.0], ids=["p1", "p16"])
def test_p_scale_is_a_choice_and_matches_emulation(p_scale, kernel, device):
    """P's scale before the e4m3 cast (1: no scaling, P's small entries land in e4m3's subnormals)."""
    _kernel_on(kernel, device, 64)
    q_block, kv_block, block_n = _tiles(kernel, 64)
    q, k, v = random_tensors([(1, 2, 97, 64), (1, 2, 130, 64), (1, 2, 130, 64)], F16, device, seed=5)
    q = q * 3  # sharper softmax rows: more of P is small
    quantised = fp8.quantize_qkv(q, k, v, "block", blocks=(q_block, kv_block))
    out = fp8.forward_quantized(*quantised, causal=True, out_dtype=F16, p_scale=p_scale, kernel=kernel)
    q8, k8, v8, qs, ks, vs = (t.cpu() for t in quantised)
    sums = _row_sums(kernel, 64)
    emu = fp8.emulate(
        q8,
        k8,
        v8,
        qs,
        ks,
        vs,
        True,
        q_block=q_block,
        kv_block=kv_block,
        block_n=block_n,
        p_scale=p_scale,
        row_sums=sums,
    )
    emu256 = fp8.emulate(
        q8, k8, v8, qs, ks, vs, True, q_block=q_block, kv_block=kv_block, block_n=block_n, row_sums=sums
    )
    err, rms = tolerance.error_stats(out.cpu(), emu)
    _, rms256 = tolerance.error_stats(out.cpu(), emu256)
    v_max = fp8.dequantize(v8, vs, kv_block).abs().max().item()  # an element of P rounded one e4m3 step off
    bound = 2.0**-9 * emu.abs().max().item() + 2.0**-6 * v_max
    assert err <= bound, f"p_scale={p_scale}: {err:.3e} from its emulation"
    # in RMS: on a GPU one element of P rounded a step off (exp2 is approximate) can dominate the max-abs error
    assert rms < rms256, "the kernel's result must follow its P scale (it matched the default's emulation better)"


@pytest.mark.parametrize("kernel", KERNELS)
def test_v_layouts_agree(kernel, device):
    """V row-major, sequence-contiguous (what quantize_qkv makes) or a strided view: the same numbers."""
    _kernel_on(kernel, device, 64)
    q, k, v = random_tensors([(1, 2, 70, 64), (1, 2, 97, 64), (1, 2, 97, 64)], F16, device, seed=6)
    q8, k8, v8t, qs, ks, vs = fp8.quantize_qkv(q, k, v, "block", blocks=fp8.blocks(kernel, 64))
    assert v8t.stride(-2) == 1, "quantize_qkv stores V sequence-contiguous"
    a = fp8.forward_quantized(q8, k8, v8t, qs, ks, vs, out_dtype=F16, kernel=kernel)
    b = fp8.forward_quantized(q8, k8, v8t.contiguous(), qs, ks, vs, out_dtype=F16, kernel=kernel)
    wide = torch.zeros(1, 2, 64, 200, device=device).to(torch.float8_e4m3fn)  # keys 200 apart, an odd view
    wide[..., 3:100].copy_(v8t.transpose(-1, -2))
    c = fp8.forward_quantized(q8, k8, wide[..., 3:100].transpose(-1, -2), qs, ks, vs, out_dtype=F16, kernel=kernel)
    assert torch.equal(a, b) and torch.equal(a, c)
    # the FA-3 kernel's own layout, from the fused quantiser: the same numbers; another kernel refuses it
    _, _, values, _, _, vs2 = fp8.quantize_qkv(q, k, v, "block", blocks=fp8.blocks(kernel, 64), fa3_layout=True)
    assert torch.equal(values.rows().view(torch.uint8), v8t.contiguous().view(torch.uint8))
    if kernel == "fa3":
        assert torch.equal(a, fp8.forward_quantized(q8, k8, values, qs, ks, vs2, out_dtype=F16, kernel=kernel))
    else:
        with pytest.raises(ValueError, match="v8 is fa3.FP8Values"):
            fp8.forward_quantized(q8, k8, values, qs, ks, vs2, out_dtype=F16, kernel=kernel)


def test_fa3_values_must_match_k(device):
    """V in the FA-3 kernel's layout is checked as the V it stands for: its keys must match K's."""
    q, k, v = random_tensors([(1, 2, 40, 64), (1, 2, 70, 64), (1, 2, 70, 64)], F16, device, seed=8)
    q8, k8, values, qs, ks, vs = fp8.quantize_qkv(q, k, v, "tensor", blocks=(64, 128), fa3_layout=True)
    assert isinstance(values, fa3.FP8Values) and values.seqlen == 70 and values.data.shape[-1] == 96
    short = fa3.FP8Values(values.data, 60)
    with pytest.raises(ValueError, match="k8 and v8 must have the same shape"):
        fp8.forward_quantized(q8, k8, short, qs, ks, vs, kernel="fa3")


FA3_SCHEDULE_CASES = [(128, s) for s in ("fa3", "no-warp-specialize", "no-pingpong", "no-overlap", "no-tma")] + [
    (d, s) for d in (64, 256) for s in ("fa3", "no-tma")
]


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim, schedule", FA3_SCHEDULE_CASES, ids=[f"d{d}-{s}" for d, s in FA3_SCHEDULE_CASES])
def test_fa3_schedules_agree_with_emulation(head_dim, schedule):
    """Every FA-3 schedule on FP8 inputs, GQA, causal, lengths off the tiles (the per-thread copies read V's
    keys 16 at a time: 1537 keys need the zero padding), with and without the mask: judged like any case."""
    _kernel_on("fa3", "cuda", head_dim)
    q, k, v = random_tensors(
        [(2, 4, 1000, head_dim), (2, 2, 1537, head_dim), (2, 2, 1537, head_dim)], BF16, "cuda", seed=head_dim
    )
    tiles = _tiles("fa3", head_dim)
    quantised = fp8.quantize_qkv(q, k, v, "block", blocks=tiles[:2])
    out = fp8.forward_quantized(*quantised, causal=True, kernel="fa3", schedule=schedule)
    _check_against_emulation(
        f"fa3 {schedule} d{head_dim}", out, quantised, tiles, True, kernel="fa3", schedule=schedule
    )
    full = fp8.forward_quantized(*quantised, causal=False, kernel="fa3", schedule=schedule)
    _check_against_emulation(
        f"fa3 {schedule} d{head_dim} full", full, quantised, tiles, False, kernel="fa3", schedule=schedule
    )
    # V quantised straight into the kernel's layout (1537 keys: padded to 1568 with zeros): the same output
    fused = fp8.quantize_qkv(q, k, v, "block", blocks=tiles[:2], fa3_layout=True)
    assert torch.equal(out, fp8.forward_quantized(*fused, causal=True, kernel="fa3", schedule=schedule))


# (head_dim, schedule) with lengths of 1 (None: FP8's default schedule); the first four varied from run to run
# before the launcher stopped Triton specialising those lengths (``fa3_kernels._fa3_fwd_kernel_any_length``)
LENGTH_ONE_CASES = [(64, None), (128, "fa3"), (64, "no-tma"), (128, "no-tma"), (128, None), (256, None)]
LENGTH_ONE_IDS = [f"d{d}-{s or 'fp8-default'}" for d, s in LENGTH_ONE_CASES]


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim, schedule", LENGTH_ONE_CASES, ids=LENGTH_ONE_IDS)
def test_fa3_length_one_is_repeatable(head_dim, schedule):
    """One query and one key, one query against 300 keys, 97 queries against one key: ten runs give the same
    bits, judged against the emulation. (With a length of 1 folded into the code, ptxas packed P from a
    register nothing wrote: outputs changed from run to run, NaN at times.)"""
    _kernel_on("fa3", "cuda", head_dim)
    tiles = _tiles("fa3", head_dim)
    for nq, nk, causal in ((1, 1, False), (1, 1, True), (1, 300, False), (97, 1, False)):
        q, k, v = random_tensors(
            [(1, 2, nq, head_dim), (1, 2, nk, head_dim), (1, 2, nk, head_dim)], F16, "cuda", seed=nq + nk
        )
        name = f"fa3 {schedule or 'fp8-default'} d{head_dim} nq{nq} nk{nk}{' causal' if causal else ''}"
        fused = fp8.quantize_qkv(q, k, v, "block", blocks=tiles[:2], fa3_layout=True)
        runs = [fp8.forward_quantized(*fused, causal=causal, kernel="fa3", schedule=schedule) for _ in range(10)]
        differ = sum(not torch.equal(r, runs[0]) for r in runs)
        assert not differ, f"{name}: {differ} of 10 runs differ from the first"
        # the emulation on the very values the kernel read, V back in key order
        quantised = (*fused[:2], fused[2].rows(), *fused[3:])
        _check_against_emulation(name, runs[0], quantised, tiles, causal, kernel="fa3", schedule=schedule)


@pytest.mark.gpu
def test_fa3_runs_fp8s_default_schedule_unless_pinned():
    """Without ``schedule`` the FA-3 kernel runs FP8's default (``fa3.FP8_SCHEDULE``); ``"fa3"`` pins FA-3's
    full schedule, ping-pong included."""
    _kernel_on("fa3", "cuda", 128)
    q, k, v = random_tensors([(1, 2, 300, 128)] * 3, BF16, "cuda", seed=3)
    quantised = fp8.quantize_qkv(q, k, v, "block", blocks=_tiles("fa3", 128)[:2])
    fp8.forward_quantized(*quantised, kernel="fa3")
    assert fa3.last_config()[1] == fa3.schedule_of(fa3.FP8_SCHEDULE) != fa3.SCHEDULES["fa3"]
    fp8.attention(q, k, v, kernel="fa3", schedule="fa3")
    assert fa3.last_config()[1] == fa3.SCHEDULES["fa3"]


def test_emulation_takes_the_row_sums_either_way(device):
    """``row_sums``: ℓ from the unrounded P (the Triton kernel) or from the rounded P that multiplies V (the
    FA-3 kernel): two references that differ by P's rounding alone, both near float64; a third is refused."""
    q, k, v = random_tensors([(1, 2, 70, 64), (1, 2, 90, 64), (1, 2, 90, 64)], torch.float32, device, seed=3)
    quantised = fp8.quantize_qkv(q, k, v, "block", blocks=(16, 16))
    q8, k8, v8, qs, ks, vs = quantised
    common = dict(q_block=16, kv_block=16, block_n=16)
    p_sums = fp8.emulate(q8, k8, v8, qs, ks, vs, True, **common)
    p8_sums = fp8.emulate(q8, k8, v8, qs, ks, vs, True, row_sums="p8", **common)
    deq = [fp8.dequantize(t, sc, 16).double() for t, sc in ((q8, qs), (k8, ks), (v8, vs))]
    exact = reference.reference_attention(*deq, True)
    v_max = deq[2].abs().max().item()
    assert 0 < (p_sums - p8_sums).abs().max().item() <= 2.0**-4 * v_max
    for emu in (p_sums, p8_sums):
        assert (emu - exact).abs().max().item() <= 2.0**-4 * v_max
    with pytest.raises(ValueError, match="row_sums must be 'p' or 'p8'"):
        fp8.emulate(q8, k8, v8, qs, ks, vs, True, row_sums="v", **common)


def test_unscaled_control_saturates():
    x = torch.tensor([[[[1000.0, -3.0, 2.0**-12, 0.5]]]])
    x8, scale = fp8.quantize(x, "none")
    assert scale.shape == () and scale.item() == 1.0
    assert x8.float().flatten().tolist() == [448.0, -3.0, 0.0, 0.5]  # saturated, exact, flushed below 2^-10, exact


@pytest.mark.parametrize("p_scale", [0, 3.0, 512.0, True, "8"], ids=["zero", "not-pow2", "too-big", "bool", "str"])
def test_rejects_bad_p_scale(p_scale, device):
    q8, k8, v8 = _fp8_inputs(device)
    one = torch.ones((), device=device)
    with pytest.raises(ValueError, match="p_scale"):
        fp8.forward_quantized(q8, k8, v8, one, one, one, p_scale=p_scale)


def test_attention_checks_before_it_quantises(device, monkeypatch):
    """``fp8.attention`` runs the kernel on its quantiser's outputs without ``forward_quantized``'s checks, so it
    refuses a bad ``p_scale`` and an FA-3 schedule for another kernel itself, naming them, before any work."""

    def no_quantising(*args, **kwargs):
        raise AssertionError("quantised before the arguments were checked")

    monkeypatch.setattr(fp8, "quantize_qkv", no_quantising)
    q = torch.randn(1, 2, 16, 64, device=device, dtype=torch.float16)
    with pytest.raises(ValueError, match="p_scale"):
        fp8.attention(q, q, q, p_scale=3.0)
    with pytest.raises(ValueError, match="schedule='no-tma' switches a technique of the FA-3 kernel"):
        fp8.attention(q, q, q, kernel="triton", schedule="no-tma")


def test_empty_and_keyless(device):
    q8 = torch.zeros(1, 2, 5, 64, device=device).to(torch.float8_e4m3fn)
    k8 = torch.zeros(1, 2, 0, 64, device=device).to(torch.float8_e4m3fn)
    one = torch.ones((), device=device)
    out = fp8.forward_quantized(q8, k8, k8, one, one, one)
    assert out.shape == (1, 2, 5, 64) and not out.any()
    out = fp8.forward_quantized(q8[:, :, :0], q8, q8, one, one, one)
    assert out.shape == (1, 2, 0, 64)


# ---------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------


def _fp8_inputs(device, n=17, d=32):
    x8 = torch.randn(1, 2, n, d, device=device).to(torch.float8_e4m3fn)
    return x8, x8.clone(), x8.clone()


def test_forward_quantized_rejects_wrong_dtypes(device):
    q8, k8, v8 = _fp8_inputs(device)
    one = torch.ones((), device=device)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        fp8.forward_quantized(q8.half(), k8, v8, one, one, one)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        fp8.forward_quantized(q8, k8.view(torch.float8_e5m2), v8, one, one, one)
    with pytest.raises(TypeError, match="q_scale must have dtype torch.float32"):
        fp8.forward_quantized(q8, k8, v8, one.double(), one, one)
    with pytest.raises(TypeError, match="k_scale must be a float32"):
        fp8.forward_quantized(q8, k8, v8, one, 1.0, one)
    with pytest.raises(TypeError, match="out_dtype"):
        fp8.forward_quantized(q8, k8, v8, one, one, one, out_dtype=torch.float32)


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf")], ids=["zero", "negative", "nan", "inf"])
def test_forward_quantized_rejects_bad_scale_values(value, device):
    q8, k8, v8 = _fp8_inputs(device)
    one = torch.ones((), device=device)
    bad = torch.ones(1, 2, device=device)
    bad[0, 1] = value
    with pytest.raises(ValueError, match="v_scale must be positive and finite"):
        fp8.forward_quantized(q8, k8, v8, one, one, bad, check_scale_values=True)
    if value == -1.0:  # unchecked (the default), the caller vouches for the scales: no read-back, no error
        fp8.forward_quantized(q8, k8, v8, one, one, bad)
    with pytest.raises(TypeError, match="check_scale_values must be True or False"):
        fp8.forward_quantized(q8, k8, v8, one, one, one, check_scale_values=None)


def test_forward_quantized_rejects_bad_scale_shapes_and_blocks(device):
    q8, k8, v8 = _fp8_inputs(device, n=97)
    one = torch.ones((), device=device)
    bm, bn = fp8.config_in_effect(32).block_m, fp8.config_in_effect(32).block_n
    with pytest.raises(ValueError, match="q_scale has shape"):
        fp8.forward_quantized(q8, k8, v8, torch.ones(2, device=device), one, one)
    with pytest.raises(ValueError, match="k_scale has shape"):
        fp8.forward_quantized(q8, k8, v8, one, torch.ones(1, 2, 3, device=device), one)  # 97 rows need 7 blocks
    with pytest.raises(ValueError, match=r"q_block=\d+ must be a multiple of the kernel's \d+ query rows per tile"):
        fp8.forward_quantized(
            q8, k8, v8, torch.ones(1, 2, triton.cdiv(97, bm + 1), device=device), one, one, q_block=bm + 1
        )
    with pytest.raises(ValueError, match=r"kv_block=\d+ must be a multiple of the kernel's \d+ keys per tile"):
        fp8.forward_quantized(
            q8, k8, v8, one, one, torch.ones(1, 2, triton.cdiv(97, bn // 2), device=device), kv_block=bn // 2
        )
    with pytest.raises(ValueError, match="must divide q8's 2"):
        k3 = torch.zeros(1, 3, 97, 32, device=device).to(torch.float8_e4m3fn)
        fp8.forward_quantized(q8, k3, k3, one, one, one)
    with pytest.raises(ValueError, match="head_dim 300"):
        x = torch.zeros(1, 1, 4, 300, device=device).to(torch.float8_e4m3fn)
        fp8.forward_quantized(x, x, x, one, one, one)


def test_attention_rejects_bad_inputs(device):
    q = torch.randn(1, 2, 17, 32, device=device)
    with pytest.raises(TypeError, match="float16 or bfloat16 inputs"):
        fp8.attention(q, q, q)
    with pytest.raises(TypeError, match="share a dtype"):
        fp8.attention(q.half(), q.half(), q.bfloat16())
    with pytest.raises(ValueError, match="granularity must be one of"):
        fp8.attention(q.half(), q.half(), q.half(), granularity="channel")
    k = torch.randn(1, 2, 17, 64, device=device, dtype=F16)  # another head dim: refused before any rotation
    with pytest.raises(ValueError, match="head_dim"):
        fp8.attention(q.half(), k, k, rotate=True)


def test_capability_check():
    for ok in ((8, 9), (9, 0), (10, 0), (12, 0)):
        fp8.require_fp8_tensor_cores(ok, "cuda:0")
    for old in ((8, 0), (8, 6), (7, 5)):
        with pytest.raises(TypeError, match="compute capability ≥ 8.9"):
            fp8.require_fp8_tensor_cores(old, "cuda:0")


@pytest.mark.gpu
def test_refuses_gpus_without_fp8():
    if torch.cuda.get_device_capability() >= fp8.MIN_CAPABILITY:
        pytest.skip("this GPU has FP8 tensor cores")
    q = torch.randn(1, 1, 16, 64, device="cuda", dtype=F16)
    with pytest.raises(TypeError, match="compute capability"):
        fp8.attention(q, q, q)


# ---------------------------------------------------------------------------------------------------
# Host synchronisation: none unless a check is asked for
# ---------------------------------------------------------------------------------------------------

# the ways a tensor's values reach the host; on a GPU each one waits for the work queued before it
_HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


def _record_host_reads(monkeypatch) -> list[str]:
    """Patch the host reads of ``torch.Tensor`` to record each one the kernels package itself makes (Triton's
    interpreter reads tensors to run a kernel on the CPU: its own files are not counted). Counts on the CPU
    what would synchronise on a GPU."""
    reads: list[str] = []
    package = str(ROOT / "kernels")

    def recording(name, original):
        def read(self, *args, **kwargs):
            caller = sys._getframe(1).f_code
            if caller.co_filename.startswith(package):
                reads.append(f"{name} in {Path(caller.co_filename).name}:{caller.co_name}")
            return original(self, *args, **kwargs)

        return read

    for name in _HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, recording(name, getattr(torch.Tensor, name)))
    return reads


def _fp16_qkv(device, n=40, d=64):
    return random_tensors([(1, 2, n, d)] * 3, F16, device, seed=3)


def test_attention_reads_nothing_back_unless_asked(device, monkeypatch):
    """``fp8.attention`` quantises and runs the kernel without reading a value back; ``check_finite=True``
    reads the quantiser's three device-side counts at once and refuses NaN or Inf, naming the tensor."""
    q, k, v = _fp16_qkv(device)
    reads = _record_host_reads(monkeypatch)
    out = fp8.attention(q, k, v, causal=True)
    assert reads == [] and torch.isfinite(out).all()
    fp8.attention(q, k, v, causal=True, check_finite=True)
    assert reads == ["tolist in fp8_quant.py:check_finite"], reads
    bad = k.clone()
    bad[0, 1, 7, 3] = float("nan")
    with pytest.raises(ValueError, match="cannot quantise k: it holds NaN or Inf"):
        fp8.attention(q, bad, v, check_finite=True)
    with pytest.raises(TypeError, match="check_finite must be True or False"):
        fp8.attention(q, k, v, check_finite="yes")


def test_two_step_path_reads_nothing_back_unless_asked(device, monkeypatch):
    """The documented two-step path, ``quantize_qkv`` then ``forward_quantized``, reads nothing back by default
    (it read each of the three scales back before): for the Triton kernel, which runs here, and up to the
    launch for the FA-3 kernel's layout, which needs a Hopper GPU. ``check_scale_values=True`` reads the
    three scales."""
    q, k, v = _fp16_qkv(device)
    reads = _record_host_reads(monkeypatch)
    qb, kvb = fp8.blocks("triton", 64)
    quantised = fp8.quantize_qkv(q, k, v, "block", blocks=(qb, kvb))
    out = fp8.forward_quantized(*quantised, causal=True, out_dtype=F16)
    assert reads == [] and torch.isfinite(out).all()
    fp8.forward_quantized(*quantised, causal=True, out_dtype=F16, check_scale_values=True)
    assert len(reads) == 3 and all(r.startswith("__bool__ in fp8.py:_check_scale") for r in reads), reads

    reads.clear()
    q8, k8, v8, qs, ks, vs = fp8.quantize_qkv(q, k, v, "block", blocks=fp8.blocks("fa3", 64), fa3_layout=True)
    assert isinstance(v8, fa3.FP8Values)
    if device == "cpu":  # every check runs, then the FA-3 kernel refuses to run off Hopper
        with pytest.raises(RuntimeError, match="Hopper"):
            fp8.forward_quantized(q8, k8, v8, qs, ks, vs, causal=True, kernel="fa3")
    assert reads == []


def test_quantize_and_dequantize_read_nothing_back_unless_asked(device, monkeypatch):
    """The torch quantiser reads nothing back by default: a group holding NaN or Inf gets a scale of +Inf, as
    in the fused quantiser; ``check_finite=True`` refuses it. ``dequantize`` checks shapes only."""
    (x,) = random_tensors([(1, 2, 40, 32)], torch.float32, device)
    x[0, 1, 20, 5] = float("inf")
    x[0, 0, 3, 1] = float("nan")
    reads = _record_host_reads(monkeypatch)
    x8, scale = fp8.quantize(x, "block", 16)
    fp8.dequantize(x8, scale, 16)
    assert reads == []
    assert torch.isinf(scale[0, 1, 1]) and torch.isinf(scale[0, 0, 0]) and torch.isfinite(scale[0, 0, 1])
    with pytest.raises(ValueError, match="NaN or Inf"):
        fp8.quantize(x, "block", 16, check_finite=True)
    assert reads == ["__bool__ in fp8.py:quantize"]


@pytest.mark.gpu
def test_fp8_entries_do_not_synchronise_on_a_gpu():
    """On a GPU, with torch's synchronisation check set to raise: the one-call path and the two-step path on
    the kernel this GPU runs (FA-3's layout on Hopper), after a first call has compiled them."""
    if torch.cuda.get_device_capability() < fp8.MIN_CAPABILITY:
        pytest.skip("needs FP8 tensor cores (compute capability ≥ 8.9)")
    q, k, v = random_tensors([(1, 4, 1000, 128)] * 3, BF16, "cuda", seed=5)
    kernel = fp8.kernel_for(q.device, 128)
    quantise = lambda: fp8.quantize_qkv(  # noqa: E731
        q, k, v, "block", blocks=fp8.blocks(kernel, 128), fa3_layout=kernel == "fa3"
    )
    fp8.attention(q, k, v, causal=True)
    fp8.forward_quantized(*quantise(), causal=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fp8.attention(q, k, v, causal=True)
        fp8.forward_quantized(*quantise(), causal=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")


# ---------------------------------------------------------------------------------------------------
# The GPU path, compiled without a GPU
# ---------------------------------------------------------------------------------------------------

_COMPILE_SCRIPT = textwrap.dedent(
    """
    import re, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from kernels.attention import fp8, fp8_kernels

    fn = fp8_kernels._fp8_fwd_kernel
    cfg = fp8.default_config(128)  # the shipped GPU tiles (TRITON_INTERPRET=0 here)
    consts = dict(HEAD_DIM=128, BLOCK_D=128, IS_CAUSAL=True, EVEN_N=False, EVEN_D=True, V_SCALE_PER_TILE=True,
                  EMULATE_P_CAST=False, P_SCALE=fp8.P_SCALE, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n)
    sig, cons = {}, {}
    for i, n in enumerate(fn.arg_names):
        if n in consts:
            sig[n], cons[(i,)] = "constexpr", consts[n]
        elif n in ("stride_qd", "stride_kd", "stride_vd", "stride_od"):  # contiguous rows: the runtime pins 1
            sig[n], cons[(i,)] = "constexpr", 1
        else:
            sig[n] = {"Q": "*fp8e4nv", "K": "*fp8e4nv", "V": "*fp8e4nv", "Out": "*bf16", "QS": "*fp32",
                      "KS": "*fp32", "VS": "*fp32", "sm_scale": "fp32"}.get(n, "i32")
    # what the runtime infers for 16-byte-aligned pointers and strides that are multiples of 16
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n].startswith("*") or (n.startswith("stride_") and sig[n] == "i32" and "s" not in n[7:-1])}
    kernel = triton.compile(triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=cons, attrs=attrs),
                            target=GPUTarget("cuda", int(sys.argv[1]), 32),
                            options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    ptx = kernel.asm["ptx"]
    print("p-cast", ptx.count("cvt.rn.satfinite.e4m3x2."))  # from f32 (sm_90) or f16x2 (sm_89)
    print(sorted(set(re.findall(r"(?:wgmma\\.mma_async\\.sync|mma\\.sync)\\.aligned\\.[\\w.]+", ptx))))
    """
)


@pytest.mark.parametrize(
    "capability, mma",
    [(90, "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"), (89, "mma.sync.aligned.m16n8k32.row.col.f32.e4m3")],
    ids=["sm90", "sm89"],
)
def test_gpu_path_compiles_to_fp8_mma(capability, mma):
    """The GPU path (EMULATE_P_CAST off) with the shipped tiles and P's scale builds, both products are FP8
    MMAs (no e4m3 → f16 widening), and P goes to e4m3 through the hardware's saturating conversion."""
    if "nvidia" not in triton.backends.backends:
        pytest.skip("this Triton has no NVIDIA backend to compile with")
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    run = subprocess.run(
        [sys.executable, "-c", _COMPILE_SCRIPT, str(capability)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    found = ast.literal_eval(lines[-1])
    assert found and all(".e4m3.e4m3" in m for m in found), found
    assert any(m.startswith(mma) for m in found), found
    assert int(lines[-2].split()[1]) > 0, run.stdout  # P cast to e4m3 by the hardware conversion


def test_p_reference_rows_by_hand():
    """One query row whose P = exp(S − max) is exactly (1, 2⁻¹², 2⁻⁸): e4m3 flushes 2⁻¹² unless P is scaled
    (2⁻¹² · 256 = 2⁻⁴ is exact), and with the scale every entry is exact, so the rounded attention is exact."""
    q = torch.ones(1, 1, 1, 1, dtype=torch.float64)
    k = torch.tensor([0.0, -12 * math.log(2), -8 * math.log(2)], dtype=torch.float64).reshape(1, 1, 3, 1)
    v = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64).reshape(1, 1, 3, 1)
    rows = torch.tensor([0])
    frac, mass = reference.p_underflow_rows(q, k, rows, sm_scale=1.0, p_scale=1.0)
    total = 1 + 2.0**-12 + 2.0**-8
    assert frac == pytest.approx(1 / 3) and mass == pytest.approx(2.0**-12 / total)
    assert reference.p_underflow_rows(q, k, rows, sm_scale=1.0, p_scale=256.0) == (0.0, 0.0)
    exact = reference.reference_attention(q, k, v, sm_scale=1.0, rows=rows)
    scaled = reference.p_rounded_attention_rows(q, k, v, rows, sm_scale=1.0, p_scale=256.0)
    assert scaled.item() == pytest.approx(exact.item(), abs=1e-12)
    flushed = reference.p_rounded_attention_rows(q, k, v, rows, sm_scale=1.0, p_scale=1.0)
    assert flushed.item() == pytest.approx((1 + 3 * 2.0**-8) / total, abs=1e-12)  # the 2⁻¹² term is lost
