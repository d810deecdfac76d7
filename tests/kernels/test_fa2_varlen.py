"""Variable-length batches in FA-2 (``attention_varlen``): packed sequences, no padding computed.

The output and every gradient are compared, under the tolerance policy, with float64 attention computed
sequence by sequence (and plain same-precision PyTorch for the bound), on mixed odd lengths including 0,
causal (bottom-right per sequence) or not, grouped-query, Nq ≠ Nk, fp16 and fp32 in the interpreter.
"""

from __future__ import annotations

import pytest
import torch
from attention_checks import PoisonedTorch, output_and_grads, random_tensors

from kernels import tolerance
from kernels.attention import fa2, reference
from kernels.attention.fa2 import FA2Config

F16, F32, BF16 = torch.float16, torch.float32, torch.bfloat16


def _offsets(lengths, device):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def _packed_inputs(lens_q, lens_k, heads, kv_heads, d, dtype, device, seed=0):
    """q, k, v, do packed as [tokens, heads, d], and the int32 offsets."""
    tq, tk = sum(lens_q), sum(lens_k)
    shapes = [(tq, heads, d), (tk, kv_heads, d), (tk, kv_heads, d), (tq, heads, d)]
    q, k, v, do = random_tensors(shapes, dtype, device, seed)
    return q, k, v, do, _offsets(lens_q, device), _offsets(lens_k, device)


def _per_sequence(dense_fn, lens_q, lens_k, causal, sm_scale=None):
    """A packed attention built from a dense one, one sequence at a time (differentiable)."""

    def packed(q, k, v):
        outs, iq, ik = [], 0, 0
        for nq, nk in zip(lens_q, lens_k, strict=True):
            qs, ks, vs = (t.transpose(0, 1).unsqueeze(0) for t in (q[iq : iq + nq], k[ik : ik + nk], v[ik : ik + nk]))
            if nk == 0:  # no key: zeros, by the kernels' convention for a query that sees nothing
                outs.append(torch.zeros_like(q[iq : iq + nq]))
            else:
                outs.append(dense_fn(qs, ks, vs, causal, sm_scale)[0].transpose(0, 1))
            iq, ik = iq + nq, ik + nk
        return torch.cat(outs, dim=0) if outs else q[:0].clone()

    return packed


def _assert_varlen_matches(name, q, k, v, do, cu_q, cu_k, lens_q, lens_k, causal, fn=None, sm_scale=None):
    """Output and gradients of ``fn`` (default: attention_varlen) against float64, sequence by sequence."""
    fn = fn or (lambda *t: fa2.attention_varlen(*t, cu_q, cu_k, causal=causal, sm_scale=sm_scale))
    ours = output_and_grads(fn, q, k, v, do)
    ref = output_and_grads(
        _per_sequence(reference.reference_attention, lens_q, lens_k, causal, sm_scale), q, k, v, do, torch.float64
    )
    same = output_and_grads(_per_sequence(reference.naive_attention, lens_q, lens_k, causal, sm_scale), q, k, v, do)
    for part, g, r, s in zip(("out", "dq", "dk", "dv"), ours, ref, same, strict=True):
        assert g.shape == r.shape and g.dtype == q.dtype, f"{part} {name}: {g.shape}/{g.dtype}"
        tolerance.assert_close(f"{part} {name}", g, r, s, q.dtype)
    return ours


CASES = [
    # lens_q, lens_k, heads, kv_heads, head_dim, causal, dtype
    pytest.param(([1, 37, 0, 130, 64], [1, 37, 0, 130, 64], 2, 2, 32, True, F16), id="mixed-causal-f16"),
    pytest.param(([1, 37, 0, 130, 64], [1, 37, 0, 130, 64], 1, 1, 59, False, F32), id="mixed-d59-f32"),
    pytest.param(([17, 0, 45, 3, 20], [40, 5, 45, 0, 9], 4, 2, 16, True, F16), id="gqa-nq-ne-nk-causal-f16"),
    pytest.param(([33, 1, 70], [70, 33, 1], 3, 1, 80, False, F32), id="mqa-nq-ne-nk-d80-f32"),
    pytest.param(([50, 19], [64, 33], 2, 1, 24, True, F32), id="nq-lt-nk-causal-f32"),
    pytest.param(
        ([1, 37, 0, 130, 64], [1, 37, 0, 130, 64], 4, 2, 128, True, BF16),
        id="gqa-causal-d128-bf16",
        marks=pytest.mark.gpu,
    ),
    pytest.param(
        ([300, 1, 1000, 77], [300, 513, 1000, 0], 8, 2, 64, False, BF16), id="long-gqa-bf16", marks=pytest.mark.gpu
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_varlen_matches_float64_per_sequence(case, device):
    lens_q, lens_k, h, hk, d, causal, dtype = case
    q, k, v, do, cu_q, cu_k = _packed_inputs(lens_q, lens_k, h, hk, d, dtype, device)
    _assert_varlen_matches(str(case), q, k, v, do, cu_q, cu_k, lens_q, lens_k, causal)


def test_forward_varlen_lse_and_blind_rows(device):
    lens_q, lens_k = [20, 0, 9, 5], [8, 3, 9, 0]  # causal: 12 rows of the first sequence see no key
    q, k, v, _, cu_q, cu_k = _packed_inputs(lens_q, lens_k, 2, 2, 16, F32, device)
    out, lse = fa2.forward_varlen(q, k, v, cu_q, cu_k, causal=True)
    assert out.shape == q.shape and lse.shape == (2, q.shape[0]) and lse.dtype == torch.float32
    iq, ik = 0, 0
    for nq, nk in zip(lens_q, lens_k, strict=True):
        if nq and nk:
            qs, ks, vs = (t.transpose(0, 1).unsqueeze(0) for t in (q[iq : iq + nq], k[ik : ik + nk], v[ik : ik + nk]))
            o_dense, lse_dense = fa2.forward(qs.contiguous(), ks.contiguous(), vs.contiguous(), causal=True)
            torch.testing.assert_close(lse[:, iq : iq + nq], lse_dense[0], atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(out[iq : iq + nq], o_dense[0].transpose(0, 1), atol=1e-6, rtol=1e-6)
        elif nq:
            assert torch.count_nonzero(out[iq : iq + nq]) == 0 and torch.isneginf(lse[:, iq : iq + nq]).all()
        iq, ik = iq + nq, ik + nk
    assert torch.count_nonzero(out[:12]) == 0 and torch.isneginf(lse[:, :12]).all()


def test_equal_lengths_equal_the_dense_kernel(device):
    """Same arithmetic as the dense layout: B sequences of one length give the dense result bit for bit."""
    b, h, n, d = 3, 2, 37, 32
    q, k, v = random_tensors([(b, h, n, d)] * 3, F16, device, seed=1)
    dense, lse_dense = fa2.forward(q, k, v, causal=True)
    packed = [t.transpose(1, 2).reshape(b * n, h, d) for t in (q, k, v)]
    cu = _offsets([n] * b, device)
    out, lse = fa2.forward_varlen(*packed, cu, cu, causal=True)
    assert torch.equal(out, dense.transpose(1, 2).reshape(b * n, h, d))
    assert torch.equal(lse, lse_dense.permute(1, 0, 2).reshape(h, b * n))


def test_strided_packed_inputs(device):
    """Tokens of a wider buffer (q, k, v sliced out of one fused QKV tensor): any strides are taken."""
    lens = [5, 40, 17]
    qkv = random_tensors([(sum(lens), 3, 2, 24)], F32, device, seed=2)[0]
    q, k, v = qkv.unbind(1)
    assert not q.is_contiguous()
    do = random_tensors([(sum(lens), 2, 24)], F32, device, seed=3)[0]
    cu = _offsets(lens, device)
    _assert_varlen_matches("fused qkv", q, k, v, do, cu, cu, lens, lens, True)


def test_eager_rescale_and_pinned_tiles(device, monkeypatch):
    lens_q, lens_k = [45, 0, 83, 16], [83, 7, 45, 16]
    q, k, v, do, cu_q, cu_k = _packed_inputs(lens_q, lens_k, 2, 1, 24, F32, device, seed=4)
    monkeypatch.setenv(fa2.BWD_CONFIG_ENV, str(fa2.FA2BwdConfig(FA2Config(32, 16, 4, 1), FA2Config(16, 32, 4, 1))))
    fwd_config = FA2Config(32, 16, 4, 1)

    def pinned(*t):
        return fa2.attention_varlen(*t, cu_q, cu_k, causal=True)

    _assert_varlen_matches("pinned tiles", q, k, v, do, cu_q, cu_k, lens_q, lens_k, True, fn=pinned)
    lazy, _ = fa2.forward_varlen(q, k, v, cu_q, cu_k, causal=True, config=fwd_config)
    assert fa2.last_config() == fwd_config
    eager, _ = fa2.forward_varlen(q, k, v, cu_q, cu_k, causal=True, config=fwd_config, rescale="eager")
    torch.testing.assert_close(eager, lazy, atol=1e-5, rtol=1e-5)


def test_custom_scale_and_larger_max_seqlen(device):
    lens_q, lens_k = [9, 30], [30, 9]
    q, k, v, do, cu_q, cu_k = _packed_inputs(lens_q, lens_k, 2, 2, 16, F32, device, seed=5)

    def fn(*t):  # max_seqlen larger than needed: more programs, which return at once
        return fa2.attention_varlen(*t, cu_q, cu_k, 64, 100, causal=True, sm_scale=0.3)

    _assert_varlen_matches("sm_scale=0.3", q, k, v, do, cu_q, cu_k, lens_q, lens_k, True, fn=fn, sm_scale=0.3)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_every_output_and_gradient_written(causal, device, monkeypatch):
    lens_q, lens_k = [20, 0, 9, 5, 33], [8, 3, 9, 0, 33]
    q, k, v, do, cu_q, cu_k = _packed_inputs(lens_q, lens_k, 2, 1, 16, F16, device, seed=6)
    clean_out, clean_lse = fa2.forward_varlen(q, k, v, cu_q, cu_k, causal=causal)
    clean = fa2.backward_varlen(do, q, k, v, clean_out, clean_lse, cu_q, cu_k, causal=causal)
    monkeypatch.setattr(fa2, "torch", PoisonedTorch())
    out, lse = fa2.forward_varlen(q, k, v, cu_q, cu_k, causal=causal)
    grads = fa2.backward_varlen(do, q, k, v, out, lse, cu_q, cu_k, causal=causal)
    monkeypatch.undo()
    for name, a, b in zip(
        ("out", "lse", "dq", "dk", "dv"), (out, lse, *grads), (clean_out, clean_lse, *clean), strict=True
    ):
        assert not torch.isnan(a).any(), f"{name}: elements left unwritten (still NaN)"
        assert torch.equal(a, b), name


def test_backward_is_deterministic(device):
    lens = [1, 37, 0, 64]
    q, k, v, do, cu, _ = _packed_inputs(lens, lens, 4, 2, 32, F16, device, seed=7)
    first = output_and_grads(lambda *t: fa2.attention_varlen(*t, cu, cu, causal=True), q, k, v, do)
    second = output_and_grads(lambda *t: fa2.attention_varlen(*t, cu, cu, causal=True), q, k, v, do)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "lens_q, lens_k",
    [
        pytest.param([], [], id="no-sequence"),
        pytest.param([0, 0], [4, 0], id="no-query-token"),
        pytest.param([3, 5], [0, 0], id="no-key-token"),
    ],
)
def test_empty_batches(lens_q, lens_k, device):
    q, k, v, do, cu_q, cu_k = _packed_inputs(lens_q, lens_k, 2, 2, 16, F32, device)
    out, lse = fa2.forward_varlen(q, k, v, cu_q, cu_k, causal=True)
    assert out.shape == q.shape and lse.shape == (2, q.shape[0])
    assert torch.count_nonzero(out) == 0 and torch.isneginf(lse).all()
    dq, dk, dv = fa2.backward_varlen(do, q, k, v, out, lse, cu_q, cu_k, causal=True)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert not any(torch.count_nonzero(g) for g in (dq, dk, dv))


# ---------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------


def _bad(device, *, cu_q=None, cu_k=None, q_shape=(10, 2, 16), k_shape=(12, 2, 16), max_q=None, max_k=None):
    q = torch.zeros(q_shape, dtype=F16, device=device)
    k = torch.zeros(k_shape, dtype=F16, device=device)
    cu_q = _offsets([4, 6], device) if cu_q is None else cu_q
    cu_k = _offsets([5, 7], device) if cu_k is None else cu_k
    return (q, k, k.clone(), cu_q, cu_k, max_q, max_k)


def _i32(values, device):
    return torch.tensor(values, dtype=torch.int32, device=device)


BAD = [
    pytest.param(
        lambda d: _bad(d, cu_q=_offsets([4, 6], d).long()),
        TypeError,
        "cu_seqlens_q must have dtype torch.int32",
        id="int64-offsets",
    ),
    pytest.param(
        lambda d: _bad(d, cu_k=[0, 5, 12]), TypeError, "cu_seqlens_k must be a torch.Tensor", id="list-offsets"
    ),
    pytest.param(lambda d: _bad(d, cu_q=_i32([[0, 4, 10]], d)), ValueError, "must be 1-D", id="2d-offsets"),
    pytest.param(lambda d: _bad(d, cu_q=_i32([], d)), ValueError, "must be 1-D with batch", id="empty-offsets"),
    pytest.param(
        lambda d: _bad(d, cu_k=_i32([0, 5, 5, 12], d)),
        ValueError,
        "both have batch \\+ 1 entries",
        id="different-batch",
    ),
    pytest.param(lambda d: _bad(d, cu_q=_i32([1, 4, 10], d)), ValueError, "must start at 0, got 1", id="not-from-0"),
    pytest.param(
        lambda d: _bad(d, cu_q=_i32([0, 7, 4, 10], d), cu_k=_i32([0, 5, 5, 12], d)),
        ValueError,
        r"non-decreasing: cu_seqlens_q\[2\] = 4 < cu_seqlens_q\[1\] = 7",
        id="decreasing",
    ),
    pytest.param(
        lambda d: _bad(d, cu_q=_i32([0, 4, 9], d)), ValueError, "ends at 9, but q has 10 tokens", id="short-of-total"
    ),
    pytest.param(
        lambda d: _bad(d, cu_k=_i32([0, 5, 13], d)), ValueError, "ends at 13, but k has 12 tokens", id="past-total"
    ),
    pytest.param(
        lambda d: _bad(d, cu_q=_offsets([4, 6], "meta")),
        ValueError,
        "cu_seqlens_q is on meta but q is on",
        id="device-mismatch",
    ),
    pytest.param(
        lambda d: _bad(d, q_shape=(1, 10, 2, 16)), ValueError, r"\[total_tokens, heads, head_dim\]", id="4d-q"
    ),
    pytest.param(
        lambda d: _bad(d, k_shape=(12, 2, 32)), ValueError, "does not match q .* in head_dim", id="head-dim-mismatch"
    ),
    pytest.param(lambda d: _bad(d, q_shape=(10, 3, 16)), ValueError, "must divide q's 3", id="heads-not-dividing"),
    pytest.param(
        lambda d: _bad(d, max_q=5),
        ValueError,
        r"max_seqlen_q=5 is shorter than the longest sequence in the batch \(6\)",
        id="max-too-small",
    ),
    pytest.param(lambda d: _bad(d, max_k=7.0), TypeError, "max_seqlen_k must be an int", id="max-float"),
]


@pytest.mark.parametrize("make, error, match", BAD)
def test_bad_input_raises(make, error, match, device):
    q, k, v, cu_q, cu_k, max_q, max_k = make(device)
    with pytest.raises(error, match=match):
        fa2.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k)
    with pytest.raises(error, match=match):
        fa2.forward_varlen(q, k, v, cu_q, cu_k, max_q, max_k)


def test_offsets_rechecked_after_an_in_place_change(device):
    """On a GPU the offsets read are remembered per tensor; an in-place write must invalidate that copy."""
    q, k, v, cu_q, cu_k, _, _ = _bad(device)
    fa2.forward_varlen(q, k, v, cu_q, cu_k)
    cu_q[1] = 11  # now decreasing
    with pytest.raises(ValueError, match="non-decreasing"):
        fa2.forward_varlen(q, k, v, cu_q, cu_k)


def test_backward_varlen_refuses_mis_shaped_lse(device):
    q, k, v, do, cu_q, cu_k = _packed_inputs([4, 6], [5, 7], 2, 2, 16, F32, device)
    out, lse = fa2.forward_varlen(q, k, v, cu_q, cu_k)
    with pytest.raises(ValueError, match="lse has shape"):
        fa2.backward_varlen(do, q, k, v, out, lse.t(), cu_q, cu_k)
