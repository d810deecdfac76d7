"""The W4A16 / W8A16 candidate paths (``path="tc"``, ``"streamk"``), the unadopted path heuristic, and the launch
plans that keep a call's host work to its output and its launch.

Judged as tests/kernels/test_w4a16.py judges the default path: against the float64 product with the dequantised
weight, within the tolerance policy of the same product in x's precision. Shapes are odd on purpose: K not a
multiple of 128 · the steps a program takes (tails of 32 and 96 inputs), N not a multiple of the tile, M = 1,
63, 65, 1000, strided and 3-D x; stream-K with program counts that split tiles between programs and runs that
cross tiles; the tc kernel with fewer programs than tiles, through tensor descriptors and pointer loads.
"""

from __future__ import annotations

import ast
import dataclasses
import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import triton

from kernels import tolerance
from kernels import w4a16 as wq
from kernels.w4a16 import plans, reference
from kernels.w4a16 import w4a16 as launcher

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
ROOT = Path(__file__).resolve().parents[2]


def _weight(n, k, dtype=F16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (0.05 * torch.randn(n, k, generator=g)).to(dtype)


def _x(shape, dtype=F16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def _check(x, qw, bias, out, name):
    ref = reference.linear_reference(x, qw, bias, torch.float64)
    same = reference.linear_reference(x, qw, bias)
    assert out.shape == (*x.shape[:-1], qw.shape[0]) and out.dtype == x.dtype, name
    tolerance.assert_close(name, out, ref, same, x.dtype)


def _tc(bm=16, bn=32, bk=128, programs=1, group_n=2, tma=True):
    return wq.W4A16Config(bm, bn, bk, 1, 4, 1, True, path="tc", tma=tma, programs_per_sm=programs, group_n=group_n)


def _streamk(bm=16, bn=16, bk=128, programs=1, after=True):
    return wq.W4A16Config(bm, bn, bk, 1, 4, 1, True, after, path="streamk", programs_per_sm=programs)


# ---------------------------------------------------------------------------------------------------
# int4: the tensor-core path
# ---------------------------------------------------------------------------------------------------

# (M, N, K, group, symmetric, bias, weight dtype, x dtype): M across one and many row tiles, N not a multiple
# of 32, K with 32- and 96-input tails, fp32 weights (separate scales and zero points) and fp32 x (exact mode)
TC_CASES = [
    (1, 40, 480, 32, False, True, F16, F16),
    (63, 72, 224, 32, True, False, F16, F16),
    (65, 37, 384, 128, False, True, F16, F16),
    (20, 40, 352, 32, False, True, F32, F16),
    (17, 21, 256, 64, False, False, F16, F32),
]


@pytest.mark.parametrize("m, n, k, group, symmetric, has_bias, wdtype, dtype", TC_CASES, ids=lambda v: str(v))
def test_tc_path(device, m, n, k, group, symmetric, has_bias, wdtype, dtype):
    """The persistent kernel with its interpreter config (3 programs, fewer than the tiles: each walks several)
    and descriptors; pinned: pointer loads give the same bits, and another tile order and program count
    agree within the policy."""
    qw = wq.quantize(_weight(n, k, wdtype).to(device), group, symmetric)
    x = _x((m, k), dtype).to(device)
    bias = _x((n,), dtype, seed=2).to(device) if has_bias else None
    out = wq.matmul(x, qw, bias, path="tc")
    _check(x, qw, bias, out, f"tc M={m} N={n} K={k}")
    assert torch.equal(out, wq.matmul(x, qw, bias, config=_tc(tma=False)))
    other = wq.matmul(x, qw, bias, config=_tc(bm=32, bn=16, programs=2, group_n=3))
    _check(x, qw, bias, other, f"tc M={m} bm 32 bn 16, 6 programs, groups of 3")


def test_tc_path_many_rows_strided_and_3d(device):
    """M = 1000 (63 row tiles); x strided (no descriptor: pointer loads) and 3-D."""
    qw = wq.quantize(_weight(24, 160, F16).to(device), 32)
    x = _x((1000, 160)).to(device)
    _check(x, qw, None, wq.matmul(x, qw, path="tc"), "tc M=1000")
    strided = _x((2, 7, 320)).to(device)[..., ::2]
    out = wq.matmul(strided, qw, path="tc")
    assert out.shape == (2, 7, 24)
    assert not plans.tma_used(_tc(), strided.reshape(14, 160), qw.packed)
    _check(strided.reshape(14, 160), qw, None, out.reshape(14, 24), "tc strided 3-D x")


# ---------------------------------------------------------------------------------------------------
# int4: the stream-K path
# ---------------------------------------------------------------------------------------------------

STREAMK_CASES = [
    (1, 40, 480, 32, False, True, F16, F16),
    (3, 72, 640, 64, True, False, F16, F16),
    (16, 37, 224, 32, False, True, F16, F16),
    (2, 40, 384, 128, False, True, F32, F16),
    (4, 21, 256, 64, True, True, F16, F32),
]


@pytest.mark.parametrize("m, n, k, group, symmetric, has_bias, wdtype, dtype", STREAMK_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("programs, block_k", [(1, 128), (2, 256), (5, 128)])
def test_streamk_path(device, m, n, k, group, symmetric, has_bias, wdtype, dtype, programs, block_k):
    """3, 6 and 15 programs over the units: tiles split between programs, runs that start and end inside
    tiles and cross them, a 256-input step whose second block may be missing (K = 640: 5 blocks), tails;
    deterministic, and every tile's counter back at 0."""
    qw = wq.quantize(_weight(n, k, wdtype).to(device), group, symmetric)
    x = _x((m, k), dtype).to(device)
    bias = _x((n,), dtype, seed=2).to(device) if has_bias else None
    cfg = _streamk(bk=block_k, programs=programs)
    out = wq.matmul(x, qw, bias, config=cfg)
    _check(x, qw, bias, out, f"streamk M={m} N={n} K={k} {programs}/SM bk {block_k}")
    assert torch.equal(out, wq.matmul(x, qw, bias, config=cfg))
    for _, counters in plans._WORKSPACES.values():
        assert int(counters.abs().sum()) == 0


def test_streamk_splits_tiles_between_programs():
    """The partition the kernel uses: program p takes units [p·U // P, (p+1)·U // P); the programs sharing
    tile t are those from the last to start at or before its first unit to the last to start before its end
    (the formula of ``_streamk_epilogue``), and every unit is some program's."""
    for units, programs, steps in ((9, 6, 3), (12, 5, 4), (7, 7, 1), (100, 33, 10), (64, 64, 8)):
        start = [p * units // programs for p in range(programs + 1)]
        assert all(b > a for a, b in zip(start, start[1:], strict=False))  # no empty run when P ≤ U
        for tile in range(units // steps):
            first, last_unit = tile * steps, tile * steps + steps - 1
            sharing = [p for p in range(programs) if start[p] <= last_unit and start[p + 1] > first]
            p_first = ((first + 1) * programs - 1) // units
            p_last = ((first + steps) * programs - 1) // units
            assert sharing == list(range(p_first, p_last + 1)), (units, programs, steps, tile)


def test_streamk_many_rows_strided_and_3d(device):
    """M = 65 (five row tiles of 16) and 3-D strided x on the decode kernel."""
    qw = wq.quantize(_weight(40, 288, F16).to(device), 32)
    x = _x((65, 288)).to(device)
    _check(x, qw, None, wq.matmul(x, qw, path="streamk"), "streamk M=65")
    strided = _x((1, 3, 576)).to(device)[..., 1::2]
    _check(strided.reshape(3, 288), qw, None, wq.matmul(strided, qw, path="streamk").reshape(3, 40), "streamk 3-D")


# ---------------------------------------------------------------------------------------------------
# int8
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["tc", "streamk"])
@pytest.mark.parametrize(
    "m, n, k, has_bias, dtype", [(1, 40, 100, True, F16), (65, 37, 72, False, F16), (3, 21, 48, True, F32)]
)
def test_w8_paths(device, path, m, n, k, has_bias, dtype):
    """int8 on both candidates: K not a multiple of the 32-input step, odd N; stream-K with tiles split."""
    q8 = wq.quantize_w8(_weight(n, k).to(device))
    x = _x((m, k), dtype).to(device)
    bias = _x((n,), dtype, seed=2).to(device) if has_bias else None
    out = wq.matmul_w8(x, q8, bias, path=path)
    _check(x, q8, bias, out, f"w8 {path} M={m}")
    cfg = _streamk(bk=32, programs=4, after=False) if path == "streamk" else _tc(bk=32, tma=False)
    _check(x, q8, bias, wq.matmul_w8(x, q8, bias, config=cfg), f"w8 {path} M={m} pinned")


# ---------------------------------------------------------------------------------------------------
# The heuristic (not adopted) and the choice of path
# ---------------------------------------------------------------------------------------------------


def test_choose_path_is_a_function_of_the_shape():
    """Decode rows of a large layer on stream-K, a small one on the tiled split-K; M ≥ 64 on tc when the
    tiles fill half the SMs (else the tiled path, which splits K); the middle on tiled; deterministic;
    ``path="auto"`` configs follow it."""
    for bits in (4, 8):
        assert wq.choose_path(1, 14336, 4096, bits=bits) == "streamk"
        assert wq.choose_path(16, 28672, 8192, bits=bits) == "streamk"
        assert wq.choose_path(1, 256, 256, bits=bits) == "tiled"
        assert wq.choose_path(32, 4096, 4096, bits=bits) == "tiled"
        assert wq.choose_path(64, 14336, 4096, bits=bits) == "tc"
        assert wq.choose_path(64, 4096, 14336, bits=bits) == "tiled"  # 64 tiles of 64 channels: SMs would idle
        assert wq.choose_path(4096, 4096, 14336, bits=bits) == "tc"
        assert wq.choose_path(256, 128, 4096, bits=bits) == "tiled"  # 2 output tiles: a persistent grid idles
        for m in (1, 64, 4096):
            auto = wq.choose_config(m, 4096, 4096, interpret=False, bits=bits, path="auto")
            assert auto.path == wq.choose_path(m, 4096, 4096, bits=bits)
    assert wq.choose_path(1, 1024, 1024, sm_count=1) == "streamk"  # enough units for one SM


def test_default_path_stays_tiled(device):
    """Without path= or config=, matmul runs the tiled kernel whatever the heuristic says (it is adopted only
    after a GPU run measures the paths): the plan kept for the call launches ``_w4a16_kernel``."""
    qw = wq.quantize(_weight(40, 128).to(device), 32)
    for m in (1, 64, 100):
        x = _x((m, 128)).to(device)
        wq.matmul(x, qw)
        assert qw.plans[plans.plan_key(x, None, None, None)].main.fn.__name__ == "_w4a16_kernel"
    x = _x((64, 128)).to(device)
    wq.matmul(x, qw, path="tc")
    assert qw.plans[plans.plan_key(x, None, None, "tc")].main.fn.__name__ == "_wq_tc_kernel"


def test_bad_paths_and_configs(device):
    qw = wq.quantize(_weight(40, 128).to(device), 32)
    q8 = wq.quantize_w8(_weight(40, 128).to(device))
    x = _x((3, 128)).to(device)
    with pytest.raises(ValueError, match="path must be one of"):
        wq.matmul(x, qw, path="marlin")
    with pytest.raises(ValueError, match="path='tc' disagrees with config.path='streamk'"):
        wq.matmul(x, qw, config=_streamk(), path="tc")
    with pytest.raises(TypeError, match="config must be a W4A16Config"):
        wq.matmul(x, qw, config={"path": "tc"})
    with pytest.raises(ValueError, match="tma belongs to path 'tc'"):
        wq.matmul(x, qw, config=dataclasses.replace(_streamk(), tma=True))
    with pytest.raises(ValueError, match="swap_ab must be True"):
        wq.matmul(x, qw, config=dataclasses.replace(_tc(), swap_ab=False))
    with pytest.raises(ValueError, match="scale_after is not available on path 'tc'"):
        wq.matmul(x, qw, config=dataclasses.replace(_tc(), scale_after=True))
    with pytest.raises(ValueError, match="programs_per_sm and group_n must be ≥ 1"):
        wq.matmul(x, qw, config=_streamk(programs=0))
    with pytest.raises(ValueError, match="path must be one of"):
        wq.matmul(x, qw, config=dataclasses.replace(_tc(), path="persistent"))
    with pytest.raises(ValueError, match="scale_after belongs to the int4 kernel"):
        wq.matmul_w8(x, q8, config=_streamk(bk=32))
    with pytest.raises(ValueError, match="path must be one of"):
        wq.matmul_w8(x, q8, path=["tc"])


# ---------------------------------------------------------------------------------------------------
# Launch plans: the host work of a call done once per weight and kind of call
# ---------------------------------------------------------------------------------------------------


def test_plans_hit_and_miss(device, monkeypatch):
    """A repeated call takes its plan without the checks; another M, leading dims, alignment, bias, path
    or weight misses; each result right."""
    qw = wq.quantize(_weight(40, 128).to(device), 32)
    bias = _x((40,), seed=2).to(device)
    firsts = []
    real = launcher._first_call
    monkeypatch.setattr(launcher, "_first_call", lambda *a: firsts.append(a[5]) or real(*a))
    buf = _x((8, 136)).to(device)
    calls = [
        (buf[:3, :128], None, None, True),  # new
        (buf[:3, :128], None, None, False),  # the same kind: a hit
        (buf[3:6, :128], None, None, False),  # other rows, same strides, 16-byte aligned (3 · 136 · 2 bytes)
        (buf[:3, 1:129], None, None, True),  # not 16-byte aligned: Triton specialises on that
        (buf[:5, :128], None, None, True),  # another M
        (buf[:4, :128].reshape(2, 2, 128), None, None, True),  # leading dims
        (buf[:3, :128], bias, None, True),  # a bias
        (buf[:3, :128], bias, "streamk", True),  # a path
    ]
    for x, b, path, new in calls:
        before = len(firsts)
        out = wq.matmul(x, qw, b, path=path)
        assert len(firsts) == before + new, (tuple(x.shape), x.data_ptr() % 16, b is not None, path)
        _check(x, qw, b, out, f"plan {tuple(x.shape)} {path}")
    assert len(qw.plans) == sum(new for *_, new in calls)
    other = wq.quantize(_weight(40, 128, seed=5).to(device), 32)
    before = len(firsts)
    _check(buf[:3, :128], other, None, wq.matmul(buf[:3, :128], other), "another weight")
    assert len(firsts) == before + 1 and len(other.plans) == 1


def test_plans_hold_tensors_not_addresses(device):
    """No stale pointers: a plan holds the weight's tensors, so new values written into them are read by the
    next call; a copy of the weight with other tensors (dataclasses.replace) starts without plans; a weight
    freed and another made in its place (perhaps at its address) is planned afresh."""
    qw = wq.quantize(_weight(40, 128).to(device), 32)
    x = _x((2, 128)).to(device)
    wq.matmul(x, qw, path="streamk")
    new = wq.quantize(_weight(40, 128, seed=9).to(device), 32)
    qw.packed.copy_(new.packed)
    qw.scale_zero.copy_(new.scale_zero)
    _check(x, new, None, wq.matmul(x, qw, path="streamk"), "values written into the planned tensors")
    swapped = dataclasses.replace(qw, packed=torch.zeros_like(qw.packed))
    assert swapped.plans == {} and len(qw.plans) == 1
    _check(x, swapped, None, wq.matmul(x, swapped, path="streamk"), "a replaced weight")
    for seed in range(3):
        del qw
        gc.collect()
        qw = wq.quantize(_weight(40, 128, seed=20 + seed).to(device), 32)
        _check(x, qw, None, wq.matmul(x, qw), f"weight {seed} made after the last was freed")


ALLOCATORS = ("empty", "zeros", "empty_like", "zeros_like", "full", "empty_strided")
TENSOR_ALLOCATORS = ("new_empty", "new_zeros", "new_full", "new_tensor", "clone", "contiguous")


def test_a_hit_allocates_only_the_output(device, monkeypatch):
    """A repeated call allocates its output and nothing else on the host's side (no partial-sum buffer: int8's
    split-K too), then launches its kernels (counted with the launch itself stubbed: the interpreter copies
    tensors of its own); the real call's result is right."""
    from kernels import _launch

    for weight, call in (
        (wq.quantize(_weight(40, 384).to(device), 32), wq.matmul),
        (wq.quantize_w8(_weight(40, 384).to(device)), wq.matmul_w8),
    ):
        x = _x((2, 384)).to(device)
        cfg = wq.W4A16Config(16, 32, 128 if call is wq.matmul else 32, 3, 4, 1, call is wq.matmul)
        kinds = (({"path": "streamk"}, 1), ({"path": "tc"}, 1), ({"config": cfg}, 1 if call is wq.matmul else 2))
        for path_args, launches in kinds:
            _check(x, weight, None, call(x, weight, **path_args), f"{call.__name__} {path_args}")
            made, launched = [], []
            for owner, names in ((torch, ALLOCATORS), (torch.Tensor, TENSOR_ALLOCATORS)):
                for name in names:
                    real = getattr(owner, name)
                    monkeypatch.setattr(
                        owner, name, lambda *a, _r=real, _n=name, _m=made, **k: _m.append(_n) or _r(*a, **k)
                    )
            monkeypatch.setattr(
                _launch.Prepared, "__call__", lambda self, args, stream=0, _l=launched: _l.append(self.fn)
            )
            call(x, weight, **path_args)
            monkeypatch.undo()
            assert made == ["new_empty"] and len(launched) == launches, (call.__name__, path_args, made, launched)


def test_plans_are_bounded(device, monkeypatch):
    monkeypatch.setattr(plans, "MAX_PLANS", 3)
    qw = wq.quantize(_weight(40, 128).to(device), 32)
    for m in range(1, 6):
        wq.matmul(_x((m, 128)).to(device), qw)
    assert len(qw.plans) == 3 and {key[0][0] for key in qw.plans} == {3, 4, 5}  # the oldest dropped first


def test_bad_input_after_a_hit_is_still_refused(device):
    """Checks skipped on a hit are those the key makes redundant: a call of another kind is checked in full."""
    qw = wq.quantize(_weight(40, 128).to(device), 32)
    x = _x((3, 128)).to(device)
    wq.matmul(x, qw, torch.zeros(40, dtype=F16, device=device))
    with pytest.raises(ValueError, match="bias must have shape"):
        wq.matmul(x, qw, torch.zeros(41, dtype=F16, device=device))
    with pytest.raises(TypeError, match="x dtype"):
        wq.matmul(x.double(), qw)
    with pytest.raises(TypeError, match="bias must be a torch.Tensor"):
        wq.matmul(x, qw, [0.0] * 40)
    with pytest.raises(TypeError, match="W4Weight"):
        wq.matmul(x, wq.quantize_w8(_weight(40, 128).to(device)))


# ---------------------------------------------------------------------------------------------------
# On a GPU, and compiled for one
# ---------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["tc", "streamk"])
@pytest.mark.parametrize("m", [1, 63, 65, 1000])
def test_paths_bf16_on_gpu(path, m):
    """bf16 on the GPU's default configs of each candidate; on Hopper the tc path's descriptors and its
    pointer loads give the same bits."""
    qw = wq.quantize(_weight(4096 + 40, 2048 + 96, BF16).cuda(), 32)
    x = _x((m, 2048 + 96), BF16).cuda()
    bias = _x((4096 + 40,), BF16, seed=2).cuda()
    out = wq.matmul(x, qw, bias, path=path)
    _check(x, qw, bias, out, f"bf16 {path} M={m}")
    q8 = wq.quantize_w8(_weight(4096 + 40, 2048 + 96, BF16).cuda())
    _check(x, q8, bias, wq.matmul_w8(x, q8, bias, path=path), f"bf16 w8 {path} M={m}")
    if path == "tc":
        cfg = wq.choose_config(m, 4096 + 40, 2048 + 96, path="tc")
        assert torch.equal(out, wq.matmul(x, qw, bias, config=dataclasses.replace(cfg, tma=False)))


_COMPILE_SCRIPT = textwrap.dedent(
    """
    import re, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from kernels.w4a16 import streamk_kernels, tc_kernels, w4a16_config

    path, bits, m, tma = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
    cfg = w4a16_config.choose_config(m, 4096, 4096, interpret=False, bits=bits, path=path)
    fn = tc_kernels._wq_tc_kernel if path == "tc" else streamk_kernels._wq_streamk_kernel
    consts = dict(BITS=bits, GROUP=128 if bits == 4 else 1, SYMMETRIC=bits == 8, TAIL_WORDS=0,
                  DEQ=3 if cfg.scale_after else 0, MAGIC=0x6400, USE_ASM=bits == 4, BLOCK_M=cfg.block_m,
                  BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k)
    if path == "tc":
        consts.update(USE_TMA=tma, GROUP_N=cfg.group_n)
    pointers = {"X": "*fp16", "W": "*i32" if bits == 4 else "*i8", "S": "*i32" if bits == 4 else "*fp16",
                "Out": "*fp16", "Part": "*fp32", "Cnt": "*i32"}
    sig, cons = {}, {}
    for i, n in enumerate(fn.arg_names):
        if n in consts:
            sig[n], cons[(i,)] = "constexpr", consts[n]
        elif n in ("Z", "Bias"):
            sig[n], cons[(i,)] = "constexpr", None
        elif n in ("stride_xk", "stride_wc", "stride_sn"):  # contiguous: pinned 1
            sig[n], cons[(i,)] = "constexpr", 1
        elif n in ("stride_zn", "stride_zg") or (bits == 8 and n == "stride_sg"):
            sig[n], cons[(i,)] = "constexpr", 0
        else:
            sig[n] = pointers.get(n, "i32")
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n] != "constexpr" and n not in ("M", "steps", "units")}
    kernel = triton.compile(triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=cons, attrs=attrs),
                            target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    ptx = kernel.asm["ptx"]
    loop = kernel.asm["ttgir"].split("scf.for")[-1].split("scf.yield", 1)[0]
    print("scratch", kernel.metadata.global_scratch_size)
    print("tma", ptx.count("cp.async.bulk.tensor"))
    print("pairs", ptx.count("sub.rn.f16x2"))
    print("loop-converts", loop.count("ttg.convert_layout"))
    print("local", ptx.count("ld.local") + ptx.count("st.local"))
    print(sorted(set(re.findall(r"(?:wgmma\\.mma_async\\.sync|mma\\.sync)\\.aligned\\.[\\w.]+", ptx))))
    """
)


@pytest.mark.parametrize(
    "path, bits, m, tma",
    [
        ("tc", 4, 512, True),
        ("tc", 4, 64, False),
        ("tc", 8, 512, True),
        ("streamk", 4, 1, False),
        ("streamk", 8, 16, False),
    ],
    ids=["tc-w4-tma", "tc-w4-pointers", "tc-w8-tma", "streamk-w4", "streamk-w8"],
)
def test_candidates_compile_for_sm90(path, bits, m, tma):
    """Each candidate builds for sm_90 with its default Hopper config: f16 wgmma with the dequantised weight as
    the register operand, no local memory; the int4 kernels with the PTX pairs and no layout conversion in
    the K loop; with tma, bulk tensor copies and device-made descriptors (global scratch); without, neither."""
    if "nvidia" not in triton.backends.backends:
        pytest.skip("this Triton has no NVIDIA backend to compile with")
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    run = subprocess.run(
        [sys.executable, "-c", _COMPILE_SCRIPT, path, str(bits), str(m), "1" if tma else "0"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    counts = {line.split()[0]: int(line.split()[1]) for line in lines[:-1]}
    found = ast.literal_eval(lines[-1])
    assert counts["local"] == 0, run.stdout
    assert found and all(f.startswith("wgmma") and ".f16.f16" in f for f in found), found
    assert (counts["tma"] > 0) == tma and (counts["scratch"] > 0) == tma, run.stdout
    if bits == 4:
        assert counts["pairs"] > 0 and counts["loop-converts"] == 0, run.stdout
