"""Arguments that used to give a silent wrong answer or a cryptic error: each now gives a correct result or
an error naming the argument (issue 20's list, one test per case)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from kernels import _runtime
from kernels import w4a16 as wq
from kernels.attention import decode, fa1, fa2, fp8, reference
from kernels.moe import grouped_gemm, moe_ffn

F16, F32 = torch.float16, torch.float32


def _qkv(device, nq=9, nk=13, d=16, dtype=F16):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, n, d, generator=g).to(dtype).to(device) for n in (nq, nk, nk)]


@pytest.mark.parametrize(
    "entry",
    [
        lambda q, k, v, c: fa2.attention(q, k, v, causal=c),
        lambda q, k, v, c: fa2.forward(q, k, v, causal=c),
        lambda q, k, v, c: fa1.attention(q, k, v, causal=c),
        lambda q, k, v, c: decode.attention(q[:, :, :3], k, v, causal=c),
        lambda q, k, v, c: fp8.attention(q, k, v, causal=c),
    ],
    ids=["fa2.attention", "fa2.forward", "fa1.attention", "decode.attention", "fp8.attention"],
)
@pytest.mark.parametrize("causal", ["False", "True", 0, None])
def test_causal_must_be_a_bool(entry, causal, device):
    """``causal="False"`` is truthy: it ran the causal kernel. Now anything but True/False is refused."""
    q, k, v = _qkv(device)
    with pytest.raises(TypeError, match=r"causal must be True or False, got"):
        entry(q, k, v, causal)


def test_causal_false_as_numpy_bool_is_not_causal(device):
    q, k, v = _qkv(device)
    assert torch.equal(fa2.attention(q, k, v, causal=np.bool_(False)), fa2.attention(q, k, v, causal=False))
    assert not torch.equal(fa2.attention(q, k, v, causal=False), fa2.attention(q, k, v, causal=True))


def test_varlen_and_backward_check_causal(device):
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in _qkv(device, nq=13))
    cu = torch.tensor([0, 6, 13], dtype=torch.int32, device=device)
    with pytest.raises(TypeError, match="causal must be True or False"):
        fa2.attention_varlen(q, k, v, cu, cu, causal="False")
    qd, kd, vd = _qkv(device)
    out, lse = fa2.forward(qd, kd, vd)
    with pytest.raises(TypeError, match="causal must be True or False"):
        fa2.backward(out, qd, kd, vd, out, lse, causal="no")


@pytest.mark.parametrize(
    "fields, message",
    [
        ((24, 16, 4, 1), "block_m must be a power of two >= 16, got 24"),
        ((16, 0, 4, 1), "block_n must be a power of two >= 16, got 0"),
        ((8, 16, 4, 1), "block_m must be a power of two >= 16, got 8"),
        ((16, 16, 3, 1), "num_warps must be a power of two >= 1, got 3"),
        ((16, 16, 4, 0), "num_stages must be >= 1, got 0"),
    ],
)
def test_fa2_config_is_checked_when_made(fields, message):
    """FA2Config(24, 16, 4, 1) used to fail inside the interpreter ("arange's range must be a power of 2"),
    FA2Config(16, 0, 4, 1) with a ZeroDivisionError; now the constructor names the field."""
    with pytest.raises(ValueError, match=message):
        fa2.FA2Config(*fields)
    with pytest.raises(TypeError, match="block_m must be an int"):
        fa2.FA2Config(32.0, 16, 4, 1)


@pytest.mark.parametrize("splits, error", [(2.5, TypeError), ("2", TypeError), (True, TypeError), (0, ValueError)])
def test_decode_num_splits_is_checked(splits, error, device):
    q, k, v = _qkv(device, nq=1, nk=40)
    with pytest.raises(error, match="num_splits must be"):
        decode.forward(q, k, v, num_splits=splits)


def test_decode_num_splits_runs_what_it_says(device):
    """Splits are rounded to whole key blocks: 3 * BLOCK_N - 10 keys make three of them whatever BLOCK_N is
    (on the H200 it is larger than in the interpreter), and a fourth asked for is one block too many."""
    nk = 3 * decode.BLOCK_N - 10
    q, k, v = _qkv(device, nq=2, nk=nk)
    out, _ = decode.forward(q, k, v, num_splits=3)
    assert decode.last_splits() == 3
    decode.forward(q, k, v, num_splits=4)
    assert decode.last_splits() == 3
    ref = reference.reference_attention(q, k, v)
    assert (out.double() - ref).abs().max() < 2e-3


def test_max_seqlen_past_all_tokens_sizes_the_grid_by_the_tokens(device):
    """max_seqlen_q = 10**7 for 10 tokens launched a grid over 10**7 rows (minutes in the interpreter); a bound
    past the token count now sizes the grid by the tokens (no sequence is longer): the same result, at once."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(10, 2, 16, generator=g).to(F16).to(device) for _ in range(3))
    cu = torch.tensor([0, 4, 10], dtype=torch.int32, device=device)
    exact = fa2.attention_varlen(q, k, v, cu, cu, causal=True)
    start = time.monotonic()
    huge = fa2.attention_varlen(q, k, v, cu, cu, max_seqlen_q=10**7, max_seqlen_k=10**9, causal=True)
    assert time.monotonic() - start < 10
    assert torch.equal(huge, exact)
    with pytest.raises(ValueError, match=r"max_seqlen_q=5 is shorter than the longest sequence in the batch \(6\)"):
        fa2.attention_varlen(q, k, v, cu, cu, max_seqlen_q=5)
    with pytest.raises(TypeError, match="max_seqlen_q must be an int or None, got float"):
        fa2.attention_varlen(q, k, v, cu, cu, max_seqlen_q=6.0)


def test_moe_logits_with_the_wrong_expert_count_blame_the_logits(device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 16, generator=g).to(F16).to(device)
    w_gate, w_up = (torch.randn(4, 16, 8, generator=g).to(F16).to(device) for _ in range(2))
    w_down = torch.randn(4, 8, 16, generator=g).to(F16).to(device)
    logits = torch.randn(5, 6, generator=g).to(device)
    with pytest.raises(ValueError, match=r"router_logits has 6 expert columns but w_gate has 4 experts .*\[5, 4\]"):
        moe_ffn(x, logits, w_gate, w_up, w_down, top_k=2)
    with pytest.raises(TypeError, match="renormalize must be True or False"):
        moe_ffn(x, logits[:, :4], w_gate, w_up, w_down, top_k=2, renormalize="yes")


def test_w4a16_refuses_bfloat16_in_the_interpreter():
    """Every other entry refused bf16 on the CPU (the interpreter's tl.dot is wrong there); w4a16.matmul
    returned errors of 5·10¹⁰."""
    if not _runtime.INTERPRET:
        pytest.skip("the interpreter's refusal; on a GPU bf16 runs (tests/kernels/test_w4a16.py)")
    qw = wq.quantize(0.05 * torch.randn(32, 128).bfloat16(), 32)
    x = torch.randn(2, 128).bfloat16()
    with pytest.raises(TypeError, match="x has dtype torch.bfloat16: bfloat16 is not supported in Triton's interp"):
        wq.matmul(x, qw)
    with pytest.raises(TypeError, match="x has dtype torch.bfloat16"):
        wq.matmul_w8(x, wq.quantize_w8(0.05 * torch.randn(32, 128).bfloat16()))


@pytest.mark.parametrize("dtype", [F32, torch.bfloat16])
def test_weight_entries_near_the_top_of_the_range_quantise_to_finite_scales(dtype, device):
    """A finite 3·10³⁸ entry made the group's span (max − min) overflow to an infinite scale in float32, and
    the output NaN. The span is now taken in float64: scales finite, the entry dequantised to itself."""
    g = torch.Generator().manual_seed(0)
    w = 0.05 * torch.randn(16, 64, generator=g)
    w[3, 5], w[7, 40] = 3e38, -3e38
    qw = wq.quantize(w.to(dtype), 32)
    assert bool(torch.isfinite(qw.scales.float()).all())
    deq = wq.dequantize(qw, torch.float64)
    assert torch.isfinite(deq).all()
    assert abs(deq[3, 5].item() / w[3, 5].item() - 1) < 0.1 and abs(deq[7, 40].item() / w[7, 40].item() - 1) < 0.1
    if dtype == F32:  # float32 activations keep the product finite: compare with the float64 product
        x = (1e-3 * torch.randn(3, 64, generator=g)).to(device)
        out = wq.matmul(x, wq.quantize(w, 32) if device == "cpu" else _to(qw, device)).cpu()
        ref = x.cpu().double() @ deq.T
        assert torch.isfinite(out).all()
        assert ((out.double() - ref).abs() / ref.abs().clamp_min(1.0)).max() < 1e-5


def _to(qw, device):
    import dataclasses

    moved = {
        f.name: getattr(qw, f.name).to(device)
        for f in dataclasses.fields(qw)
        if isinstance(getattr(qw, f.name), torch.Tensor)
    }
    return dataclasses.replace(qw, **moved)


def test_weight_whose_grid_would_overflow_is_refused():
    """Where even the float64 scale cannot help (entries at ±max: the grid point past them overflows), a
    clear error instead of infinities."""
    w = torch.zeros(8, 32)
    w[0, 0], w[0, 1] = torch.finfo(F32).max, -torch.finfo(F32).max
    with pytest.raises(ValueError, match="weight has entries too close to the largest torch.float32"):
        wq.quantize(w, 32)
    w16 = torch.zeros(8, 32, dtype=F16)
    w16[0, 0] = 65504.0
    with pytest.raises(ValueError, match="overflows torch.float16"):
        wq.quantize(w16, 32)


def test_bias_of_the_wrong_kind_is_named():
    qw = wq.quantize(0.05 * torch.randn(32, 128), 32)
    x = torch.randn(2, 128, dtype=F16)
    with pytest.raises(TypeError, match="bias must be a torch.Tensor or None, got list"):
        wq.matmul(x, qw, [0.0] * 32)
    with pytest.raises(TypeError, match="bias must be floating point, got torch.int64"):
        wq.matmul(x, qw, torch.zeros(32, dtype=torch.long))


def test_grouped_gemm_check_offsets_must_be_a_bool(device):
    a = torch.randn(6, 16).to(F16).to(device)
    b = torch.randn(2, 16, 16).to(F16).to(device)
    offs = torch.tensor([2, 6], dtype=torch.int32, device=device)
    with pytest.raises(TypeError, match="check_offsets must be True or False"):
        grouped_gemm(a, b, offs, check_offsets="False")
    with pytest.raises(ValueError, match="expert_offsets must end at total_rows = 6"):
        grouped_gemm(a, b, torch.tensor([2, 5], dtype=torch.int32, device=device))


def test_backward_side_inputs_are_checked(device):
    q, k, v = _qkv(device)
    out, lse = fa2.forward(q, k, v)
    with pytest.raises(TypeError, match="lse must be float32"):
        fa2.backward(out, q, k, v, out, lse.half())
    with pytest.raises(TypeError, match="out must have q's dtype"):
        fa2.backward(out, q, k, v, out.float(), lse)
    with pytest.raises(ValueError, match="FlashAttention-1 here needs as many K/V heads"):
        kq = k[:, :1]
        fa1.backward(out, q, kq, v[:, :1], out, lse)
