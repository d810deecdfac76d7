"""Grouped-query and multi-query attention in the FA-2 kernels: K/V heads dividing the query heads.

Forward and every gradient against float64 (K/V expanded per group in the reference), under the
tolerance policy; the dK/dV of a shared K/V head sum the contributions of its whole group.
"""

from __future__ import annotations

import pytest
import torch
from attention_checks import assert_gradients_match, output_and_grads, random_tensors

from kernels.attention import fa1, fa2

F16, F32, BF16 = torch.float16, torch.float32, torch.bfloat16

CASES = [
    pytest.param((2, 4, 2, 33, 33, 32, False, F32), id="gqa-h4-kv2-f32"),
    pytest.param((1, 6, 1, 47, 70, 59, True, F16), id="mqa-h6-kv1-causal-f16"),
    pytest.param((1, 8, 2, 70, 33, 16, True, F32), id="gqa-h8-kv2-nq-gt-nk-causal-f32"),
    pytest.param((1, 3, 3, 17, 17, 16, False, F16), id="mha-h3-kv3-f16"),
    pytest.param((2, 8, 2, 130, 130, 128, True, BF16), id="gqa-h8-kv2-causal-bf16", marks=pytest.mark.gpu),
]


def _inputs(shape, device, seed=0):
    b, h, hk, nq, nk, d, _, dtype = shape
    return random_tensors([(b, h, nq, d), (b, hk, nk, d), (b, hk, nk, d), (b, h, nq, d)], dtype, device, seed)


@pytest.mark.parametrize("shape", CASES)
def test_grouped_query_forward_and_gradients(shape, device):
    causal = shape[6]
    q, k, v, do = _inputs(shape, device)
    assert_gradients_match(str(shape), lambda *t: fa2.attention(*t, causal=causal), q, k, v, do, causal)


def test_grouped_query_equals_explicitly_repeated_heads(device):
    """Sharing a K/V head is the same as repeating it: outputs agree to rounding, dK/dV sum the group."""
    q, k, v, do = _inputs((1, 4, 2, 33, 33, 16, True, F32), device)
    shared = output_and_grads(lambda *t: fa2.attention(*t, causal=True), q, k, v, do)
    rep = [x.repeat_interleave(2, dim=1) for x in (k, v)]
    repeated = output_and_grads(lambda *t: fa2.attention(*t, causal=True), q, *rep, do)
    assert torch.allclose(shared[0], repeated[0], atol=1e-6)
    for g_shared, g_rep in zip(shared[2:], repeated[2:], strict=True):
        summed = g_rep.reshape(g_rep.shape[0], 2, 2, *g_rep.shape[2:]).sum(dim=2)
        assert torch.allclose(g_shared, summed, atol=1e-5)


@pytest.mark.parametrize("kv_heads", [3, 0], ids=["3-of-4", "0"])
def test_kv_heads_must_divide_query_heads(kv_heads, device):
    q = torch.randn(1, 4, 17, 16, device=device)
    k = torch.randn(1, kv_heads, 17, 16, device=device)
    with pytest.raises(ValueError, match="must divide q's 4"):
        fa2.forward(q, k, k)


def test_fa1_refuses_grouped_query(device):
    q, k, v, _ = _inputs((1, 4, 2, 17, 17, 16, False, F32), device)
    with pytest.raises(ValueError, match="no grouped-query"):
        fa1.forward(q, k, v)
