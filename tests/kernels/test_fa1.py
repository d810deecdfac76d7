"""FlashAttention-1 as published (Algorithms 1 and 4) against float64, under the tolerance policy, on odd shapes."""

from __future__ import annotations

import math

import pytest
import torch
from attention_checks import assert_gradients_match, assert_matches_reference, random_tensors

from kernels.attention import fa1, reference

F16, F32, BF16 = torch.float16, torch.float32, torch.bfloat16

CASES = [
    pytest.param((1, 2, 33, 33, 16, False, F32), id="n33-d16-f32"),
    pytest.param((1, 2, 47, 47, 32, True, F16), id="n47-d32-causal-f16"),
    pytest.param((2, 1, 33, 70, 59, True, F16), id="nq33-nk70-d59-causal-f16"),
    pytest.param((1, 1, 70, 33, 16, True, F32), id="nq70-nk33-d16-causal-f32"),  # 37 rows see no key
    pytest.param((1, 2, 97, 97, 80, False, F16), id="n97-d80-f16"),
    pytest.param((1, 1, 1, 1, 16, False, F32), id="n1-d16-f32"),
    pytest.param((1, 1, 17, 130, 111, False, F32), id="nq17-nk130-d111-f32"),
    pytest.param((1, 2, 257, 257, 128, True, BF16), id="n257-d128-causal-bf16", marks=pytest.mark.gpu),
]


def _inputs(shape, device, seed=0):
    b, h, nq, nk, d, _, dtype = shape
    return random_tensors([(b, h, n, d) for n in (nq, nk, nk, nq)], dtype, device, seed)  # q, k, v, do


@pytest.mark.parametrize("shape", CASES)
def test_forward_matches_float64(shape, device):
    causal = shape[5]
    q, k, v, _ = _inputs(shape, device)
    out, lse = fa1.forward(q, k, v, causal=causal)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert_matches_reference(f"fa1 out {shape}", out, q, k, v, causal)
    nq, nk, d = q.shape[2], k.shape[2], q.shape[3]
    scores = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(d)
    if causal:
        scores = scores.masked_fill(reference.causal_mask(torch.arange(nq, device=q.device), nq, nk), float("-inf"))
    expected = torch.logsumexp(scores, dim=-1)
    finite = torch.isfinite(expected)
    assert torch.equal(torch.isfinite(lse), finite)
    assert torch.allclose(lse[finite].double(), expected[finite], atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("blocks", [(16, 16), (16, 32), (32, 16)], ids=lambda b: f"Br{b[0]}-Bc{b[1]}")
def test_block_sizes_change_nothing_but_rounding(blocks, device):
    q, k, v, _ = _inputs((1, 2, 70, 45, 32, True, F32), device)
    out, _ = fa1.forward(q, k, v, causal=True, blocks=blocks)
    assert_matches_reference(f"fa1 blocks {blocks}", out, q, k, v, True)


def test_custom_scale(device):
    q, k, v, _ = _inputs((1, 1, 33, 33, 32, False, F32), device)
    assert_matches_reference("fa1 sm_scale", fa1.forward(q, k, v, sm_scale=0.2)[0], q, k, v, False, 0.2)


@pytest.mark.parametrize("blocks", [(8, 16), (16, 24), (0, 16)], ids=["br8", "bc24", "br0"])
def test_bad_blocks_are_refused(blocks, device):
    q, k, v, _ = _inputs((1, 1, 17, 17, 16, False, F32), device)
    with pytest.raises(ValueError, match="power of two >= 16"):
        fa1.forward(q, k, v, blocks=blocks)


@pytest.mark.parametrize("shape", CASES)
def test_gradients_match_float64(shape, device):
    causal = shape[5]
    q, k, v, do = _inputs(shape, device)
    assert_gradients_match(f"fa1 {shape}", lambda *t: fa1.attention(*t, causal=causal), q, k, v, do, causal)


def test_bad_input_is_refused_like_fa2(device):
    q, k, v, _ = _inputs((1, 1, 17, 17, 16, False, F32), device)
    with pytest.raises(TypeError, match="share a dtype"):
        fa1.forward(q, k.half(), v)
