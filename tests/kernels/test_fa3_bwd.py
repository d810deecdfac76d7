"""FlashAttention-3's backward (``kernels.attention.fa3_bwd``): its algorithm on the CPU, the kernel on a GPU.

The Gluon kernel does not run in Triton's interpreter. On every machine: the tile plan (which query tiles a
key block walks, which are masked) against a brute-force mask; the preprocess and the dQ conversion (Triton
kernels, in the interpreter here); and ``fa3_bwd_emulate.emulate``, the kernel's tile algorithm step for step
in PyTorch, against float64 autograd under the tolerance policy on odd shapes (with a mutant tile plan that
must fail it). On a Hopper GPU (``gpu`` marks, not yet run): ``fa3.attention(..., backward="fa3")`` against
float64 on the same kinds of shapes for every schedule, the kernel against the emulation, 20 bit-identical runs
of the deterministic mode, and a CUDA graph of the forward and the backward.
"""

from __future__ import annotations

import pytest
import torch
from attention_checks import PoisonedTorch, assert_gradients_match, output_and_grads, random_tensors

from kernels import tolerance
from kernels._runtime import compute_capability
from kernels.attention import fa3, fa3_bwd, fa3_bwd_emulate, reference

F16, BF16 = torch.float16, torch.bfloat16
HOPPER = torch.cuda.is_available() and compute_capability(torch.device("cuda")) == (9, 0)
hopper = pytest.mark.skipif(not HOPPER, reason="the FA-3 backward needs a Hopper (sm_90) GPU")


def _forward64(q, k, v, causal):
    """(out in q's dtype, lse float32) of float64 attention: what a forward hands the backward."""
    group = q.shape[1] // k.shape[1]
    qd, kd, vd = q.double(), k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    s = qd @ kd.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        rows = torch.arange(q.shape[2], device=q.device)
        s = s.masked_fill(reference.causal_mask(rows, q.shape[2], k.shape[2]), float("-inf"))
    lse = torch.logsumexp(s, -1)
    out = torch.nan_to_num(torch.softmax(s, -1)) @ vd
    return out.to(q.dtype), lse.float()


def _assert_grads(name, got, q, k, v, do, causal):
    ref = output_and_grads(lambda *t: reference.reference_attention(*t, causal), q, k, v, do, torch.float64)
    same = output_and_grads(lambda *t: reference.naive_attention(*t, causal), q, k, v, do)
    for part, g, r, s in zip(("dq", "dk", "dv"), got, ref[1:], same[1:], strict=True):
        assert g.shape == r.shape and g.dtype == q.dtype, f"{part} {name}: {g.shape}/{g.dtype}"
        tolerance.assert_close(f"{part} {name}", g, r, s, q.dtype)


# ---------------------------------------------------------------------------------------------------
# The tile plan
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block_m, block_n", [(64, 128), (128, 128), (64, 64)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_tile_plan_covers_every_visible_pair_and_masks_where_needed(block_m, block_n, causal):
    """For key block j: tiles before i_lo hold no visible (key, query) pair; tiles from i_mid on hold only
    visible pairs of real keys (no mask needed); between, the masked loop. Lengths around the tiles' edges,
    Nq ≠ Nk both ways."""
    lengths = [1, 2, 63, 64, 65, 127, 128, 129, 200, 257, 300]
    for nq in lengths:
        for nk in lengths:
            for j in range(-(-nk // block_n)):
                i_lo, i_mid, n_m = fa3_bwd.tile_range(j, nq, nk, block_m, causal, block_n)
                assert 0 <= i_lo <= i_mid <= n_m == -(-nq // block_m), (nq, nk, j)
                keys = torch.arange(j * block_n, (j + 1) * block_n)[:, None]
                for i in range(n_m):
                    queries = torch.arange(i * block_m, min((i + 1) * block_m, nq))[None, :]
                    seen = (keys < nk) & ((keys <= queries + nk - nq) if causal else True)
                    if i < i_lo:
                        assert not seen.any(), (nq, nk, j, i)
                    if i >= i_mid:
                        assert seen.all(), (nq, nk, j, i)


# ---------------------------------------------------------------------------------------------------
# The preprocess and the conversion (Triton: the interpreter on a CPU)
# ---------------------------------------------------------------------------------------------------


def test_preprocess_rows_and_zeroed_buffers(device):
    """Δ = rowsum(dO ∘ O) in fp32 and the logsumexp times log2 e for real rows; past Nq Δ = 0 and +inf, and
    +inf where a row saw no key (lse = -inf): P = 0 there. The accumulator and the semaphores come zeroed.
    O and dO as strided views."""
    b, h, n, d = 2, 3, 70, 64
    base_o, base_do = random_tensors([(b, n, h, d + 16)] * 2, F16, device, seed=1)
    out, do = base_o[..., :d].transpose(1, 2), base_do[..., 8 : 8 + d].transpose(1, 2)
    lse = random_tensors([(b, h, n)], torch.float32, device, seed=2)[0]
    lse[0, 1, 5] = float("-inf")
    work = fa3_bwd.prepare(do, out, out, lse, 64, deterministic=True)
    assert work.q_rows == 128 and work.rows.shape == (2, b * h, 128)
    lse2, delta = work.rows[0].view(b, h, 128), work.rows[1].view(b, h, 128)
    torch.testing.assert_close(delta[..., :n], (out.float() * do.float()).sum(-1), rtol=1e-5, atol=1e-5)
    expect = torch.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    torch.testing.assert_close(lse2[..., :n], expect)
    assert (delta[..., n:] == 0).all() and (lse2[..., n:] == float("inf")).all()
    assert (work.dq_acc == 0).all() and work.dq_acc.shape == (b * h, 128, d)
    assert (work.sem == 0).all() and work.sem.shape == (b * h, 2, fa3_bwd.NUM_CONSUMERS)


def test_dq_conversion_scales_and_drops_the_padding(device):
    b, h, n, d = 1, 2, 70, 64
    work = fa3_bwd.Work(
        torch.zeros(2, b * h, 128, device=device),
        random_tensors([(b * h, 128, d)], torch.float32, device, seed=3)[0],
        torch.zeros(1, device=device, dtype=torch.int32),
        128,
    )
    dq = torch.full((b, h, n, d), float("nan"), device=device, dtype=F16)
    fa3_bwd.finish(work, dq, 0.125, 64)
    torch.testing.assert_close(dq, (work.dq_acc.view(b, h, 128, d)[:, :, :n] * 0.125).to(F16))


# ---------------------------------------------------------------------------------------------------
# The tile algorithm, emulated (every machine)
# ---------------------------------------------------------------------------------------------------

# (batch, heads, kv_heads, Nq, Nk, head_dim, causal, dtype)
EMULATED = [
    pytest.param((1, 2, 2, 1, 1, 64, False, F16), id="n1"),
    pytest.param((1, 2, 2, 1, 1, 128, True, F16), id="n1-causal-d128"),
    pytest.param((1, 2, 2, 97, 97, 64, True, F16), id="n97-causal"),
    pytest.param((1, 2, 2, 97, 97, 128, False, BF16), id="n97-d128-bf16"),
    pytest.param((1, 2, 2, 100, 300, 128, True, F16), id="nq100-nk300-causal"),
    pytest.param((1, 2, 2, 300, 100, 64, True, F16), id="nq300-nk100-causal-rows-see-nothing"),
    pytest.param((1, 2, 2, 257, 130, 128, False, F16), id="nq257-nk130"),
    pytest.param((1, 8, 2, 150, 150, 64, True, F16), id="gqa-8-over-2-causal"),
    pytest.param((2, 4, 1, 70, 260, 128, False, BF16), id="mqa-b2-bf16"),
    pytest.param((1, 2, 2, 97, 97, 256, True, F16), id="n97-d256-causal"),
    pytest.param((1, 4, 2, 130, 70, 256, False, BF16), id="nq130-nk70-d256-gqa-bf16"),
]


@pytest.mark.parametrize("shape", EMULATED)
def test_emulated_tiles_match_float64(shape, device):
    """The kernel's algorithm (its tiles, walk, masks, roundings and dQ accumulation) within the policy's
    bound of float64 autograd, for every gradient; dO a strided view."""
    b, h, hk, nq, nk, d, causal, dtype = shape
    q, k, v = random_tensors([(b, h, nq, d), (b, hk, nk, d), (b, hk, nk, d)], dtype, device, seed=nq + nk + d)
    (do_base,) = random_tensors([(b, nq, h, d + 8)], dtype, device, seed=5)
    do = do_base[..., :d].transpose(1, 2)
    out, lse = _forward64(q, k, v, causal)
    got = fa3_bwd_emulate.emulate(do, q, k, v, out, lse, causal)
    _assert_grads("emulated fa3 backward", got, q, k, v, do, causal)


def test_emulated_tiles_with_128_row_tiles(device):
    """BLOCK_M = 128 (dQ's tile split by rows between the consumers): the same bound."""
    q, k, v, do = random_tensors([(1, 2, 200, 64), (1, 2, 150, 64), (1, 2, 150, 64), (1, 2, 200, 64)], F16, device)
    out, lse = _forward64(q, k, v, True)
    got = fa3_bwd_emulate.emulate(do, q, k, v, out, lse, True, block_m=128)
    _assert_grads("emulated fa3 backward, 128-row tiles", got, q, k, v, do, True)


def test_the_order_of_dq_adds_moves_only_its_last_bits(device):
    """dQ's adds in another key-block order (the default kernel's are in no fixed order) give dQ within
    rounding of the ascending order's (the deterministic kernel's), and the same dK and dV bits."""
    q, k, v, do = random_tensors([(1, 2, 90, 64), (1, 2, 500, 64), (1, 2, 500, 64), (1, 2, 90, 64)], F16, device)
    out, lse = _forward64(q, k, v, False)
    ascending = fa3_bwd_emulate.emulate(do, q, k, v, out, lse, False)
    shuffled = fa3_bwd_emulate.emulate(do, q, k, v, out, lse, False, key_order=[2, 0, 3, 1])
    torch.testing.assert_close(shuffled[0], ascending[0], rtol=2e-3, atol=2e-3)
    assert torch.equal(shuffled[1], ascending[1]) and torch.equal(shuffled[2], ascending[2])
    with pytest.raises(ValueError, match="permutation"):
        fa3_bwd_emulate.emulate(do, q, k, v, out, lse, False, key_order=[0, 0, 1, 2])


def test_a_wrong_tile_plan_fails_the_check(device, monkeypatch):
    """The check above can fail: a plan that skips the first visible query tile of every key block (as an
    off-by-one in i_lo would) gives gradients outside the bound."""
    q, k, v, do = random_tensors([(1, 2, 200, 64), (1, 2, 200, 64), (1, 2, 200, 64), (1, 2, 200, 64)], F16, device)
    out, lse = _forward64(q, k, v, True)
    right = fa3_bwd.tile_range

    def off_by_one(j, seqlen_q, seqlen_k, block_m, causal, block_n):
        i_lo, i_mid, n_m = right(j, seqlen_q, seqlen_k, block_m, causal, block_n)
        return min(i_lo + 1, n_m), max(i_mid, min(i_lo + 1, n_m)), n_m

    monkeypatch.setattr(fa3_bwd, "tile_range", off_by_one)
    got = fa3_bwd_emulate.emulate(do, q, k, v, out, lse, True)
    with pytest.raises(AssertionError, match="max-abs error"):
        _assert_grads("mutant", got, q, k, v, do, True)


# ---------------------------------------------------------------------------------------------------
# Refusals (every machine)
# ---------------------------------------------------------------------------------------------------


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(backward="fa4"), ValueError, "backward"),
        (dict(backward="fa3", deterministic="yes"), TypeError, "deterministic"),
        (dict(backward="fa3", backward_schedule="no-such-schedule"), ValueError, "schedule"),
        (dict(backward="fa3", backward_schedule=3), TypeError, "schedule"),
    ],
    ids=["backward", "deterministic", "schedule-name", "schedule-type"],
)
def test_attention_checks_its_backward_arguments(kwargs, error, match):
    """Refused when the forward is called (the backward runs later, far from the call that chose it)."""
    q = torch.zeros(1, 1, 8, 64, dtype=F16, device=_device(), requires_grad=True)
    with pytest.raises(error, match=match):
        fa3.attention(q, q, q, **kwargs)


def test_unsupported_head_dims_and_schedules_point_at_fa2():
    """Head dims the forward runs but the backward does not, and d = 256 on the schedules its head-dim split
    has no code for: refused when the forward is called."""
    q = torch.zeros(1, 1, 8, 256, dtype=F16, device=_device(), requires_grad=True)
    for schedule in ("no-warp-specialize", "dq-writer"):
        with pytest.raises(NotImplementedError, match="fa2"):
            fa3.attention(q, q, q, backward="fa3", backward_schedule=schedule)
    q = torch.zeros(1, 1, 8, 96, dtype=F16, device=_device(), requires_grad=True)
    with pytest.raises(NotImplementedError, match="fa2"):
        fa3_bwd.backward(q, q, q, q, q, torch.zeros(1, 1, 8))


def test_backward_refuses_bad_side_inputs():
    q = torch.zeros(1, 2, 8, 64, dtype=F16, device=_device())
    lse = torch.zeros(1, 2, 8, device=q.device)
    with pytest.raises(ValueError, match="grad_out"):
        fa3_bwd.backward(q[:, :1], q, q, q, q, lse)
    with pytest.raises(TypeError, match="lse"):
        fa3_bwd.backward(q, q, q, q, q, lse.half())
    with pytest.raises(TypeError, match="float16 and bfloat16"):
        fa3_bwd.backward(q.float(), q.float(), q.float(), q.float(), q.float(), lse)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(block_m=32, num_stages=2), ValueError),
        (dict(block_m=64, num_stages=0), ValueError),
        (dict(block_m=64.0, num_stages=2), TypeError),
        (dict(block_m=True, num_stages=2), TypeError),
        (dict(block_m=64, num_stages=2, block_n=32), ValueError),
        (dict(block_m=128, num_stages=2, block_n=64), ValueError),
    ],
)
def test_config_is_validated(kwargs, error):
    with pytest.raises(error, match="BwdConfig"):
        fa3_bwd.BwdConfig(**kwargs)


def test_schedule_combinations():
    with pytest.raises(ValueError, match="producer"):
        fa3_bwd.BwdSchedule(warp_specialize=False, tma=False)
    with pytest.raises(ValueError, match="producer"):
        fa3_bwd.BwdSchedule(warp_specialize=False, dq_writer=True)
    with pytest.raises(TypeError, match="bool"):
        fa3_bwd.BwdSchedule(tma=1)
    assert set(fa3_bwd.SCHEDULES) == {"fa3", "no-warp-specialize", "no-tma", "dq-writer"}


# ---------------------------------------------------------------------------------------------------
# On a Hopper GPU (not yet run: the first GPU session runs these before the backward is timed)
# ---------------------------------------------------------------------------------------------------

# (batch, heads, kv_heads, Nq, Nk, head_dim, causal, dtype)
GPU_SHAPES = [
    pytest.param((1, 2, 2, 1, 1, 128, False, F16), id="n1"),
    pytest.param((1, 2, 2, 1, 1, 64, True, BF16), id="n1-causal-d64"),
    pytest.param((1, 2, 2, 97, 97, 64, True, F16), id="n97-d64-causal"),
    pytest.param((2, 4, 4, 1025, 1025, 128, True, BF16), id="n1025-causal-bf16"),
    pytest.param((1, 4, 4, 1025, 1025, 64, False, F16), id="n1025-d64"),
    pytest.param((1, 2, 2, 100, 300, 128, True, F16), id="nq100-nk300-causal"),
    pytest.param((1, 2, 2, 300, 100, 128, True, BF16), id="nq300-nk100-causal-rows-see-nothing"),
    pytest.param((1, 2, 2, 61, 700, 64, False, BF16), id="nq61-nk700"),
    pytest.param((2, 8, 2, 512, 512, 128, False, BF16), id="gqa-8-over-2"),
    pytest.param((1, 8, 2, 333, 333, 64, True, F16), id="gqa-8-over-2-causal"),
    pytest.param((1, 8, 1, 257, 257, 128, True, F16), id="mqa"),
    pytest.param((3, 2, 2, 2048, 2048, 128, True, F16), id="n2048-b3-causal"),
    pytest.param((1, 4, 4, 1025, 1025, 256, False, F16), id="n1025-d256"),
    pytest.param((1, 2, 2, 61, 700, 256, True, BF16), id="nq61-nk700-d256-causal"),
    pytest.param((1, 8, 2, 300, 300, 256, True, BF16), id="gqa-8-over-2-d256-causal"),
]


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("shape", GPU_SHAPES)
@pytest.mark.parametrize("schedule", list(fa3_bwd.SCHEDULES))
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_gradients_match_float64(shape, schedule, deterministic):
    """dq, dk, dv of ``fa3.attention(..., backward="fa3")`` against float64 autograd under the policy of
    FA-2's backward (and the output), with dO a strided view."""
    b, h, hk, nq, nk, d, causal, dtype = shape
    sched = fa3_bwd.SCHEDULES[schedule]
    if fa3_bwd.default_config(d).split_d and (not sched.warp_specialize or sched.dq_writer):
        pytest.skip(f"d = {d}'s head-dim split has no {schedule} schedule (refused, tested on every machine)")
    q, k, v = random_tensors([(b, h, nq, d), (b, hk, nk, d), (b, hk, nk, d)], dtype, "cuda", seed=nq + d)
    (do_base,) = random_tensors([(b, nq, h, d + 8)], dtype, "cuda", seed=9)
    do = do_base[..., :d].transpose(1, 2)

    def fn(*t):
        return fa3.attention(*t, causal=causal, backward="fa3", deterministic=deterministic, backward_schedule=schedule)

    assert_gradients_match(f"fa3 backward [{schedule}]", fn, q, k, v, do, causal)


@pytest.mark.gpu
@hopper
def test_every_gradient_element_is_written(monkeypatch):
    """The kernel's outputs come poisoned with NaN: an element it should write but does not fails."""
    q, k, v, do = random_tensors([(1, 4, 300, 128), (1, 2, 200, 128), (1, 2, 200, 128), (1, 4, 300, 128)], F16, "cuda")
    out, lse = fa3.forward(q, k, v, causal=True)
    monkeypatch.setattr(fa3_bwd, "torch", PoisonedTorch())
    got = fa3_bwd.backward(do, q, k, v, out, lse, causal=True)
    monkeypatch.undo()
    _assert_grads("fa3 backward, poisoned buffers", got, q, k, v, do, True)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_kernel_matches_its_emulation(causal, head_dim):
    """The kernel against ``fa3_bwd_emulate`` on the same O and logsumexp: the same roundings, so they differ
    only by the order of the fp32 additions inside the products (a few units in dtype's last place)."""
    d = head_dim
    q, k, v, do = random_tensors([(2, 4, 333, d), (2, 2, 333, d), (2, 2, 333, d), (2, 4, 333, d)], F16, "cuda")
    out, lse = fa3.forward(q, k, v, causal=causal)
    got = fa3_bwd.backward(do, q, k, v, out, lse, causal=causal, deterministic=True)
    want = fa3_bwd_emulate.emulate(do, q, k, v, out, lse, causal)
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-2, atol=4e-3, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.gpu
@hopper
def test_deterministic_mode_gives_identical_bits():
    """20 runs of the deterministic backward: the same bits every time (dQ's adds in key-block order)."""
    shapes = [(2, 8, 1500, 128), (2, 2, 1500, 128), (2, 2, 1500, 128), (2, 8, 1500, 128)]
    q, k, v, do = random_tensors(shapes, BF16, "cuda")
    out, lse = fa3.forward(q, k, v, causal=True)
    first = fa3_bwd.backward(do, q, k, v, out, lse, causal=True, deterministic=True)
    for _ in range(19):
        again = fa3_bwd.backward(do, q, k, v, out, lse, causal=True, deterministic=True)
        for a, b in zip(first, again, strict=True):
            assert torch.equal(a, b)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_training_step_captures_in_a_cuda_graph(deterministic):
    """Forward and backward (``torch.autograd.grad``) captured together, replayed: the eager step's outputs
    (dK and dV exactly; dQ exactly in the deterministic mode, within rounding otherwise)."""
    shapes = [(2, 4, 1024, 128), (2, 2, 1024, 128), (2, 2, 1024, 128), (2, 4, 1024, 128)]
    q, k, v, do = random_tensors(shapes, BF16, "cuda")
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]

    def step():
        out = fa3.attention(*leaves, causal=True, backward="fa3", deterministic=deterministic)
        return (out, *torch.autograd.grad(out, leaves, do))

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            eager = [t.clone() for t in step()]
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        static = step()
    with torch.cuda.stream(stream):
        graph.replay()
    torch.cuda.synchronize()
    for i, (got, want) in enumerate(zip(static, eager, strict=True)):
        if deterministic or i != 1:
            assert torch.equal(got, want), f"output {i}"
        else:
            torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)
