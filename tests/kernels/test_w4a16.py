"""W4A16 / W8A16 (kernels/w4a16/): the formats, the quantisers, the fused kernel, its errors.

How the kernel is judged: against ``x @ Wdqᵀ`` in float64, where ``Wdq`` is the dequantised weight (what the
kernel should compute exactly but for rounding), with the tolerance policy's bound (kernels/tolerance.py):
at most 2× the error of the same product in PyTorch at the activations' precision (dequantise to x's
dtype, then matmul) plus the dtype's floor. Outputs are kept O(1) (weights ~ 0.05·N(0, 1) against
N(0, 1) activations of K ≤ 384) so the floor means what it says. The quantisation itself is judged
separately: round trips within half a step, and the layer's error against the unquantised weight.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import triton

from kernels import tolerance
from kernels import w4a16 as wq
from kernels.w4a16 import plans, reference

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
ROOT = Path(__file__).resolve().parents[2]


def _weight(n, k, dtype=F32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (0.05 * torch.randn(n, k, generator=g)).to(dtype)


def _x(shape, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


# ---------------------------------------------------------------------------------------------------
# Formats and quantisers
# ---------------------------------------------------------------------------------------------------


def test_packing_layout():
    """Blocks of 128 inputs, 16 words per row: nibble i (bits 4i … 4i+3) of word j is input k0 + 16i + j;
    the last, shorter block of t inputs (K = 224: t = 96, 12 words): nibble i of word j is k0 + i·t/8 + j."""
    n, k = 3, 224
    codes = torch.randint(0, 16, (n, k), generator=torch.Generator().manual_seed(0))
    # a weight whose asymmetric quantisation is exactly these codes: zero point 0 (min is 0), scale 1
    w = codes.float()
    w[:, 0::32] = 15.0  # every group of 32 spans exactly 0 … 15
    w[:, 1::32] = 0.0
    qw = wq.quantize(w, group_size=32)
    assert qw.packed.dtype == torch.int32 and qw.packed.shape == (n, k // 8) and qw.pack_block == 128
    assert bool((qw.scales == 1).all()) and bool((qw.zeros == 0).all())
    expected = w.to(torch.int64)
    for c in range(k // 8):
        word = qw.packed[:, c].to(torch.int64) & 0xFFFFFFFF
        for i in range(8):
            inp = 16 * i + c if c < 16 else 128 + 12 * i + (c - 16)
            assert torch.equal((word >> (4 * i)) & 0xF, expected[:, inp])
    assert torch.equal(wq.unpack_codes(qw.packed).to(torch.int64), expected)


@pytest.mark.parametrize("k", [32, 64, 96, 128, 160, 256, 352, 4096])
def test_pack_unpack_round_trip(k):
    """pack_codes/unpack_codes are inverse for every K the format allows (K a multiple of 32)."""
    codes = torch.randint(0, 16, (5, k), generator=torch.Generator().manual_seed(k), dtype=torch.int32)
    packed = wq.pack_codes(codes)
    assert packed.shape == (5, k // 8) and packed.dtype == torch.int32
    assert torch.equal(wq.unpack_codes(packed), codes)


@pytest.mark.parametrize("dtype", [F16, BF16, F32], ids=["f16", "bf16", "f32"])
def test_scale_zero_words(dtype):
    """16-bit scales live in one int32 per (group, output): the scale's bits, then 2^e + z in its dtype;
    scales and zeros are views of it (N-contiguous), and nbytes counts the words."""
    qw = wq.quantize(_weight(40, 256, dtype), 64)
    if dtype == F32:
        assert qw.scale_zero is None and qw.scales.stride() == (1, 40)
        return
    sz = qw.scale_zero
    assert sz.shape == (4, 40) and sz.dtype == torch.int32 and qw.scales.stride()[0] == 2
    assert torch.equal(qw.scales.t().contiguous().view(torch.int16), (sz & 0xFFFF).to(torch.int16))
    magic = 0x6400 if dtype == F16 else 0x4300
    assert torch.equal((sz >> 16) & 0xFFFF, qw.zeros.t().to(torch.int32) | magic)
    assert qw.nbytes() == 40 * 256 // 2 + 4 * 40 * 4


@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
@pytest.mark.parametrize("group", wq.GROUP_SIZES)
@pytest.mark.parametrize("dtype", [F16, BF16, F32], ids=["f16", "bf16", "f32"])
def test_quantize_round_trip(dtype, group, symmetric):
    """Shapes and dtypes of the format; every element within half a step (+ the scale's own rounding)."""
    w = _weight(40, 384, dtype)
    qw = wq.quantize(w, group, symmetric)
    assert qw.shape == (40, 384) and qw.dtype == dtype and qw.group_size == group and qw.symmetric == symmetric
    assert qw.scales.shape == (40, 384 // group)
    assert qw.scales.dtype == dtype  # the weight's own 16-bit dtype, or fp32
    if symmetric:
        assert qw.zeros is None
        codes = wq.unpack_codes(qw.packed)
        assert int(codes.min()) >= 1 and int(codes.max()) <= 15  # ±7 around 8
    else:
        assert qw.zeros.dtype == torch.uint8 and qw.zeros.shape == qw.scales.shape
        assert int(qw.zeros.max()) <= 15
    deq = wq.dequantize(qw, torch.float64)
    step = qw.scales.double().repeat_interleave(group, dim=1)
    err = (deq - w.double()).abs()
    assert bool((err <= 0.5 * step * (1 + 1e-3) + 1e-7).all()), f"worst {(err / step).max().item():.3f} steps"
    assert wq.dequantize(qw).dtype == dtype and wq.dequantize(qw).shape == w.shape


def test_zero_and_constant_groups():
    w = _weight(8, 128)
    w[0] = 0.0
    w[1, :32] = 0.25  # a constant positive group: 0 is included in the range, so 0.25 is the top code
    for symmetric in (False, True):
        qw = wq.quantize(w, 32, symmetric)
        assert bool(torch.isfinite(qw.scales).all()) and bool((qw.scales > 0).all())
        deq = wq.dequantize(qw, torch.float64)
        assert bool((deq[0] == 0).all())
        assert torch.allclose(deq[1, :32], torch.full((32,), 0.25, dtype=torch.float64), rtol=1e-3)


@pytest.mark.parametrize(
    "n, k, group, symmetric, dtype",
    [
        (40, 480, 32, False, F16),
        (37, 224, 32, True, F16),
        (21, 448, 64, False, F16),
        pytest.param(37, 224, 32, True, BF16, marks=pytest.mark.gpu),
        pytest.param(72, 384, 128, False, BF16, marks=pytest.mark.gpu),
    ],
    ids=lambda v: str(v),
)
def test_unpack_to_memory_gives_the_dequantised_bits(device, n, k, group, symmetric, dtype):
    """The dequantise-to-memory kernel (dequantize's GPU path, the unfused baseline): the bits of the float32
    reference rounded once, with odd N, 96- and 32-input tail blocks, every group size (bf16 on the GPU
    only: Triton 3.6's interpreter bitcasts to bfloat16 wrongly)."""
    qw = wq.quantize(_weight(n, k, dtype).to(device), group, symmetric)
    assert torch.equal(wq.unpack_to_memory(qw), wq.dequantize(qw, F32).to(dtype))
    assert torch.equal(wq.dequantize(qw), wq.dequantize(qw, F32).to(dtype))
    with pytest.raises(ValueError, match="16-bit scales"):
        wq.unpack_to_memory(wq.quantize(_weight(8, 64, F32).to(device), 32))


def test_quantize_w8_round_trip():
    w = _weight(40, 100, F16)
    q8 = wq.quantize_w8(w)
    assert q8.qweight.dtype == torch.int8 and q8.qweight.shape == (40, 100) and q8.scales.shape == (40,)
    assert int(q8.qweight.abs().max()) == 127
    err = (wq.dequantize_w8(q8, torch.float64) - w.double()).abs()
    assert bool((err <= 0.5 * q8.scales.double()[:, None] * (1 + 1e-3)).all())
    assert wq.dequantize_w8(q8).dtype == F16


def test_layer_error_against_unquantised_weight():
    """The layer's output error is sane (a few % for int4, < 1 % for int8) and shrinks with the group."""
    w, x = _weight(72, 384), _x((64, 384), F32)
    exact = x.double() @ w.double().T

    def rel_rms(deq):
        return ((x.double() @ deq.T - exact).pow(2).mean() / exact.pow(2).mean()).sqrt().item()

    for symmetric in (False, True):
        errs = [rel_rms(wq.dequantize(wq.quantize(w, g, symmetric), torch.float64)) for g in (32, 64, 128)]
        assert errs[0] < errs[1] < errs[2] < 0.15, errs
        assert errs[0] > 0.02, errs  # 4 bits cannot be near-lossless
    e8 = rel_rms(wq.dequantize_w8(wq.quantize_w8(w), torch.float64))
    assert e8 < 0.01


def test_bytes_are_a_quarter():
    """The int4 format reads ≈ ¼ of the fp16 weight's bytes (+ scales and zeros: 4 bytes per group)."""
    w = _weight(256, 1024, F16)
    qw = wq.quantize(w, 128)
    ratio = w.numel() * 2 / qw.nbytes()
    assert 3.7 < ratio < 4.0, ratio


def test_bad_quantiser_inputs():
    with pytest.raises(ValueError, match="multiple of the group size"):
        wq.quantize(_weight(8, 96), 64)
    with pytest.raises(ValueError, match="group_size must be one of"):
        wq.quantize(_weight(8, 96), 48)
    with pytest.raises(TypeError, match="dtype"):
        wq.quantize(_weight(8, 64).double(), 32)
    with pytest.raises(TypeError, match="dtype"):
        wq.quantize_w8(torch.ones(8, 64, dtype=torch.int32))
    with pytest.raises(ValueError, match="2-D"):
        wq.quantize(torch.ones(2, 8, 64), 32)
    with pytest.raises(ValueError, match="2-D"):
        wq.quantize_w8(torch.ones(64))
    with pytest.raises(ValueError, match="NaN or Inf"):
        wq.quantize(torch.full((8, 64), float("nan")), 32)
    with pytest.raises(TypeError, match="W4Weight"):
        wq.dequantize(wq.quantize_w8(_weight(8, 64)))


# ---------------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------------


def _check_matmul(x, qw, bias, out, name):
    """Kernel vs float64 product with the dequantised weight, bounded by same-precision PyTorch."""
    ref = reference.linear_reference(x, qw, bias, torch.float64)
    same = reference.linear_reference(x, qw, bias)
    assert out.shape == (*x.shape[:-1], qw.shape[0]) and out.dtype == x.dtype
    tolerance.assert_close(name, out, ref, same, x.dtype)


# M ∈ {1, 3, 16} take the split-K path, 37 the tiled one; N = 40, 72 (multiples of 8, not powers of two)
CASES = [
    # (M, N, K, group, symmetric, bias, dtype)
    (1, 40, 64, 32, False, False, F16),
    (1, 72, 384, 128, True, True, F16),
    (3, 72, 192, 64, False, True, F16),
    (3, 40, 384, 32, True, False, F32),
    (16, 40, 192, 32, False, True, F16),
    (16, 72, 384, 128, False, False, F32),
    (37, 72, 192, 64, True, True, F16),
    (37, 40, 384, 128, False, True, F16),
    (37, 72, 64, 32, False, False, F32),
]


@pytest.mark.parametrize("m, n, k, group, symmetric, has_bias, dtype", CASES, ids=lambda v: str(v))
def test_matmul_matches_dequantised_product(device, m, n, k, group, symmetric, has_bias, dtype):
    qw = wq.quantize(_weight(n, k, F16).to(device), group, symmetric)
    x = _x((m, k), dtype).to(device)
    bias = _x((n,), dtype, seed=2).to(device) if has_bias else None
    _check_matmul(x, qw, bias, wq.matmul(x, qw, bias), f"matmul {m}x{n}x{k} g{group}")


def test_path_choice():
    """M ≤ 16 splits K (when K is long enough to split) and scales after the product, larger M runs the
    tiled GEMM; on a GPU the decode rows (M = 1 … 16) take the swapped tensor-core kernel split to fill an
    H200, M ≤ 64 too, the GEMM neither."""
    small = functools.partial(wq.choose_config, interpret=True)  # the interpreter's tiles, on any machine
    assert small(1, 72, 384).split_k > 1 and small(16, 72, 384).split_k > 1
    assert small(17, 72, 384).split_k == 1 and small(37, 72, 384).split_k == 1
    assert small(3, 72, 384).scale_after and not small(37, 72, 384).scale_after
    for m in (1, 3, 4, 16, 64):
        decode = wq.choose_config(m, 4096, 4096, interpret=False)
        assert decode.swap_ab and decode.scale_after and decode.split_k > 1
        assert decode.block_m == (16 if m <= 16 else 64)
        assert triton.cdiv(4096, decode.block_n) * decode.split_k >= 132  # at least one program per SM
    gemm = wq.choose_config(512, 4096, 4096, interpret=False)
    assert gemm.split_k == 1 and not gemm.scale_after
    assert wq.choose_config(1, 4096, 4096, interpret=False) is wq.choose_config(1, 4096, 4096, interpret=False)


@pytest.mark.parametrize("split_k", [1, 2, 5])
def test_pinned_configs_agree(device, split_k):
    """Every pinned split (5 asked for, of 3 whole blocks: 3 slices), both operand orders, a 256-input step
    whose second block is missing, and a 96-input tail block (K = 480) whose 12-word slices cross groups."""
    qw = wq.quantize(_weight(40, 480, F16).to(device), 32)
    x = _x((20, 480), F16).to(device)
    for block_k in (128, 256):
        for swap in (False, True):
            cfg = wq.W4A16Config(16, 32, block_k, split_k, 4, 1, swap)
            _check_matmul(x, qw, None, wq.matmul(x, qw, config=cfg), f"split {split_k} bk {block_k} swap {swap}")


@pytest.mark.parametrize("m", [1, 3, 16, 17, 100])
@pytest.mark.parametrize("split_k, swap", [(1, False), (3, True), (2, False), (1, True)])
def test_rows_with_and_without_split(device, m, split_k, swap):
    """M = 1, 3, 16, 17, 100 (one and several M tiles) with and without split-K, in both operand orders;
    K = 416 (3 blocks and a 32-input tail), N = 72 (a masked N tile)."""
    qw = wq.quantize(_weight(72, 416, F16).to(device), 32)
    x = _x((m, 416), F16).to(device)
    bias = _x((72,), F16, seed=2).to(device)
    cfg = wq.W4A16Config(32, 32, 128, split_k, 4, 1, swap)
    _check_matmul(x, qw, bias, wq.matmul(x, qw, bias, config=cfg), f"M={m} split {split_k} swap {swap}")


# (M, N, K, group, symmetric, bias): odd N, 96-input tail blocks (K = 480) whose 12-word slices cross groups
SCALE_AFTER_CASES = [
    (1, 37, 480, 32, False, True),
    (5, 72, 448, 64, True, False),
    (16, 40, 384, 128, False, True),
    (20, 40, 256, 128, False, False),
]


@pytest.mark.parametrize("m, n, k, group, symmetric, has_bias", SCALE_AFTER_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("swap, split_k", [(True, 1), (True, 3), (False, 2)])
def test_scale_after_the_product(device, m, n, k, group, symmetric, has_bias, swap, split_k):
    """scale_after: the MMA multiplies q − z (exact in fp16) and each group's fp32 sum takes its scale; every
    group size, both operand orders, with and without split-K: within the policy of the dequantised product
    (the weight is not rounded to 16 bits, so it may only be closer to float64)."""
    qw = wq.quantize(_weight(n, k, F16).to(device), group, symmetric)
    x = _x((m, k), F16).to(device)
    bias = _x((n,), F16, seed=2).to(device) if has_bias else None
    cfg = wq.W4A16Config(16, 32, 128, split_k, 4, 1, swap, True)
    out = wq.matmul(x, qw, bias, config=cfg)
    _check_matmul(x, qw, bias, out, f"scale after M={m} N={n} K={k} g{group} split {split_k} swap {swap}")
    assert torch.equal(out, wq.matmul(x, qw, bias, config=cfg))  # deterministic


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("m", [1, 16, 37, 200])
def test_ptx_dequant_gives_the_plain_triton_bits(dtype, m):
    """The PTX dequantisation on pairs of 16-bit values (sm_90) and the plain-Triton form give the same bits,
    with the default configs (scale after the product at M ≤ 64, before it for the GEMM) and the other
    order; K = 480 has a 96-input tail block, N = 136 a masked tile."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the PTX form needs sm_90")
    qw = wq.quantize(_weight(136, 480, dtype).cuda(), 32)
    x = _x((m, 480), dtype).cuda()
    default = wq.choose_config(m, 136, 480, sm_count=torch.cuda.get_device_properties(0).multi_processor_count)
    for cfg in (default, dataclasses.replace(default, scale_after=not default.scale_after)):
        out = wq.matmul(x, qw, config=cfg)
        assert torch.equal(out, wq.matmul(x, qw, config=dataclasses.replace(cfg, asm=False))), cfg
        _check_matmul(x, qw, None, out, f"{dtype} M={m} {cfg}")


@pytest.mark.gpu
def test_repeated_launches_take_the_prepared_launcher():
    """After the first call of a kind, matmul calls the compiled kernel's launcher directly (the weight's launch
    plan, kernels._launch.Prepared): the same bits on repeat; a strided x at another 16-byte aligned address
    takes the same plan, a misaligned one and another M with a bias new ones; every result right."""
    qw = wq.quantize(_weight(136, 480, BF16).cuda(), 32)
    rows = _x((5, 488), BF16).cuda()
    bias = _x((136,), BF16, seed=2).cuda()
    cases = ((rows[:3, :480], None, 1), (rows[:3, 8:], None, 0), (rows[:3, 1:481], None, 1), (rows[:, 8:], bias, 1))
    for x, b, new in cases:
        before = len(qw.plans)
        first = wq.matmul(x, qw, b)
        assert len(qw.plans) == before + new, (x.data_ptr() % 16, tuple(x.shape))
        plan = qw.plans[plans.plan_key(x, b, None, None)]
        assert plan.main.compiled is not None  # the next call skips Triton's binding
        assert torch.equal(wq.matmul(x, qw, b), first) and len(qw.plans) == before + new
        _check_matmul(x, qw, b, first, f"cached launch {tuple(x.shape)} at {x.data_ptr() % 16}")


# (M, N, K, group, symmetric, bias, weight dtype, x dtype): odd N, a tail block (K = 480, 224: 96-input
# tails whose 12-word slices cross groups of 32), fp32 weights (separate scales and zero points: dequantised
# in fp32), fp32 x (the exact mode)
DECODE_CASES = [
    (1, 37, 256, 128, False, False, F16, F16),
    (2, 75, 480, 32, False, True, F16, F16),
    (3, 40, 384, 64, True, True, F16, F16),
    (4, 37, 224, 32, False, True, F16, F32),
    (1, 72, 448, 64, False, True, F32, F32),
    (4, 40, 384, 128, True, False, F32, F16),
    (3, 21, 512, 128, False, True, F16, F16),
]


@pytest.mark.parametrize("m, n, k, group, symmetric, has_bias, wdtype, dtype", DECODE_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("split_k", [1, 2, 3])
def test_decode_rows(device, m, n, k, group, symmetric, has_bias, wdtype, dtype, split_k):
    """M = 1…4 on the decode path (swapped, scale after the product where the scales allow it), split 1, 2, 3
    (one launch, last program reduces), a 256-input step whose blocks may be missing, bias, odd N, weight
    and activation dtypes that differ: within the tolerance policy of the dequantised product."""
    qw = wq.quantize(_weight(n, k, wdtype).to(device), group, symmetric)
    x = _x((m, k), dtype).to(device)
    bias = _x((n,), dtype, seed=2).to(device) if has_bias else None
    for block_n, block_k in ((16, 256), (32, 128)):
        cfg = wq.W4A16Config(16, block_n, block_k, split_k, 4, 1, True, True)
        out = wq.matmul(x, qw, bias, config=cfg)
        _check_matmul(x, qw, bias, out, f"decode M={m} N={n} K={k} split {split_k} bn {block_n} bk {block_k}")
    assert torch.equal(out, wq.matmul(x, qw, bias, config=cfg))  # the same bits again


def test_splitk_counters_are_reused(device):
    """The cached split-K workspace: counters are back at 0 after every launch, across shapes, paths
    and a workspace that has to grow; results stay right and bit-identical on repeat."""
    shapes = [(2, 72, 512, True), (16, 40, 384, False), (1, 200, 256, True), (4, 520, 640, True)]
    first = {}
    for rep in range(2):
        for m, n, k, after in shapes:
            qw = wq.quantize(_weight(n, k, F16, seed=n).to(device), 128)
            x = _x((m, k), F16, seed=m).to(device)
            cfg = wq.W4A16Config(16, 32, 128, 3, 4, 1, True, after)
            out = wq.matmul(x, qw, config=cfg)
            if rep == 0:
                _check_matmul(x, qw, None, out, f"reuse {m}x{n}x{k}")
                first[(m, n, k)] = out
            else:
                assert torch.equal(out, first[(m, n, k)])
            for _, counters in plans._WORKSPACES.values():
                assert int(counters.abs().sum()) == 0


def test_splitk_is_deterministic(device):
    qw = wq.quantize(_weight(72, 512, F16).to(device), 64)
    x = _x((2, 512), F16).to(device)
    cfg = wq.W4A16Config(16, 32, 128, 4, 4, 1, True)
    assert torch.equal(wq.matmul(x, qw, config=cfg), wq.matmul(x, qw, config=cfg))


def test_leading_dims_and_strides(device):
    qw = wq.quantize(_weight(40, 128, F16).to(device), 64, symmetric=True)
    x = _x((2, 3, 256), F16).to(device)[..., ::2]  # non-contiguous last dim
    out = wq.matmul(x, qw)
    assert out.shape == (2, 3, 40)
    _check_matmul(x.reshape(6, 128), qw, None, out.reshape(6, 40), "strided x")


def test_empty_inputs(device):
    qw = wq.quantize(_weight(40, 64, F16).to(device), 32)
    out = wq.matmul(torch.empty(0, 5, 64, dtype=F16, device=device), qw)
    assert out.shape == (0, 5, 40)


@pytest.mark.parametrize("m, has_bias", [(3, True), (37, False)])
def test_matmul_w8(device, m, has_bias):
    q8 = wq.quantize_w8(_weight(72, 100, F16).to(device))  # K = 100: int8 needs no group
    x = _x((m, 100), F16).to(device)
    bias = _x((72,), F16, seed=2).to(device) if has_bias else None
    _check_matmul(x, q8, bias, wq.matmul_w8(x, q8, bias), f"matmul_w8 M={m}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 37])
def test_matmul_bf16_on_gpu(m):
    qw = wq.quantize(_weight(72, 384, BF16).cuda(), 128)
    x = _x((m, 384), BF16).cuda()
    _check_matmul(x, qw, None, wq.matmul(x, qw), f"bf16 M={m}")


def test_bad_matmul_inputs(device):
    qw = wq.quantize(_weight(40, 64, F16).to(device), 32)
    x = _x((3, 64), F16).to(device)
    with pytest.raises(ValueError, match="input features"):
        wq.matmul(_x((3, 96), F16).to(device), qw)
    with pytest.raises(TypeError, match="x dtype"):
        wq.matmul(x.double(), qw)
    with pytest.raises(ValueError, match="bias must have shape"):
        wq.matmul(x, qw, torch.zeros(41, dtype=F16, device=device))
    with pytest.raises(TypeError, match="W4Weight"):
        wq.matmul(x, wq.quantize_w8(_weight(40, 64, F16).to(device)))
    with pytest.raises(TypeError, match="W8Weight"):
        wq.matmul_w8(x, qw)
    with pytest.raises(ValueError, match="power of two"):
        wq.matmul(x, qw, config=wq.W4A16Config(16, 24, 128, 1, 4, 1))
    with pytest.raises(ValueError, match="multiple of the packing block"):
        wq.matmul(x, qw, config=wq.W4A16Config(16, 32, 64, 1, 4, 1))
    with pytest.raises(ValueError, match="scale_after belongs to the int4 kernel"):
        wq.matmul_w8(
            x, wq.quantize_w8(_weight(40, 64, F16).to(device)), config=wq.W4A16Config(16, 16, 32, 1, 4, 1, False, True)
        )
    with pytest.raises(ValueError, match="power of two ≥ 16"):
        wq.matmul(x, qw, config=wq.W4A16Config(4, 32, 128, 1, 4, 1))  # tl.dot tiles need 16


# ---------------------------------------------------------------------------------------------------
# The GPU path, compiled without a GPU
# ---------------------------------------------------------------------------------------------------

_COMPILE_SCRIPT = textwrap.dedent(
    """
    import re, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from kernels.w4a16 import w4a16_config, w4a16_kernels

    bits, m = int(sys.argv[1]), int(sys.argv[2])
    cfg = w4a16_config.choose_config(m, 4096, 4096, interpret=False, bits=bits)
    if bits == 4:
        fn = w4a16_kernels._w4a16_kernel
        consts = dict(GROUP=128, SYMMETRIC=False, TAIL_WORDS=0, SPLIT=cfg.split_k > 1, BLOCK_M=cfg.block_m,
                      BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, DEQ=3 if cfg.scale_after else 0, MAGIC=0x6400,
                      SWAP_AB=cfg.swap_ab, USE_ASM=True)
        pointers = {"X": "*fp16", "W": "*i32", "S": "*i32", "Out": "*fp16", "Part": "*fp32", "Cnt": "*i32"}
        none, ones = ("Z", "Bias"), ("stride_xk", "stride_wc", "stride_sn")
    else:
        fn = w4a16_kernels._w8a16_matmul_kernel
        consts = dict(SPLIT_K=cfg.split_k, IS_FP32=False, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                      BLOCK_K=cfg.block_k)
        pointers = {"X": "*fp16", "W": "*i8", "S": "*fp16", "Out": "*fp16" if cfg.split_k == 1 else "*fp32"}
        none, ones = ("Bias",), ("stride_xk", "stride_wk", "stride_sn", "stride_on")
    sig, cons = {}, {}
    for i, n in enumerate(fn.arg_names):
        if n in consts:
            sig[n], cons[(i,)] = "constexpr", consts[n]
        elif n in none:
            sig[n], cons[(i,)] = "constexpr", None
        elif n in ones:  # contiguous: pinned 1
            sig[n], cons[(i,)] = "constexpr", 1
        elif n in ("stride_zn", "stride_zg"):  # no Z: the launcher passes 0
            sig[n], cons[(i,)] = "constexpr", 0
        else:
            sig[n] = pointers.get(n, "i32")
    # what the runtime infers for 16-byte-aligned pointers and sizes/strides that are multiples of 16
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n] != "constexpr" and n != "split_k"}
    kernel = triton.compile(triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=cons, attrs=attrs),
                            target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    ptx = kernel.asm["ptx"]
    loop = kernel.asm["ttgir"].split("scf.for", 1)[1].split("scf.yield", 1)[0]
    print("pairs", ptx.count("sub.rn.f16x2"))
    print("loop-converts", loop.count("ttg.convert_layout"))
    print("local", ptx.count("ld.local") + ptx.count("st.local"))
    print(sorted(set(re.findall(r"(?:wgmma\\.mma_async\\.sync|mma\\.sync)\\.aligned\\.[\\w.]+", ptx))))
    """
)


@pytest.mark.parametrize(
    "bits, m", [(4, 1), (4, 16), (4, 512), (8, 512)], ids=["w4-decode", "w4-splitk", "w4-gemm", "w8-gemm"]
)
def test_gpu_path_compiles(bits, m):
    """Every int4 path builds for sm_90 with the default Hopper configs as f16 wgmma (the split-K decode
    path's m64n16k16 with the weight as the register operand, the GEMM's m64n128k16), dequantised with the
    PTX on pairs of weights; none with a layout conversion inside the K loop or local memory in the PTX;
    the int8 GEMM too."""
    if "nvidia" not in triton.backends.backends:
        pytest.skip("this Triton has no NVIDIA backend to compile with")
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    run = subprocess.run(
        [sys.executable, "-c", _COMPILE_SCRIPT, str(bits), str(m)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    found = ast.literal_eval(lines[-1])
    assert lines[-2] == "local 0", run.stdout
    if bits == 4:
        assert lines[-3] == "loop-converts 0", run.stdout
    pairs = int(lines[-4].split()[1])
    assert (pairs > 0) == (bits == 4), run.stdout  # the PTX dequantisation on f16x2 pairs
    assert found and all(".f16.f16" in f for f in found), found
    assert found[0].startswith("wgmma"), found


_UNPACK_SCRIPT = textwrap.dedent(
    """
    import sys
    import triton
    from triton.backends.compiler import GPUTarget
    from kernels.w4a16 import w4a16_kernels

    fn = w4a16_kernels._w4_unpack_kernel
    for dtype, magic in (("fp16", 0x6400), ("bf16", 0x4300)):
        for tail in (0, 4, 12):
            sig = {n: "i32" for n in fn.arg_names}
            sig.update(W="*i32", SZ="*i32", Out="*" + dtype)
            consts = dict(GROUP=32, TAIL_WORDS=tail, MAGIC=magic, USE_ASM=True, BLOCK_N=64)
            sig.update({n: "constexpr" for n in consts})
            src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts)
            ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
            print(dtype, tail, ptx.count("sub.rn." + ("f16x2" if dtype == "fp16" else "bf16x2")))
    """
)


def test_unpack_kernel_compiles_for_sm90():
    """The dequantise-to-memory kernel builds for sm_90 in both 16-bit dtypes, with and without a tail block
    (its tail branch is a runtime one, so that its values must type like the main branch's), with the PTX
    pairs; the interpreter alone would not notice."""
    if "nvidia" not in triton.backends.backends:
        pytest.skip("this Triton has no NVIDIA backend to compile with")
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    run = subprocess.run(
        [sys.executable, "-c", _UNPACK_SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    counts = {tuple(line.split()[:2]): int(line.split()[2]) for line in run.stdout.strip().splitlines()}
    assert len(counts) == 6 and all(c > 0 for c in counts.values()), run.stdout
