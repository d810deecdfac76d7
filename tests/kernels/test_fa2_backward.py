"""FlashAttention-2 backward: gradients of q, k, v against float64, under the tolerance policy.

The rule (kernels/tolerance.py): each gradient's max-abs error against float64 autograd is at most
twice that of plain PyTorch autograd at the same precision, plus a per-dtype floor. Odd shapes,
seqlen_q ≠ seqlen_k both ways (with the bottom-right causal mask: rows that see no key get zero
gradients), non-power-of-two head dims; fp16/fp32 in the interpreter, bf16 on a GPU.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from attention_checks import assert_gradients_match, output_and_grads, random_tensors

from kernels.attention import fa2

F16, F32, BF16 = torch.float16, torch.float32, torch.bfloat16


@dataclasses.dataclass(frozen=True)
class Case:
    batch: int
    heads: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    causal: bool
    dtype: torch.dtype


def _case(id_, *fields, marks=()):
    return pytest.param(Case(*fields), id=id_, marks=marks)


CASES = [
    _case("n17-d16-f32", 1, 2, 17, 17, 16, False, F32),
    _case("n47-d32-causal-f32", 1, 2, 47, 47, 32, True, F32),
    _case("nq33-nk70-d59-causal-f16", 2, 1, 33, 70, 59, True, F16),
    _case("nq70-nk33-d16-causal-f32", 1, 1, 70, 33, 16, True, F32),  # 37 rows see no key
    _case("n97-d64-f16", 1, 2, 97, 97, 64, False, F16),
    _case("n65-d80-causal-f16", 1, 1, 65, 65, 80, True, F16),
    _case("n33-d111-f32", 1, 1, 33, 33, 111, False, F32),
    _case("n1-d16-f16", 1, 1, 1, 1, 16, False, F16),
    _case("n130-d128-causal-bf16", 2, 2, 130, 130, 128, True, BF16, marks=pytest.mark.gpu),
    _case("nq97-nk200-d96-bf16", 1, 4, 97, 200, 96, False, BF16, marks=pytest.mark.gpu),
    _case("n257-d256-causal-f16", 1, 2, 257, 257, 256, True, F16, marks=pytest.mark.gpu),
]


def _inputs(case: Case, device: str, seed: int = 0):
    shapes = [(case.batch, case.heads, n, case.head_dim) for n in (case.seqlen_q, case.seqlen_k, case.seqlen_k)]
    return random_tensors([*shapes, shapes[0]], case.dtype, device, seed)  # q, k, v, do


def _grads(fn, q, k, v, do):
    return output_and_grads(fn, q, k, v, do)[1:]


@pytest.mark.parametrize("case", CASES)
def test_gradients_match_float64(case: Case, device):
    q, k, v, do = _inputs(case, device)
    assert_gradients_match(str(case), lambda *t: fa2.attention(*t, causal=case.causal), q, k, v, do, case.causal)


def test_rows_that_see_no_key_get_zero_gradient(device):
    case = Case(1, 1, 20, 8, 16, True, F32)  # bottom-right alignment: rows 0..11 see nothing
    q, k, v, do = _inputs(case, device)
    dq, _, _ = _grads(lambda *t: fa2.attention(*t, causal=True), q, k, v, do)
    assert torch.count_nonzero(dq[:, :, :12]) == 0
    assert torch.count_nonzero(dq[:, :, 12:]) > 0


def test_backward_is_deterministic(device):
    case = Case(2, 2, 65, 65, 32, True, F16)
    q, k, v, do = _inputs(case, device)
    first = _grads(lambda *t: fa2.attention(*t, causal=True), q, k, v, do)
    second = _grads(lambda *t: fa2.attention(*t, causal=True), q, k, v, do)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


def test_custom_scale_and_strided_inputs(device):
    case = Case(1, 2, 33, 33, 32, False, F32)
    q, k, v, do = _inputs(case, device)
    # [B, N, H, d] memory viewed as [B, H, N, d]: the kernels take any strides
    q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    assert not q.is_contiguous()
    assert_gradients_match("strided, sm_scale=0.3", lambda *t: fa2.attention(*t, sm_scale=0.3), q, k, v, do,
                           sm_scale=0.3)  # fmt: skip


def test_backward_refuses_a_mis_shaped_grad(device):
    case = Case(1, 1, 17, 17, 16, False, F32)
    q, k, v, do = _inputs(case, device)
    out, lse = fa2.forward(q, k, v)
    with pytest.raises(ValueError, match="grad_out has shape"):
        fa2.backward(do[:, :, :5], q, k, v, out, lse)
