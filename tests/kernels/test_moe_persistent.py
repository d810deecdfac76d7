"""The persistent grouped GEMM (``grouped_gemm(..., path="persistent")``, ``moe_ffn(..., path="persistent")``).

Judged as tests/kernels/test_moe.py judges the default kernel (float64 per-expert products, the tolerance
policy), on segments that break tilings: empty experts (leading, trailing, between), every row on one expert,
one row, K and N not multiples of the tiles; with tensor descriptors per segment (the interpreter runs them)
and with pointer loads (layouts a descriptor cannot take fall back to them), which must give the same bits;
with fewer programs than tiles, so that each walks several and crosses experts.
"""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import triton

from kernels import tolerance
from kernels.moe import grouped_gemm, moe_ffn, reference
from kernels.moe.grouped_gemm import GroupedGemmConfig

gg = importlib.import_module("kernels.moe.grouped_gemm")  # the package rebinds the name to the function

F16, F32, F64 = torch.float16, torch.float32, torch.float64
ROOT = Path(__file__).resolve().parents[2]
HOPPER_SMEM_PER_BLOCK = 232448  # bytes of shared memory a block may use on an H100/H200

# (name, rows per expert, K, N): segments straddling the interpreter's 16-row tile
CASES = [
    ("odd_segments", [7, 0, 19, 1, 16, 33], 40, 24),
    ("all_on_one_expert", [0, 0, 37, 0], 40, 72),
    ("all_on_the_last", [0, 0, 0, 50], 24, 40),
    ("single_row", [0, 1, 0], 24, 40),
    ("n_not_a_multiple_of_8", [5, 0, 12], 32, 20),
    ("many_tiles", [40, 0, 70, 33], 48, 56),
]


def _inputs(counts, k, n, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.tensor(counts).cumsum(0).to(torch.int32)
    a = torch.randn(int(offsets[-1]), k, generator=gen).to(dtype)
    b = (torch.randn(len(counts), k, n, generator=gen) / k**0.5).to(dtype)
    return a, b, offsets


def _check(name, out, a, b, offsets, dtype):
    ref = reference.grouped_gemm_reference(a, b, offsets, F64)
    tolerance.assert_close(name, out, ref, reference.grouped_gemm_reference(a, b, offsets), dtype)


def _persistent(tma=True, programs=1, block=(16, 16, 16)):
    return GroupedGemmConfig(*block, 4, 1, path="persistent", programs_per_sm=programs, tma=tma)


@pytest.mark.parametrize("dtype", [F16, F32])
@pytest.mark.parametrize("name, counts, k, n", CASES, ids=[c[0] for c in CASES])
def test_persistent_grouped_gemm(name, counts, k, n, dtype):
    """Descriptors and pointer loads give the same bits; 3 and 15 programs (each tile computed by one program
    whatever the share) the same bits too; all within the policy."""
    a, b, offsets = _inputs(counts, k, n, dtype)
    out = grouped_gemm(a, b, offsets, path="persistent")
    _check(f"persistent {name} {dtype}", out, a, b, offsets, dtype)
    assert torch.equal(out, grouped_gemm(a, b, offsets, config=_persistent(tma=False)))
    assert torch.equal(out, grouped_gemm(a, b, offsets, config=_persistent(programs=5)))
    tiles = _persistent(block=(32, 16, 32))
    _check(f"persistent {name} 32x16x32", grouped_gemm(a, b, offsets, config=tiles), a, b, offsets, dtype)


def test_descriptors_only_where_the_layouts_allow():
    """Rows of 16-byte multiples with unit strides take descriptors (a column slice too); N = 20 (40-byte
    rows), a strided or an offset A, a transposed B fall back to pointers, with the default kernel's results."""
    a, b, offsets = _inputs([9, 0, 21], 32, 24, F16)
    out = torch.empty(30, 24, dtype=F16)
    assert gg._tma_ok(a, b, b, out)
    assert gg._tma_ok(a, b[..., :20], b[..., :20], out[:, :20])  # 20 of 24 columns: 48-byte row strides
    b20 = b[..., :20].contiguous()
    assert not gg._tma_ok(a, b20, b20, torch.empty(30, 20, dtype=F16))
    wide = torch.randn(30, 64).to(F16)
    strided, offset = wide[:, ::2], wide.view(-1)[3 : 3 + 30 * 32].view(30, 32)
    transposed = b.transpose(1, 2).contiguous().transpose(1, 2)
    for name, a_, b_ in (("strided a", strided, b), ("offset a", offset, b), ("transposed b", a, transposed)):
        assert not gg._tma_ok(a_, b_, b_, out), name
        got = grouped_gemm(a_, b_, offsets, path="persistent")
        assert torch.equal(got, grouped_gemm(a_, b_, offsets)), name


@pytest.mark.parametrize("tma", [True, False])
def test_persistent_swiglu_epilogue(tma):
    a, b, offsets = _inputs([7, 0, 19, 1, 16], 40, 24, F16)
    up = (torch.randn(b.shape, generator=torch.Generator().manual_seed(5)) / 40**0.5).to(F16)
    out = grouped_gemm(a, b, offsets, swiglu_b=up, config=_persistent(tma=tma, programs=2))
    gate64 = reference.grouped_gemm_reference(a, b, offsets, F64)
    ref = torch.nn.functional.silu(gate64) * reference.grouped_gemm_reference(a, up, offsets, F64)
    gate = reference.grouped_gemm_reference(a, b, offsets)
    same = torch.nn.functional.silu(gate) * reference.grouped_gemm_reference(a, up, offsets)
    tolerance.assert_close(f"persistent swiglu tma={tma}", out, ref, same, F16)


def test_moe_ffn_on_the_persistent_path():
    """The whole layer with both grouped GEMMs on the persistent path, skewed routing (experts left empty)."""
    gen = torch.Generator().manual_seed(4)
    tokens, e, h, f = 29, 6, 32, 24
    x = torch.randn(tokens, h, generator=gen).to(F16)
    logits = torch.randn(tokens, e, generator=gen) + torch.tensor([4.0, 3.0, 0, 0, -9, -9])
    wg, wu = ((torch.randn(e, h, f, generator=gen) / h**0.5).to(F16) for _ in range(2))
    wd = (torch.randn(e, f, h, generator=gen) / f**0.5).to(F16)
    out = moe_ffn(x, logits, wg, wu, wd, top_k=2, path="persistent")
    ref = reference.moe_ffn_reference(x, logits, wg, wu, wd, 2, dtype=F64)
    tolerance.assert_close("moe_ffn persistent", out, ref, reference.moe_ffn_reference(x, logits, wg, wu, wd, 2), F16)
    with pytest.raises(ValueError, match="path must be one of"):
        moe_ffn(x, logits, wg, wu, wd, top_k=2, path="tma")


def test_bad_paths_and_configs():
    a, b, offsets = _inputs([3, 4], 16, 16, F16)
    with pytest.raises(ValueError, match="path must be one of"):
        grouped_gemm(a, b, offsets, path="stream-k")
    with pytest.raises(ValueError, match="path='grouped' disagrees with config.path='persistent'"):
        grouped_gemm(a, b, offsets, config=_persistent(), path="grouped")
    with pytest.raises(TypeError, match="config must be a GroupedGemmConfig"):
        grouped_gemm(a, b, offsets, config=(16, 16, 16, 4, 1))
    with pytest.raises(ValueError, match="tma belongs to path 'persistent'"):
        GroupedGemmConfig(16, 16, 16, 4, 1, tma=True)
    with pytest.raises(ValueError, match="programs_per_sm must be ≥ 1"):
        _persistent(programs=0)
    with pytest.raises(ValueError, match="path must be one of"):
        GroupedGemmConfig(16, 16, 16, 4, 1, path="tma")


@pytest.mark.gpu
@pytest.mark.parametrize("fuse", [False, True])
def test_persistent_bf16_on_gpu(fuse):
    """bf16 on the GPU defaults; on Hopper the descriptors and the pointer loads give the same bits."""
    g = torch.Generator(device="cuda").manual_seed(0)
    counts = [300, 0, 1, 129, 0, 2047, 64, 0]
    offsets = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
    a = torch.randn(sum(counts), 1024, generator=g, device="cuda").to(torch.bfloat16)
    b, up = ((torch.randn(8, 1024, 768, generator=g, device="cuda") / 32).to(torch.bfloat16) for _ in range(2))
    out = grouped_gemm(a, b, offsets, swiglu_b=up if fuse else None, path="persistent")
    assert torch.equal(out, grouped_gemm(a, b, offsets, swiglu_b=up if fuse else None, config=_gpu(tma=False)))
    if not fuse:
        _check("persistent bf16", out, a, b, offsets, torch.bfloat16)


def _gpu(tma):
    cfg = gg.default_config(torch.bfloat16, False, "persistent")
    return GroupedGemmConfig(cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages, "persistent", 1, tma)


_COMPILE_SCRIPT = textwrap.dedent(
    """
    import importlib, re, sys
    import torch
    import triton
    from triton.backends.compiler import GPUTarget

    gg = importlib.import_module("kernels.moe.grouped_gemm")
    fn = gg._grouped_persistent_kernel
    fuse, dtype, tma = sys.argv[1] == "1", sys.argv[2], sys.argv[3] == "1"
    cfg = gg.default_config(getattr(torch, dtype), fuse, "persistent")  # the GPU defaults
    ptr = "*fp16" if dtype == "float16" else "*bf16"
    consts = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, FUSE_SWIGLU=fuse, IS_FP32=False,
                  E_POW2=64, GROUP_M=gg.GROUP_M, USE_TMA=tma,
                  stride_ak=1, stride_bn=1, stride_b2n=1, stride_cn=1)  # contiguous rows: the runtime pins 1
    sig, cons = {}, {}
    for i, n in enumerate(fn.arg_names):
        if n in consts:
            sig[n], cons[(i,)] = "constexpr", consts[n]
        else:
            sig[n] = {"A": ptr, "B": ptr, "B2": ptr, "C": ptr, "Offsets": "*i32"}.get(n, "i32")
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if sig[n] != "constexpr"}
    kernel = triton.compile(triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=cons, attrs=attrs),
                            target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    ptx = kernel.asm["ptx"]
    mmas = re.findall(r"(?:wgmma\\.mma_async\\.sync|mma\\.sync)\\.aligned\\.[\\w.]+", ptx)
    print(kernel.metadata.shared, kernel.metadata.global_scratch_size, ptx.count("cp.async.bulk.tensor"),
          ptx.count("ld.local") + ptx.count("st.local"))
    print(sorted(set(mmas)))
    """
)


@pytest.mark.parametrize(
    "fuse, dtype, tma",
    [(False, "bfloat16", True), (True, "bfloat16", True), (False, "float16", False), (True, "float16", False)],
    ids=["plain-bf16-tma", "swiglu-bf16-tma", "plain-fp16-pointers", "swiglu-fp16-pointers"],
)
def test_persistent_compiles_for_sm90(fuse, dtype, tma):
    """The sm_90 build with the GPU default tiles fits a Hopper block's shared memory, multiplies with wgmma
    on the input type into fp32, uses no local memory, and with descriptors issues bulk tensor copies from
    descriptors made on the device (global scratch); without them, neither."""
    if "nvidia" not in triton.backends.backends:
        pytest.skip("this Triton has no NVIDIA backend to compile with")
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    run = subprocess.run(
        [sys.executable, "-c", _COMPILE_SCRIPT, "1" if fuse else "0", dtype, "1" if tma else "0"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    counts, found = run.stdout.strip().splitlines()[-2:]
    shared, scratch, bulk, local = (int(v) for v in counts.split())
    found = ast.literal_eval(found)
    mma = "f16" if dtype == "float16" else "bf16"
    assert shared <= HOPPER_SMEM_PER_BLOCK and local == 0, counts
    assert (bulk > 0) == tma and (scratch > 0) == tma, counts
    assert found and all(m.startswith("wgmma") and m.endswith(f".f32.{mma}.{mma}") for m in found), found
