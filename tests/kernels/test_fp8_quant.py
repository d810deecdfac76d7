"""The fused e4m3 quantiser (kernels/attention/fp8_quant.py) against the torch one (``fp8.quantize``).

The kernel divides, clamps and rounds as torch does, so the test is equality, bit for bit: the e4m3 bytes
and the float32 scales, for every granularity, odd sequence lengths and head dims, strided and broadcast
inputs, and the transposed layout FP8 attention feeds the kernel's P V product with. Non-finite inputs
are the one place the two differ on purpose: torch's raises (it reads the amax back), the fused one gives
non-finite scales and counts the blocks on the device, and ``check`` raises from that count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import triton
from attention_checks import random_tensors

from kernels.attention import fa3, fp8, fp8_quant

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


def _same(
    name, got: fp8_quant.QuantizedFP8, x: torch.Tensor, granularity: str, block: int | None, transpose: bool = False
):
    """``got`` holds fp8.quantize's bytes and scales (its x8 transposed back with ``transpose``)."""
    x8, scale = fp8.quantize(x.cpu(), granularity, block)
    got = got._replace(x8=got.x8.transpose(-1, -2)) if transpose else got
    assert got.x8.shape == x.shape and got.x8.dtype == torch.float8_e4m3fn, name
    assert got.scale.dtype == torch.float32 and got.scale.shape == scale.shape, (name, got.scale.shape)
    assert torch.equal(got.scale.cpu(), scale), f"{name}: scales differ"
    mismatch = (got.x8.cpu().contiguous().view(torch.uint8) != x8.view(torch.uint8)).sum().item()
    assert mismatch == 0, f"{name}: {mismatch} of {x8.numel()} e4m3 bytes differ from fp8.quantize"
    assert int(got.nonfinite.item()) == 0, name


# (shape, dtype, granularity, block)
CASES = [
    pytest.param((2, 3, 97, 40), F32, "block", 16, id="n97-d40-block16-f32"),
    pytest.param((1, 2, 130, 64), F16, "block", 64, id="n130-d64-block64-f16"),
    pytest.param((1, 2, 200, 128), F16, "block", 128, id="n200-d128-block128-f16"),
    pytest.param((2, 2, 70, 64), BF16, "head", None, id="n70-d64-head-bf16"),
    pytest.param((2, 3, 150, 72), F16, "tensor", None, id="n150-d72-tensor-f16"),
    pytest.param((1, 2, 33, 256), F32, "head", None, id="n33-d256-head-f32"),
    pytest.param((1, 1, 5, 32), F16, "none", None, id="n5-d32-none-f16"),
    pytest.param((1, 1, 1, 16), F16, "block", 256, id="n1-d16-block256-f16"),
]


@pytest.mark.parametrize("shape, dtype, granularity, block", CASES)
@pytest.mark.parametrize("transpose", [False, True], ids=["rows", "transposed"])
def test_bit_identical_to_the_torch_quantiser(shape, dtype, granularity, block, transpose, device):
    (x,) = random_tensors([shape], dtype, device, seed=shape[2])
    x[..., min(1, shape[2] - 1), :] *= 50.0  # one loud row: per-block scales differ from the others
    if granularity == "none":
        x = x * 300.0  # some values saturate at ±448
    x[..., 0, 0] = -0.0
    got = fp8_quant.quantize(x, granularity, block, transpose=transpose)
    _same(f"{shape} {granularity} {dtype}", got, x, granularity, block, transpose)
    if transpose:  # [B, H, d, N]: keys contiguous, every row 16-byte aligned
        assert got.x8.shape == (*shape[:2], shape[3], shape[2])
        assert got.x8.stride(-1) == 1 and got.x8.stride(-2) % 16 == 0 and got.x8.stride(-2) >= shape[2]
    else:
        assert got.x8.is_contiguous()


@pytest.mark.parametrize("shape, dtype, granularity, block", CASES)
def test_fa3_layout_holds_the_same_bytes(shape, dtype, granularity, block, device):
    """``interleave``: V in the FP8 FA-3 kernel's layout, the same bytes in its key order, zero padding, and
    what ``fa3.fp8_values`` makes of the plain quantised V."""
    (x,) = random_tensors([shape], dtype, device, seed=shape[2] + 1)
    got = fp8_quant.quantize(x, granularity, block, transpose=True, interleave=True)
    b, h, n, d = shape
    width = -(-n // 32) * 32
    assert got.x8.shape == (b, h, d, width) and got.x8.is_contiguous()
    values = fa3.FP8Values(got.x8, n)
    _same(f"{shape} {granularity} interleaved", got._replace(x8=values.rows()), x, granularity, block)
    slots = fa3.fp8_key_slots(width, device)
    padding = got.x8.view(torch.uint8)[..., slots[n:]]
    assert not padding.any(), "the keys past N must be stored as zeros"
    plain = fp8_quant.quantize(x, granularity, block)
    copied = fa3.fp8_values(plain.x8)
    assert torch.equal(copied.data.view(torch.uint8), got.x8.view(torch.uint8))


def test_fa3_key_slots_keep_every_value_in_its_thread():
    """The layout's reason: the wgmma accumulator gives thread t of a quad columns 8i + 2t + {0, 1}; the e4m3
    A operand wants it to hold k = 16h + 4t + {0…3}. The slot of every key must be a k of the same thread,
    and the slots a permutation within each group of 32."""
    n = 96
    slots = fa3.fp8_key_slots(n)
    key = torch.arange(n)
    assert torch.equal(slots.sort().values, key)
    assert torch.equal(slots // fa3.FP8_KEY_GROUP, key // fa3.FP8_KEY_GROUP)
    assert torch.equal((key % 8) // 2, (slots % 16) // 4), "a key would move to another thread"
    assert not torch.equal(slots, key)


def test_strided_and_broadcast_inputs(device):
    """Heads interleaved with the sequence ([B, N, H, d] viewed as [B, H, N, d]), a slice of the head dim,
    a head broadcast with stride 0, a reversed sequence: each quantised as its contiguous copy is."""
    (base,) = random_tensors([(2, 97, 3, 96)], F16, device, seed=3)
    views = {
        "heads-interleaved": base.transpose(1, 2),
        "head-dim-slice": base.transpose(1, 2)[..., 8:72],
        "broadcast-head": base[:, :, :1].transpose(1, 2).expand(2, 4, 97, 96),
        "reversed-seq": base.transpose(1, 2).flip(2),
        "every-other-row": base.transpose(1, 2)[:, :, ::2],
    }
    for name, view in views.items():
        for granularity, block in (("block", 32), ("head", None), ("tensor", None)):
            transpose = name == "broadcast-head"
            got = fp8_quant.quantize(view, granularity, block, transpose=transpose)
            _same(f"{name} {granularity}", got, view.contiguous(), granularity, block, transpose)


def test_zero_groups_get_scale_one(device):
    x = torch.zeros(1, 2, 40, 32, device=device, dtype=F16)
    x[0, 1, 20:] = 3.0
    got = fp8_quant.quantize(x, "block", 16)
    s = torch.tensor(3.0) / 448.0  # in float32, as the kernel divides
    assert torch.equal(got.scale.cpu(), torch.tensor([[[1.0, 1.0, 1.0], [1.0, s, s]]]))
    _same("zeros", got, x, "block", 16)
    got = fp8_quant.quantize(torch.zeros(1, 1, 7, 16, device=device, dtype=F16), "tensor")
    assert got.scale.item() == 1.0 and not got.x8.float().any()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_non_finite_inputs_are_counted_not_hidden(value, device):
    (x,) = random_tensors([(1, 2, 64, 32)], F16, device, seed=9)
    x[0, 1, 40, 7] = value
    got = fp8_quant.quantize(x, "block", 16)
    assert int(got.nonfinite.item()) == 1
    scale = got.scale.cpu()
    assert not torch.isfinite(scale[0, 1, 2]), "the block holding it has a non-finite scale"
    assert torch.isfinite(scale[0, 0]).all() and torch.isfinite(scale[0, 1, :2]).all()
    assert torch.isfinite(scale[0, 1, 3])
    with pytest.raises(ValueError, match="cannot quantise v: it holds NaN or Inf"):
        got.check("v")
    got = fp8_quant.quantize(x, "head")
    assert not torch.isfinite(got.scale[0, 1].cpu()) and torch.isfinite(got.scale[0, 0].cpu())
    # ... and FP8 attention's quantisation refuses them when asked to look
    with pytest.raises(ValueError, match="cannot quantise q"):
        fp8.quantize_qkv(x, x, x, "block", blocks=(16, 16), check_finite=True)


@pytest.mark.parametrize("granularity", ["block", "head", "tensor"])
def test_non_finite_inputs_in_a_chunked_block(granularity, device):
    """A block walked in chunks (256 × 128: 64 rows at a time, ``_tiling``) counts a NaN in any chunk once, and
    its group's scale says so; the blocks around it keep theirs (per head and tensor: 64-row tiles held
    whole)."""
    assert fp8_quant._tiling(256, 128, False)[0] < 256  # (the case this test is about)
    (x,) = random_tensors([(1, 2, 600, 128)], F16, device, seed=4)
    x[0, 0, 256 + 77, 5] = float("nan")  # block 1, in its second chunk
    got = fp8_quant.quantize(x, granularity, 256)
    assert int(got.nonfinite.item()) == 1
    scale = got.scale.cpu()
    if granularity == "block":
        assert not torch.isfinite(scale[0, 0, 1]) and torch.isfinite(scale[0, 0, [0, 2]]).all()
        assert torch.isfinite(scale[0, 1]).all()
    elif granularity == "head":
        assert not torch.isfinite(scale[0, 0]) and torch.isfinite(scale[0, 1])
    else:
        assert not torch.isfinite(scale)
    x8 = got.x8.cpu().float()
    assert torch.isnan(x8[0, 0, 256 + 77, 5]) and torch.isfinite(x8[0, 1]).all()


def test_empty_tensors(device):
    for shape in ((1, 2, 0, 32), (0, 2, 5, 32)):
        x = torch.zeros(shape, device=device, dtype=F16)
        for transpose in (False, True):
            got = fp8_quant.quantize(x, "block", 16, transpose=transpose)
            assert got.x8.shape == (shape[:2] + (shape[3], shape[2]) if transpose else shape)
            assert int(got.nonfinite.item()) == 0


def test_rejects_bad_arguments(device):
    x = torch.randn(1, 2, 17, 32, device=device, dtype=F16)
    with pytest.raises(ValueError, match="granularity must be one of"):
        fp8_quant.quantize(x, "channel")
    with pytest.raises(ValueError, match="interleave=True .* needs transpose=True"):
        fp8_quant.quantize(x, "tensor", interleave=True)
    for block in (None, 8, 17, 512, True, 16.0):
        with pytest.raises(ValueError, match="block size that is a power of two"):
            fp8_quant.quantize(x, "block", block)
    with pytest.raises(ValueError, match=r"x must be a \[batch, heads, seq, head_dim\] tensor"):
        fp8_quant.quantize(x[0], "tensor")
    with pytest.raises(TypeError, match="float16, bfloat16 or float32"):
        fp8_quant.quantize(x.to(torch.int8), "tensor")
    with pytest.raises(TypeError, match="float16, bfloat16 or float32"):
        fp8_quant.quantize(x.to(torch.float8_e4m3fn), "tensor")


_COMPILE = textwrap.dedent(
    """
    import json
    from analysis.families.compiled import sass
    from kernels.attention import fp8_quant
    from kernels.attention import fp8
    # the FA-3 kernel's blocks (Q rows, K/V rows) per head dim: Q and K row-major, V transposed and interleaved
    tiles = [(fp8.blocks("fa3", d), d) for d in (64, 128, 256)]
    variants = [(rows, transpose, d) for (qb, kvb), d in tiles
                for rows, transpose in ((qb, False), (kvb, False), (kvb, True))]
    for rows, transpose, d in variants:
        block_d = max(16, d)
        chunk, cols, warps = fp8_quant._tiling(rows, block_d, transpose)
        consts = dict(GRANULARITY=3, TRANSPOSE=transpose, INTERLEAVE=transpose, HEAD_DIM=d, ROWS=rows,
                      CHUNK=chunk, BLOCK_D=block_d, COLS=cols, EMULATE=False, stride_d=1, stride_ocol=1)
        kinds = {"X": "*bf16", "X8": "*fp8e4nv", "SCALE": "*fp32", "AMAX": "*i32", "NONFINITE": "*i32"}
        # lengths that are multiples of 16, as Triton specialises them for N = 4096
        k = sass.compile_kernel(fp8_quant._quantize_kernel, kinds, consts, 90, dict(num_warps=warps),
                                aligned=("seqlen", "width"))
        code = sass.read(k.asm["cubin"])
        words = [op.split() for _, op in code.instructions]
        stores = [w for ws in words for w in ws[:2] if w.startswith("STG")]
        print(json.dumps(dict(rows=rows, transpose=transpose, d=d, chunk=chunk, cols=cols, warps=warps,
                              registers=code.registers, stack=code.stack_bytes, stores=stores)))
    """
)


def test_quantiser_compiles_for_hopper_without_spills():
    """The launch's warps keep each program's tile in registers: no stack frame (spills) on sm_90. And the
    e4m3 tile goes out in 16-byte stores, V's transposed and interleaved layout too (the interleaving is
    done on the rows read, so that the columns written stay in order)."""
    if "nvidia" not in triton.backends.backends:
        pytest.skip("this Triton has no NVIDIA backend to compile with")
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(root))
    run = subprocess.run(
        [sys.executable, "-c", _COMPILE], env=env, cwd=root, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-4000:]
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 9
    for row in rows:
        assert row["stack"] == 0, f"the quantiser spills: {row}"
        data = [op for op in row["stores"] if op != "STG.E"]  # (STG.E: the one scale, 4 bytes)
        assert data and all(op == "STG.E.128" for op in data), f"the e4m3 tile is not stored 16 bytes at a time: {row}"
