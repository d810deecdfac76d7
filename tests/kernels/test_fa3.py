"""FlashAttention-3 forward (``kernels.attention.fa3``) on a Hopper GPU, and its refusals everywhere.

The kernel is Gluon, which Triton's interpreter does not run, so its results are checked only on an sm_90
GPU (``gpu`` marks); on other machines the argument checks and the refusals run. Outputs and gradients go
through the tolerance policy (``kernels/tolerance.py``) against float64, on odd shapes, every schedule of
the ablation, grouped-query heads, Nq ≠ Nk with rows that see no key, strided and expanded views.
"""

from __future__ import annotations

import pytest
import torch
from attention_checks import PoisonedTorch, assert_gradients_match, assert_matches_reference, random_tensors

from kernels import tolerance
from kernels._runtime import compute_capability
from kernels.attention import fa3, reference

F16, BF16 = torch.float16, torch.bfloat16
HOPPER = torch.cuda.is_available() and compute_capability(torch.device("cuda")) == (9, 0)
hopper = pytest.mark.skipif(not HOPPER, reason="the FA-3 kernel needs a Hopper (sm_90) GPU")
LSE_ATOL = 2e-5  # fp32 logsumexp of O(1)..O(10) scores; the kernel's differ from float64 by ~1e-6


def _lse_reference(q, k, causal):
    qd = q.double()
    kd = k.double().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = qd @ kd.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        rows = torch.arange(q.shape[2], device=q.device)
        scores = scores.masked_fill(reference.causal_mask(rows, q.shape[2], k.shape[2]), float("-inf"))
    return torch.logsumexp(scores, dim=-1)


# (batch, heads, kv_heads, Nq, Nk, head_dim, causal, dtype)
SHAPES = [
    pytest.param((1, 2, 2, 1, 1, 128, False, F16), id="n1"),
    pytest.param((1, 2, 2, 97, 97, 64, True, F16), id="n97-d64-causal"),
    pytest.param((2, 4, 4, 1025, 1025, 128, True, BF16), id="n1025-causal-bf16"),
    pytest.param((1, 4, 4, 1025, 1025, 256, False, F16), id="n1025-d256"),
    pytest.param((1, 2, 2, 100, 300, 128, True, F16), id="nq100-nk300-causal"),
    pytest.param((1, 2, 2, 300, 100, 128, True, BF16), id="nq300-nk100-causal-rows-see-nothing"),
    pytest.param((1, 2, 2, 61, 700, 256, True, BF16), id="nq61-nk700-d256-causal"),
    pytest.param((2, 8, 2, 512, 512, 128, False, BF16), id="gqa-8-over-2"),
    pytest.param((1, 8, 1, 333, 333, 64, True, F16), id="mqa"),
    pytest.param((3, 2, 2, 2048, 2048, 128, True, F16), id="n2048-b3-causal"),
]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("schedule", list(fa3.SCHEDULES))
def test_forward_matches_float64(shape, schedule, monkeypatch):
    """O against float64 attention for every schedule, and the logsumexp (−inf for rows that see no key);
    output buffers come poisoned with NaN, so an element the kernel leaves unwritten fails."""
    b, h, hkv, nq, nk, d, causal, dtype = shape
    q, k, v = random_tensors([(b, h, nq, d), (b, hkv, nk, d), (b, hkv, nk, d)], dtype, "cuda", seed=nq + d)
    monkeypatch.setattr(fa3, "torch", PoisonedTorch())
    out, lse = fa3.forward(q, k, v, causal=causal, schedule=schedule)
    monkeypatch.undo()
    assert_matches_reference(f"fa3[{schedule}]", out, q, k, v, causal)
    ref = _lse_reference(q, k, causal)
    seen = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(lse), seen) and (lse[~seen] == float("-inf")).all()
    torch.testing.assert_close(lse[seen].double(), ref[seen], atol=LSE_ATOL, rtol=0)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize(
    "view",
    ["transposed", "sliced-heads", "expanded-batch", "offset", "unaligned-rows"],
)
def test_views(view):
    """Strided views: ``[B, N, H, d]`` transposed to heads-second, a slice of heads, K/V expanded over the
    batch (stride 0), an offset into a larger buffer, and rows whose stride is not a multiple of 16 bytes
    (copied before TMA sees them). Each gives the same result as its contiguous copy."""
    b, h, n, d = 2, 4, 257, 128
    base = torch.randn(b, n, 2 * h, d + 8, device="cuda", dtype=F16)
    if view == "transposed":
        q = k = v = base[:, :, :h, :d].transpose(1, 2)
    elif view == "sliced-heads":
        q, k, v = (base[:, :, i::2, :d].transpose(1, 2) for i in (0, 1, 1))
    elif view == "expanded-batch":
        q = base[:, :, :h, :d].transpose(1, 2)
        k = v = base[:1, :, h:, :d].transpose(1, 2).expand(b, h, n, d)
    elif view == "offset":
        flat = torch.randn(3 * b * h * n * d + 64, device="cuda", dtype=F16)
        q, k, v = (flat[64 + i * b * h * n * d :][: b * h * n * d].view(b, h, n, d) for i in range(3))
    else:
        q = k = v = base.reshape(b, n, -1)[:, :, 3 : 3 + h * d].reshape(b, n, h, d).transpose(1, 2)
    for causal in (False, True):
        out = fa3.attention(q, k, v, causal=causal)
        expect = fa3.attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=causal)
        assert torch.equal(out, expect), f"{view}, causal={causal}"
        assert_matches_reference(f"fa3 {view}", out, q, k, v, causal)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
def test_backward_through_fa2(causal, dtype):
    """``fa3.attention`` is differentiable: the forward's O and logsumexp feed FA-2's backward."""
    q, k, v, do = random_tensors(
        [(1, 4, 197, 128), (1, 2, 211, 128), (1, 2, 211, 128), (1, 4, 197, 128)], dtype, "cuda", seed=7
    )
    assert_gradients_match("fa3", lambda *t: fa3.attention(*t, causal=causal), q, k, v, do, causal)


@pytest.mark.gpu
@hopper
def test_deterministic_and_capturable():
    """Two calls give the same bits, and a CUDA graph of the call replays to them (no host synchronisation)."""
    q, k, v = random_tensors([(2, 8, 1024, 128)] * 3, BF16, "cuda", seed=3)
    first = fa3.attention(q, k, v, causal=True)
    assert torch.equal(first, fa3.attention(q, k, v, causal=True))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fa3.attention(q, k, v, causal=True)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, first)


@pytest.mark.gpu
@hopper
def test_large_shape_against_sdpa():
    """A benchmark-sized shape (the FA-2 paper setting at N = 8192) against SDPA's math on float64 rows."""
    q, k, v = random_tensors([(2, 16, 8192, 128)] * 3, BF16, "cuda", seed=11)
    out = fa3.attention(q, k, v, causal=True)
    rows = torch.cat([torch.arange(64), torch.arange(8192 - 64, 8192)]).to("cuda")
    ref = reference.reference_attention(q[:1], k[:1], v[:1], True, rows=rows)
    same = reference.naive_attention_rows(q[:1], k[:1], v[:1], rows, True)
    tolerance.assert_close("fa3 N=8192", out[:1, :, rows], ref, same, BF16)


# ---------------------------------------------------------------------------------------------------
# Refusals (every machine)
# ---------------------------------------------------------------------------------------------------


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("head_dim", [32, 80, 96, 192])
def test_other_head_dims_point_at_fa2(head_dim):
    q = torch.zeros(1, 1, 8, head_dim, dtype=F16, device=_device())
    with pytest.raises(NotImplementedError, match="fa2"):
        fa3.forward(q, q, q)


def test_float32_points_at_fa2():
    q = torch.zeros(1, 1, 8, 64, dtype=torch.float32, device=_device())
    with pytest.raises(TypeError, match="fa2"):
        fa3.forward(q, q, q)


def test_causal_must_be_a_bool():
    q = torch.zeros(1, 1, 8, 64, dtype=F16, device=_device())
    with pytest.raises(TypeError, match="causal"):
        fa3.forward(q, q, q, causal="False")


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda q: (q, q[:, :, :, :32], q[:, :, :, :32]), ValueError, "batch or head_dim"),
        (lambda q: (q, q[:, :3], q[:, :3]), ValueError, "divide"),
        (lambda q: (q, q, q.half() if q.dtype == BF16 else q.bfloat16()), TypeError, "share a dtype"),
        (lambda q: (q[0], q[0], q[0]), ValueError, "batch, heads, seq, head_dim"),
    ],
    ids=["head-dim-mismatch", "kv-heads-not-dividing", "mixed-dtypes", "3d"],
)
def test_bad_shapes_and_dtypes(make, error, match):
    q = torch.zeros(2, 4, 8, 64, dtype=F16, device=_device())
    with pytest.raises(error, match=match):
        fa3.forward(*make(q))


def test_refused_off_hopper_or_in_the_interpreter():
    """CPU tensors (Triton's interpreter) and non-Hopper GPUs get a clear requirement, not a compiler crash."""
    if HOPPER:
        pytest.skip("this machine has a Hopper GPU")
    q = torch.zeros(1, 1, 8, 64, dtype=F16, device=_device())
    with pytest.raises(RuntimeError, match="Hopper|compute capability 9.0"):
        fa3.forward(q, q, q)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(block_n=96, num_stages=2), ValueError),
        (dict(block_n=128, num_stages=0), ValueError),
        (dict(block_n=128, num_stages=2, num_consumers=3), ValueError),
        (dict(block_n=128.0, num_stages=2), TypeError),
        (dict(block_n=True, num_stages=2), TypeError),
    ],
)
def test_config_is_validated(kwargs, error):
    with pytest.raises(error, match="FA3Config"):
        fa3.FA3Config(**kwargs)


def test_a_length_of_one_is_not_specialised():
    """Where a length is 1 the launcher runs the kernel's copy whose lengths stay runtime values: Triton would
    fold a 1 into the code, where ptxas miscompiles FP8's packing of P (``fa3_kernels``)."""
    from kernels.attention import fa3_kernels

    general = fa3.kernel_for_lengths(97, 300)
    assert general is fa3_kernels._fa3_fwd_kernel
    assert not {p.name: p.do_not_specialize for p in general.params}["seqlen_k"]
    for lengths in [(1, 1), (1, 300), (97, 1)]:
        kernel = fa3.kernel_for_lengths(*lengths)
        assert kernel is fa3_kernels._fa3_fwd_kernel_any_length and kernel.fn is general.fn
        flags = {p.name: p.do_not_specialize for p in kernel.params}
        assert flags["seqlen_q"] and flags["seqlen_k"], lengths


def test_config_parses_what_it_prints():
    cfg = fa3.FA3Config(64, 3, 1)
    assert fa3.FA3Config.parse(str(cfg)) == cfg
    with pytest.raises(ValueError, match="BLOCK_N"):
        fa3.FA3Config.parse("num_stages=2")


def test_schedule_combinations():
    with pytest.raises(ValueError, match="producer"):
        fa3.Schedule(warp_specialize=False)  # ping-pong needs the producer/consumer split
    with pytest.raises(ValueError, match="producer"):
        fa3.Schedule(warp_specialize=False, pingpong=False, tma=False)
    with pytest.raises(TypeError, match="bool"):
        fa3.Schedule(overlap=1)
    q = torch.zeros(1, 1, 8, 64, dtype=F16, device=_device())
    with pytest.raises(ValueError, match="schedule"):
        fa3.forward(q, q, q, schedule="no-such-schedule")
