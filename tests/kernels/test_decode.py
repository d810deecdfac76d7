"""Split-KV decoding on contiguous caches against float64 on decoding shapes: every split count, grouped-query
heads packed into one tile and not, per-request key lengths."""

from __future__ import annotations

import math

import pytest
import torch
from attention_checks import assert_matches_reference, random_tensors

from kernels.attention import decode, fa2

F16, F32, BF16 = torch.float16, torch.float32, torch.bfloat16

CASES = [
    pytest.param((2, 4, 2, 1, 200, 64, False, F16), id="q1-nk200-gqa-f16"),
    pytest.param((1, 2, 2, 3, 97, 59, True, F32), id="q3-nk97-d59-causal-f32"),
    pytest.param((1, 8, 1, 16, 130, 128, True, F16), id="q16-nk130-mqa-causal-f16"),
    pytest.param((1, 1, 1, 5, 3, 16, True, F32), id="q5-nk3-causal-rows-without-keys-f32"),
    pytest.param((1, 2, 1, 1, 1000, 32, False, F32), id="q1-nk1000-f32"),
    pytest.param((4, 8, 2, 1, 4099, 128, False, BF16), id="q1-nk4099-bf16", marks=pytest.mark.gpu),
]


def _inputs(shape, device, seed=0):
    b, h, hk, nq, nk, d, _, dtype = shape
    return random_tensors([(b, h, nq, d), (b, hk, nk, d), (b, hk, nk, d)], dtype, device, seed)


@pytest.mark.parametrize("splits", [None, 1, 3, 64], ids=["auto", "1", "3", "more-than-blocks"])
@pytest.mark.parametrize("shape", CASES)
def test_matches_float64_for_any_split_count(shape, splits, device):
    causal = shape[6]
    q, k, v = _inputs(shape, device)
    out, lse = decode.forward(q, k, v, causal=causal, num_splits=splits)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert_matches_reference(f"decode {shape} splits={splits}", out, q, k, v, causal)
    _, lse_fa2 = fa2.forward(q, k, v, causal=causal)  # the merged logsumexp is the whole row's
    finite = torch.isfinite(lse_fa2)
    assert torch.equal(torch.isfinite(lse), finite)
    assert torch.allclose(lse[finite], lse_fa2[finite], atol=1e-4, rtol=1e-5)


def test_rows_that_see_no_key_are_zero(device):
    q, k, v = _inputs((1, 1, 1, 5, 3, 16, True, F32), device)  # rows 0 and 1 see nothing
    out, lse = decode.forward(q, k, v, causal=True)
    assert torch.count_nonzero(out[:, :, :2]) == 0
    assert torch.isneginf(lse[:, :, :2]).all()


def test_split_choice_fills_the_device_and_respects_blocks():
    cpu = torch.device("cpu")
    assert decode.choose_splits(1, 10, cpu) == 1  # one key block: nothing to split
    assert decode.choose_splits(1, 100_000, cpu) > 1
    assert decode.choose_splits(1024, 100_000, cpu) == 1  # enough programs already
    assert decode.choose_splits(1, 10**9, cpu) <= 128


def test_last_splits_reports_the_rounded_count(device):
    q, k, v = _inputs((1, 1, 1, 1, 70, 16, False, F32), device)
    blocks = -(-70 // decode.BLOCK_N)
    decode.forward(q, k, v, num_splits=64)  # more splits than key blocks: one split per block
    assert decode.last_splits() == blocks
    decode.forward(q, k, v, num_splits=1)
    assert decode.last_splits() == 1


def test_custom_scale(device):
    q, k, v = _inputs((1, 2, 2, 2, 70, 32, False, F32), device)
    out = decode.forward(q, k, v, sm_scale=0.1, num_splits=4)[0]
    assert_matches_reference("decode sm_scale", out, q, k, v, sm_scale=0.1)


def test_bad_input_is_refused(device):
    q, k, v = _inputs((1, 1, 1, 17, 40, 16, False, F32), device)
    with pytest.raises(ValueError, match="1 to 16 query rows"):
        decode.forward(q, k, v)
    q1 = q[:, :, :1]
    with pytest.raises(ValueError, match="num_splits must be >= 1"):
        decode.forward(q1, k, v, num_splits=-2)
    with pytest.raises(ValueError, match="sm_scale"):
        decode.forward(q1, k, v, sm_scale=math.nan)
    with pytest.raises(NotImplementedError, match="inference-only"):
        decode.attention(q1.clone().requires_grad_(True), k, v)


@pytest.mark.parametrize("pack_gqa", [True, False], ids=["packed", "unpacked"])
@pytest.mark.parametrize("group", [8, 4])
def test_grouped_heads_packed_and_unpacked(group, pack_gqa, device):
    """GQA 8:1 and 4:1: the group's query heads in one tile (each K/V tile read once for them) or one head per
    program; both against float64, with causal masking over 3 new tokens."""
    q, k, v = _inputs((2, 2 * group, 2, 3, 45, 32, True, F16), device)
    out, _ = decode.forward(q, k, v, causal=True, pack_gqa=pack_gqa, num_splits=2)
    assert_matches_reference(f"decode GQA {group}:1 pack_gqa={pack_gqa}", out, q, k, v, True)
    per_prog, block_m, m_blocks = decode.tiling(2 * group, 2, 3, pack_gqa)
    assert per_prog == (group if pack_gqa else 1) and m_blocks == 1 and block_m == (32 if per_prog == 8 else 16)


def test_per_request_lengths(device):
    """``seqlens_k``: each request's own number of keys (0 gives zeros, a length past Nk counts as Nk)."""
    q, k, v = _inputs((3, 4, 2, 2, 60, 32, True, F16), device)
    lens = [60, 0, 17]
    out, lse = decode.forward(q, k, v, causal=True, seqlens_k=torch.tensor(lens, dtype=torch.int32, device=device))
    for b, n in enumerate(lens):
        if n == 0:
            assert torch.count_nonzero(out[b]) == 0 and torch.isneginf(lse[b]).all()
            continue
        sl = slice(b, b + 1)
        assert_matches_reference(f"request {b}", out[sl], q[sl], k[sl, :, :n], v[sl, :, :n], True)
    past = torch.tensor([99, 60, 60], dtype=torch.int32, device=device)
    assert torch.equal(decode.forward(q, k, v, seqlens_k=past)[0], decode.forward(q, k, v)[0])
    with pytest.raises(TypeError, match="seqlens_k must be int32"):
        decode.forward(q, k, v, seqlens_k=past.long())
