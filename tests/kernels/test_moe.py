"""Mixture of experts (kernels/moe/): the router, the device-side dispatch/combine, the grouped GEMM, the layer.

How results are judged: the grouped GEMM and the layer against float64 per-expert loops
(kernels/moe/reference.py) under kernels/tolerance.py's policy, the same loop in the inputs' dtype being
the same-precision PyTorch. Routing and dispatch are checked by their invariants (a permutation, counts
summing to tokens·k, offsets equal to bincount + cumsum, stable order within an expert) on random and
degenerate routings: all tokens to one expert, empty experts, one token, k equal to the number of
experts. Shapes are small and odd (K = 40, N = 24, 72; segments not a multiple of the tile) so the
interpreter crosses tile and segment ends. The GPU path is compiled for sm_90 in a subprocess.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import triton
from gpu_limits import HOPPER_SMEM_PER_BLOCK

from kernels import tolerance
from kernels.moe import grouped_gemm, moe_ffn, reference, routing
from kernels.moe.grouped_gemm import GroupedGemmConfig

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
ROOT = Path(__file__).resolve().parents[2]


def _logits_for(kind: str, tokens: int, experts: int, gen: torch.Generator) -> torch.Tensor:
    logits = torch.randn(tokens, experts, generator=gen)
    if kind == "one_expert":  # every token's first choice is expert 2
        logits[:, 2] += 50.0
    elif kind == "empty_experts":  # experts 0 and 3 are never in anyone's top-k (k ≤ E - 2)
        logits[:, [0, 3]] -= 50.0
    return logits


# (name, tokens, experts, top_k, logits kind)
ROUTINGS = [
    ("random", 29, 6, 2, "random"),
    ("one_expert_k1", 21, 5, 1, "one_expert"),
    ("empty_experts", 23, 6, 3, "empty_experts"),
    ("one_token", 1, 4, 2, "random"),
    ("k_equals_E", 11, 4, 4, "random"),
]


# ---------------------------------------------------------------------------------------------------
# Router
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("logit_dtype", [F32, F16])
def test_route(renormalize, logit_dtype):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(37, 7, generator=gen).to(logit_dtype)
    weights, ids = routing.route(logits, 3, renormalize)
    assert weights.dtype == F32 and weights.shape == ids.shape == (37, 3)
    probs = torch.softmax(logits.double(), -1)
    expected = probs.gather(1, ids)
    if renormalize:
        expected = expected / expected.sum(-1, keepdim=True)
        torch.testing.assert_close(weights.sum(-1), torch.ones(37), rtol=0, atol=1e-6)
    torch.testing.assert_close(weights.double(), expected, rtol=1e-6, atol=1e-7)
    # the chosen experts are the k most probable, in descending order
    assert torch.equal(probs.topk(3, -1).indices, ids)
    assert (weights[:, :-1] >= weights[:, 1:]).all()


def test_route_bad_inputs():
    with pytest.raises(ValueError, match="top_k"):
        routing.route(torch.randn(4, 3), 4)
    with pytest.raises(ValueError, match="top_k"):
        routing.route(torch.randn(4, 3), 0)
    with pytest.raises(ValueError, match=r"\[tokens, experts\]"):
        routing.route(torch.randn(4, 3, 2), 1)
    with pytest.raises(TypeError, match="floating point"):
        routing.route(torch.ones(4, 3, dtype=torch.int64), 1)


# ---------------------------------------------------------------------------------------------------
# Dispatch and combine
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, tokens, experts, top_k, kind", ROUTINGS, ids=[r[0] for r in ROUTINGS])
def test_dispatch_invariants(name, tokens, experts, top_k, kind):
    gen = torch.Generator().manual_seed(1)
    _, ids = routing.route(_logits_for(kind, tokens, experts, gen), top_k)
    plan = routing.dispatch(ids, experts)
    n = tokens * top_k
    assert plan.num_rows == n
    assert torch.equal(plan.slot_order.sort().values, torch.arange(n))  # a permutation of the slots
    assert int(plan.counts.sum()) == n
    assert plan.expert_offsets.dtype == torch.int32 and plan.expert_offsets.shape == (experts,)
    bincount = torch.bincount(ids.reshape(-1), minlength=experts)
    assert torch.equal(plan.counts, bincount)
    assert torch.equal(plan.expert_offsets.long(), bincount.cumsum(0))
    sorted_ids = ids.reshape(-1)[plan.slot_order]
    assert (sorted_ids.diff() >= 0).all()
    assert torch.equal(plan.token_index, plan.slot_order // top_k)
    start = 0
    for e, end in enumerate(plan.expert_offsets.tolist()):
        assert (sorted_ids[start:end] == e).all()
        assert (plan.token_index[start:end].diff() > 0).all()  # stable: token order within an expert
        start = end
    if kind == "one_expert":
        assert plan.counts.tolist() == [0, 0, tokens, 0, 0]
    if kind == "empty_experts":
        assert plan.counts[0] == 0 and plan.counts[3] == 0
    if kind == "random" and top_k == experts:
        assert (plan.counts == tokens).all()


@pytest.mark.parametrize("name, tokens, experts, top_k, kind", ROUTINGS, ids=[r[0] for r in ROUTINGS])
def test_gather_combine(name, tokens, experts, top_k, kind):
    gen = torch.Generator().manual_seed(2)
    weights, ids = routing.route(_logits_for(kind, tokens, experts, gen), top_k)
    plan = routing.dispatch(ids, experts)
    x = torch.randn(tokens, 9, generator=gen)
    xs = routing.gather(x, plan)
    assert torch.equal(xs, x[plan.token_index])
    # an expert that scales its rows by (expert id + 1), combined, against a per-token loop
    ys = xs * (ids.reshape(-1)[plan.slot_order] + 1).unsqueeze(-1)
    out = routing.combine(ys, weights, plan)
    expected = (x.unsqueeze(1) * (ids + 1).unsqueeze(-1) * weights.unsqueeze(-1)).sum(1)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    # identity experts and renormalised weights give the input back
    torch.testing.assert_close(routing.combine(xs, weights, plan), x, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------------
# Grouped GEMM
# ---------------------------------------------------------------------------------------------------

# (name, rows per expert, K, N): segment lengths straddle the interpreter's 16-row tile
GEMM_CASES = [
    ("odd_segments", [7, 0, 19, 1, 16, 33], 40, 24),
    ("one_expert_has_all", [0, 0, 37, 0], 40, 72),
    ("single_row", [0, 1, 0], 24, 40),
    ("all_empty_but_tiny_k", [5, 0], 3, 17),
]


def _gemm_inputs(counts, k, n, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.tensor(counts).cumsum(0).to(torch.int32)
    a = torch.randn(int(offsets[-1]), k, generator=gen).to(dtype)
    b = (torch.randn(len(counts), k, n, generator=gen) / k**0.5).to(dtype)
    return a, b, offsets


@pytest.mark.parametrize("dtype", [F16, F32])
@pytest.mark.parametrize("name, counts, k, n", GEMM_CASES, ids=[c[0] for c in GEMM_CASES])
def test_grouped_gemm(name, counts, k, n, dtype):
    a, b, offsets = _gemm_inputs(counts, k, n, dtype)
    out = grouped_gemm(a, b, offsets)
    assert out.shape == (a.shape[0], n) and out.dtype == dtype
    ref = reference.grouped_gemm_reference(a, b, offsets, F64)
    same = reference.grouped_gemm_reference(a, b, offsets)
    tolerance.assert_close(f"grouped_gemm {name} {dtype}", out, ref, same, dtype)


@pytest.mark.parametrize("dtype", [F16, F32])
def test_grouped_gemm_swiglu_epilogue(dtype):
    a, b, offsets = _gemm_inputs([7, 0, 19, 1, 16], 40, 24, dtype)
    up = (torch.randn(b.shape, generator=torch.Generator().manual_seed(5)) / 40**0.5).to(dtype)
    out = grouped_gemm(a, b, offsets, swiglu_b=up)
    gate64 = reference.grouped_gemm_reference(a, b, offsets, F64)
    ref = torch.nn.functional.silu(gate64) * reference.grouped_gemm_reference(a, up, offsets, F64)
    gate = reference.grouped_gemm_reference(a, b, offsets)
    same = torch.nn.functional.silu(gate) * reference.grouped_gemm_reference(a, up, offsets)
    tolerance.assert_close(f"grouped_gemm swiglu {dtype}", out, ref, same, dtype)


def test_grouped_gemm_strided_inputs():
    """Non-contiguous a (a column slice) and b (a transposed [E, N, K] buffer) through their strides."""
    gen = torch.Generator().manual_seed(3)
    offsets = torch.tensor([9, 9, 30], dtype=torch.int32)
    a = torch.randn(30, 50, generator=gen).to(F16)[:, 5:45]
    b = (torch.randn(3, 24, 40, generator=gen) / 40**0.5).to(F16).transpose(1, 2)
    out = grouped_gemm(a, b, offsets)
    ref = reference.grouped_gemm_reference(a, b, offsets, F64)
    tolerance.assert_close("grouped_gemm strided", out, ref, reference.grouped_gemm_reference(a, b, offsets), F16)


def test_grouped_gemm_pinned_config_and_empty():
    a, b, offsets = _gemm_inputs([3, 40, 0], 40, 24, F32)
    cfg = GroupedGemmConfig(32, 16, 32, 4, 1)
    out = grouped_gemm(a, b, offsets, config=cfg)
    tolerance.assert_close(
        "grouped_gemm 32x16x32",
        out,
        reference.grouped_gemm_reference(a, b, offsets, F64),
        reference.grouped_gemm_reference(a, b, offsets),
        F32,
    )
    empty = grouped_gemm(torch.empty(0, 40), b, torch.zeros(3, dtype=torch.int32))
    assert empty.shape == (0, 24)
    with pytest.raises(ValueError, match="power of two"):
        GroupedGemmConfig(24, 16, 16, 4, 1)
    # K = 0: an empty sum, zeros, with and without the SwiGLU epilogue
    a0, b0 = torch.empty(4, 0, dtype=F16), torch.empty(2, 0, 5, dtype=F16)
    off0 = torch.tensor([1, 4], dtype=torch.int32)
    assert torch.equal(grouped_gemm(a0, b0, off0), torch.zeros(4, 5, dtype=F16))
    assert torch.equal(grouped_gemm(a0, b0, off0, swiglu_b=b0), torch.zeros(4, 5, dtype=F16))


@pytest.mark.parametrize(
    "counts",
    [[7, 0, 19, 1, 16], [0, 0, 0, 5], [16, 16], [0, 1], [3] * 5 + [0] * 20 + [33] + [0] * 11, [40, 0, 70, 33]],
    ids=["mixed", "leading-empty", "exact-tiles", "one-row", "37-experts", "several-groups"],
)
def test_every_row_tile_finds_its_expert(counts):
    """The kernel's own tile → expert lookup (prefix sum of the tile counts): every row computed once by its
    expert's matrix, whatever the counts (empty experts, exact multiples of BLOCK_M, E not a power of two),
    across several groups of the grouped program order (several-groups: 11 row tiles of 16, more than
    GROUP_M = 8, and 3 N tiles; the other cases have at most 8)."""
    a, b, offsets = _gemm_inputs(counts, 24, 40, F32)
    cfg = GroupedGemmConfig(16, 16, 16, 4, 1)
    out = grouped_gemm(a, b, offsets, config=cfg)
    tolerance.assert_close(
        f"grouped_gemm {counts}",
        out,
        reference.grouped_gemm_reference(a, b, offsets, F64),
        reference.grouped_gemm_reference(a, b, offsets),
        F32,
    )


def test_grouped_gemm_bad_inputs():
    a, b, offsets = _gemm_inputs([3, 4], 8, 16, F16)
    with pytest.raises(ValueError, match=r"\[total_rows, K\]"):
        grouped_gemm(a[None], b, offsets)
    with pytest.raises(ValueError, match=r"\[E, K, N\]"):
        grouped_gemm(a, b[0], offsets)
    with pytest.raises(ValueError, match="does not match b's K"):
        grouped_gemm(a, b[:, :4], offsets)
    with pytest.raises(TypeError, match="must have a's dtype"):
        grouped_gemm(a, b.float(), offsets)
    with pytest.raises(TypeError, match="supported: float16"):
        grouped_gemm(a.double(), b.double(), offsets)
    with pytest.raises(TypeError, match="int32"):
        grouped_gemm(a, b, offsets.long())
    with pytest.raises(ValueError, match=r"\[E\] = \[2\]"):
        grouped_gemm(a, b, offsets[:1])
    with pytest.raises(ValueError, match="non-decreasing"):
        grouped_gemm(a, b, torch.tensor([5, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="non-decreasing"):
        grouped_gemm(a, b, torch.tensor([-1, 7], dtype=torch.int32))
    with pytest.raises(ValueError, match="end at total_rows = 7"):
        grouped_gemm(a, b, torch.tensor([3, 6], dtype=torch.int32))
    with pytest.raises(ValueError, match="swiglu_b must have b's shape"):
        grouped_gemm(a, b, offsets, swiglu_b=b[:, :, :8])
    with pytest.raises(ValueError, match="no experts"):
        grouped_gemm(a, b[:0], offsets[:0])
    with pytest.raises(TypeError, match="torch.Tensor"):
        grouped_gemm(a, b, [3, 7])
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="share one device"):
            grouped_gemm(a.cuda(), b.cuda(), offsets)
    else:
        with pytest.raises(TypeError, match="interpreter"):
            grouped_gemm(a.bfloat16(), b.bfloat16(), offsets)


@pytest.mark.gpu
def test_grouped_gemm_bf16_gpu():
    a, b, offsets = _gemm_inputs([700, 0, 1, 129, 3000], 200, 136, BF16)
    a, b, offsets = a.cuda(), b.cuda(), offsets.cuda()
    out = grouped_gemm(a, b, offsets)
    ref = reference.grouped_gemm_reference(a, b, offsets, F64)
    tolerance.assert_close("grouped_gemm bf16", out, ref, reference.grouped_gemm_reference(a, b, offsets), BF16)
    if hasattr(torch, "_grouped_mm") and torch.cuda.get_device_capability() >= (9, 0):
        tolerance.assert_close("vs torch._grouped_mm", out, ref, torch._grouped_mm(a, b, offs=offsets), BF16)


# ---------------------------------------------------------------------------------------------------
# The layer
# ---------------------------------------------------------------------------------------------------


def _ffn_inputs(tokens, experts, hidden, ffn, dtype, kind, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype)
    logits = _logits_for(kind, tokens, experts, gen)
    w_gate = (torch.randn(experts, hidden, ffn, generator=gen) / hidden**0.5).to(dtype)
    w_up = (torch.randn(experts, hidden, ffn, generator=gen) / hidden**0.5).to(dtype)
    w_down = (torch.randn(experts, ffn, hidden, generator=gen) / ffn**0.5).to(dtype)
    return x, logits, w_gate, w_up, w_down


@pytest.mark.parametrize("name, tokens, experts, top_k, kind", ROUTINGS, ids=[r[0] for r in ROUTINGS])
def test_moe_ffn(name, tokens, experts, top_k, kind):
    args = _ffn_inputs(tokens, experts, 40, 24, F16, kind)
    out = moe_ffn(*args, top_k)
    assert out.shape == (tokens, 40) and out.dtype == F16
    ref = reference.moe_ffn_reference(*args, top_k, dtype=F64)
    same = reference.moe_ffn_reference(*args, top_k)
    tolerance.assert_close(f"moe_ffn {name}", out, ref, same, F16)


@pytest.mark.parametrize("renormalize", [True, False])
def test_moe_ffn_fp32_wide_ffn(renormalize):
    args = _ffn_inputs(19, 5, 24, 72, F32, "random", seed=4)
    out = moe_ffn(*args, 2, renormalize=renormalize)
    ref = reference.moe_ffn_reference(*args, 2, renormalize, dtype=F64)
    same = reference.moe_ffn_reference(*args, 2, renormalize)
    tolerance.assert_close(f"moe_ffn fp32 renormalize={renormalize}", out, ref, same, F32)


def test_moe_ffn_zero_tokens_and_determinism():
    x, logits, wg, wu, wd = _ffn_inputs(0, 3, 8, 16, F16, "random")
    assert moe_ffn(x, logits, wg, wu, wd, 2).shape == (0, 8)
    args = _ffn_inputs(17, 4, 24, 40, F16, "random", seed=6)
    assert torch.equal(moe_ffn(*args, 2), moe_ffn(*args, 2))  # no atomics: bitwise reproducible


def test_moe_ffn_bad_inputs():
    x, logits, wg, wu, wd = _ffn_inputs(5, 3, 8, 16, F16, "random")
    with pytest.raises(ValueError, match=r"\[tokens, H\]"):
        moe_ffn(x[None], logits, wg, wu, wd, 1)
    with pytest.raises(ValueError, match="router_logits must be"):
        moe_ffn(x, logits[:4], wg, wu, wd, 1)
    with pytest.raises(ValueError, match="router_logits has 3 expert columns but w_gate has 2 experts"):
        moe_ffn(x, logits, wg[:2], wu, wd, 1)
    with pytest.raises(ValueError, match="w_gate must be"):
        moe_ffn(x, logits, wg[:, :4], wu, wd, 1)
    with pytest.raises(ValueError, match="w_up must have"):
        moe_ffn(x, logits, wg, wu[:, :, :8], wd, 1)
    with pytest.raises(ValueError, match="w_down must be"):
        moe_ffn(x, logits, wg, wu, wd.transpose(1, 2), 1)
    with pytest.raises(TypeError, match="x's dtype"):
        moe_ffn(x, logits, wg.float(), wu, wd, 1)
    with pytest.raises(ValueError, match="top_k"):
        moe_ffn(x, logits, wg, wu, wd, 4)
    with pytest.raises(TypeError, match="x has dtype"):
        moe_ffn(x.double(), logits, wg.double(), wu.double(), wd.double(), 1)


@pytest.mark.gpu
def test_moe_ffn_bf16_gpu():
    args = [t.cuda() for t in _ffn_inputs(300, 8, 256, 136, BF16, "random")]
    out = moe_ffn(*args, 2)
    ref = reference.moe_ffn_reference(*args, 2, dtype=F64)
    tolerance.assert_close("moe_ffn bf16", out, ref, reference.moe_ffn_reference(*args, 2), BF16)


@pytest.mark.gpu
def test_moe_ffn_makes_no_host_round_trip():
    """Routing, dispatch, both grouped GEMMs and combine queue without one device-to-host synchronisation."""
    args = [t.cuda() for t in _ffn_inputs(300, 8, 256, 136, F16, "random")]
    moe_ffn(*args, 2)  # compile outside the checked region
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        moe_ffn(*args, 2)
    finally:
        torch.cuda.set_sync_debug_mode("default")


# ---------------------------------------------------------------------------------------------------
# The GPU path, compiled without a GPU
# ---------------------------------------------------------------------------------------------------

_COMPILE_SCRIPT = textwrap.dedent(
    """
    import importlib, re, sys
    import torch
    import triton
    from triton.backends.compiler import GPUTarget

    gg = importlib.import_module("kernels.moe.grouped_gemm")  # the package rebinds the name to the function

    fn = gg._grouped_gemm_kernel
    fuse, dtype = sys.argv[1] == "1", sys.argv[2]
    cfg = gg.default_config(getattr(torch, dtype), fuse)  # the GPU defaults: TRITON_INTERPRET=0 here
    ptr = "*fp16" if dtype == "float16" else "*bf16"
    consts = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, FUSE_SWIGLU=fuse, IS_FP32=False,
                  E_POW2=64, GROUP_M=gg.GROUP_M,
                  stride_ak=1, stride_bn=1, stride_b2n=1, stride_cn=1)  # contiguous rows: the runtime pins 1
    sig, cons = {}, {}
    for i, n in enumerate(fn.arg_names):
        if n in consts:
            sig[n], cons[(i,)] = "constexpr", consts[n]
        else:
            sig[n] = {"A": ptr, "B": ptr, "B2": ptr, "C": ptr, "Offsets": "*i32"}.get(n, "i32")
    # what the runtime infers for 16-byte-aligned pointers and sizes/strides that are multiples of 16
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if sig[n] != "constexpr"}
    kernel = triton.compile(triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=cons, attrs=attrs),
                            target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    mmas = re.findall(r"(?:wgmma\\.mma_async\\.sync|mma\\.sync)\\.aligned\\.[\\w.]+", kernel.asm["ptx"])
    print(kernel.metadata.shared, sorted(set(mmas)))
    """
)


@pytest.mark.parametrize(
    "fuse, dtype, mma",
    [(False, "float16", "f16"), (True, "float16", "f16"), (False, "bfloat16", "bf16"), (True, "bfloat16", "bf16")],
    ids=["plain-fp16", "swiglu-fp16", "plain-bf16", "swiglu-bf16"],
)
def test_gpu_path_compiles_to_wgmma(fuse, dtype, mma):
    """The sm_90 build of the grouped GEMM (and its fused SwiGLU variant), with the GPU default tiles, fits
    an H100/H200's shared memory and uses only Hopper's wgmma, on the input type, accumulating in fp32."""
    if "nvidia" not in triton.backends.backends:
        pytest.skip("this Triton has no NVIDIA backend to compile with")
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    run = subprocess.run(
        [sys.executable, "-c", _COMPILE_SCRIPT, "1" if fuse else "0", dtype],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    shared, _, found = run.stdout.strip().splitlines()[-1].partition(" ")
    found = ast.literal_eval(found)
    assert int(shared) <= HOPPER_SMEM_PER_BLOCK, f"needs {shared} bytes of shared memory, more than a Hopper block has"
    assert found and all(m.startswith("wgmma.mma_async.sync.aligned.m64n") for m in found), found
    assert all(m.endswith(f".f32.{mma}.{mma}") for m in found), found
