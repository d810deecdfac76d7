"""Launch configurations of the W4A16 / W8A16 kernels and the heuristic that picks one.

``choose_config(m, n, k)`` is deterministic (tests pin what runs; ``matmul(..., config=)`` pins a launch). On
a GPU it takes the row of ``W4_GPU_TABLE`` (``W8_GPU_TABLE`` for int8) for the smallest M bound ≥ m and
works the split count out from the grid; the rows were chosen from sweeps on an H200 (bf16, group 128,
Llama-3 layer shapes):

- M ≤ 16 (decode, bound by reading the weights): the swapped tensor-core kernel with the scale after the
  product, 128 output channels × 128 inputs per step, 4 warps, 4 stages, split-K to about 4 programs per
  SM; x's ≤ 16 rows are the 16-wide N side of wgmma m64n16k16.
- 16 < M ≤ 64: the same with 64-row tiles of x, 2 waves.
- M > 64: 256 output channels × 128 rows of x per tile, swapped (the dequantised weight is wgmma's register
  operand and is never written to shared memory), 8 warps, 3 stages, the scale before the product (a
  second accumulator per group would need another 128 registers per thread); up to M = 256 K is split to
  about one program per SM.

In the interpreter: small tiles, so that a CPU run stays short while still crossing several tiles.
That is the default path (``"tiled"``: one output tile per program, K split where the grid is short). Two
candidate paths have configurations of their own (``choose_config(..., path=...)``), guesses from the same
sweep's shapes, not yet measured: ``"tc"`` (``tc_kernels``: a persistent tensor-core GEMM for M ≥ 64, its
words and x through TMA descriptors on Hopper) and ``"streamk"`` (``streamk_kernels``: decoding in equal runs
of tile × K units). ``choose_path`` is the heuristic that would pick among the three by (M, N, K); it is not
used unless asked for (``path="auto"``) until a GPU run has measured the paths side by side (docs/limits.md).

Tested: tests/kernels/test_w4a16.py (``test_path_choice``, pinned configurations against each other) and
tests/kernels/test_w4a16_paths.py (the candidates and the heuristic).
"""

from __future__ import annotations

import dataclasses
import functools

import triton

from kernels._runtime import INTERPRET
from kernels.w4a16.formats import PACK_BLOCK

SMALL_M = 16  # at most this many rows of x take the split-K path


@dataclasses.dataclass(frozen=True)
class W4A16Config:
    """One launch: tile sizes, the number of K slices (1: no split-K), warps and pipeline depth.

    swap_ab (int4 tensor-core path only): compute ``outᵀ = W · xᵀ``, the dequantised weight being the MMA's
    first operand (the one Hopper's wgmma, and mma.sync, take from registers) and the rows of x its N
    dimension. For int4, block_k is a multiple of 128
    (whole packing blocks per loop step). scale_after (int4 tensor-core path, 16-bit x with 16-bit scales):
    the MMA multiplies ``q − z`` (exact in 16 bits) and each group's fp32 sum is then multiplied by its
    scale, instead of multiplying every weight by it. asm: where the GPU allows (sm_90), dequantise with
    PTX on pairs of 16-bit values (``_w4_dequant_sz``); False keeps the plain-Triton form (the same bits).

    path: the kernel, one of ``PATHS`` (the module docstring). ``"tc"`` and ``"streamk"`` always run the
    swapped product (swap_ab must be True) and ignore split_k; ``"tc"`` has no scale_after, and for int4 steps
    one 128-input block at a time (block_k is its int8 step). tma (``"tc"``):
    load the packed words and x through tensor descriptors where the layouts allow it (x's rows and the
    words' rows 16-byte aligned and contiguous; a GPU of compute capability ≥ 9.0, or the interpreter),
    masked pointer loads otherwise. programs_per_sm (``"tc"``, ``"streamk"``): the persistent grid's
    programs per multiprocessor. group_n (``"tc"``): weight tiles per group of the tile order.
    """

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    swap_ab: bool = False
    scale_after: bool = False
    asm: bool = True
    path: str = "tiled"
    tma: bool = False
    programs_per_sm: int = 1
    group_n: int = 8


PATHS = ("tiled", "tc", "streamk")  # the kernels a config names (the module docstring)


DEFAULT_SM_COUNT = 132  # H100/H200 SXM; the device's own count is used when there is one

# The GPU defaults for int4, by M: (largest M, block_m, block_n, block_k, num_warps, num_stages, swap_ab,
# waves, scale_after). waves > 0: split K so that the grid has about waves × SMs programs (each slice keeps
# at least two 128-input blocks); 0: no split. Chosen from an H200 sweep (choose_config's docstring).
W4_GPU_TABLE: tuple[tuple[int, int, int, int, int, int, bool, int, bool], ...] = (
    (16, 16, 128, 128, 4, 4, True, 4, True),
    (64, 64, 128, 128, 4, 4, True, 2, True),
    (256, 128, 256, 128, 8, 3, True, 1, False),
    (2**62, 128, 256, 128, 8, 3, True, 0, False),
)
W8_GPU_TABLE: tuple[tuple[int, int, int, int, int, int, bool, int], ...] = (
    (16, 16, 64, 128, 4, 4, False, 2),
    (2**62, 128, 128, 64, 8, 3, False, 0),
)


# The candidates' GPU configurations, by M (largest M, block_m, block_n, block_k, num_warps, num_stages,
# programs_per_sm): guesses from the tiled path's sweep, to be swept on a GPU, with as many programs per SM as
# the registers and shared memory of the sm_90 build allow. tc: 64 or 128 rows of x per tile (the wgmma N
# side), the tiled GEMM's 256-channel tiles at large M (8 warps, about 230 registers a thread, 133 KB: one
# program; int4 at M ≤ 64: 4 warps, 140 registers, 92 KB: two). streamk: the decode tiles, two 128-input
# blocks (128 bytes of words per row) per unit (M ≤ 16: 4 warps, about 210 registers, 58 KB: two; larger M:
# 8 warps, or 64-wide tiles for int8, which spill at 4 warps otherwise, 130 KB: one).
TC_GPU_TABLE = {
    4: ((64, 64, 128, 128, 4, 4, 2), (2**62, 128, 256, 128, 8, 3, 1)),
    8: ((64, 64, 128, 128, 4, 4, 1), (2**62, 128, 256, 64, 8, 3, 1)),
}
STREAMK_GPU_TABLE = {
    4: ((16, 16, 128, 256, 4, 3, 2), (2**62, 64, 128, 256, 8, 3, 1)),
    8: ((16, 16, 64, 256, 4, 3, 2), (2**62, 64, 64, 256, 4, 3, 1)),
}


def _split_for(tiles: int, k_units: int, waves: int, min_units: int, sm_count: int) -> int:
    if waves <= 0:
        return 1
    return max(1, min(max(1, k_units // min_units), triton.cdiv(waves * sm_count, tiles)))


def choose_config(
    m: int,
    n: int,
    k: int,
    *,
    sm_count: int = DEFAULT_SM_COUNT,
    interpret: bool = INTERPRET,
    bits: int = 4,
    path: str = "tiled",
) -> W4A16Config:
    """The launch for an ``[m, k] @ [k, n]`` product on ``path``: deterministic, so tests can pin what runs
    (cached).

    ``"tiled"`` on a GPU: the row of ``W4_GPU_TABLE`` (``W8_GPU_TABLE`` for ``bits=8``) for the smallest M
    bound ≥ m, with the split count worked out from the grid (the module docstring says why each row);
    ``"tc"`` / ``"streamk"``: the rows of ``TC_GPU_TABLE`` / ``STREAMK_GPU_TABLE``; in the interpreter, small
    tiles. ``path="auto"`` takes ``choose_path``'s choice.
    """
    if path == "auto":
        path = choose_path(m, n, k, sm_count=sm_count, bits=bits)
    if path == "tiled":
        return config_for(m, n, k, sm_count, interpret, bits)
    return candidate_config(m, path, interpret, bits)


def choose_path(m: int, n: int, k: int, *, sm_count: int = DEFAULT_SM_COUNT, bits: int = 4) -> str:
    """The path the heuristic would take for ``[m, k] @ [k, n]``: NOT ADOPTED (``matmul`` runs ``"tiled"``
    unless asked for ``path="auto"``): a guess, to be replaced by what a GPU run measures side by side
    (docs/limits.md).

    Decoding (m ≤ 16) on ``"streamk"`` when the layer has at least two units of work per program to share
    (else the tiled split-K grid already fills the GPU); ``"tc"`` from m = 64 when there are at least half as
    many output tiles as multiprocessors (a persistent grid with fewer tiles leaves SMs idle, where the
    tiled path splits K); ``"tiled"`` otherwise.
    """
    if m <= SMALL_M:
        _, bm, bn, bk, _, _, per_sm = STREAMK_GPU_TABLE[bits][0]
        units = triton.cdiv(n, bn) * triton.cdiv(k, bk)
        return "streamk" if units >= 2 * per_sm * sm_count else "tiled"
    if m >= 64:
        _, bm, bn, *_ = next(row for row in TC_GPU_TABLE[bits] if m <= row[0])
        tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
        return "tc" if 2 * tiles >= sm_count else "tiled"
    return "tiled"


@functools.lru_cache(maxsize=1024)
def candidate_config(m: int, path: str, interpret: bool, bits: int) -> W4A16Config:
    """The configuration of a candidate path (``"tc"``, ``"streamk"``) for m rows (module docstring)."""
    if path not in ("tc", "streamk"):
        raise ValueError(f"path must be one of {PATHS} or 'auto', got {path!r}")
    if interpret:
        block_k = 128 if bits == 4 else 32
        if path == "tc":
            return W4A16Config(16, 32, block_k, 1, 4, 1, True, path=path, tma=True, group_n=2)
        return W4A16Config(16, 16, block_k, 1, 4, 1, True, bits == 4, path=path, programs_per_sm=1)
    table = TC_GPU_TABLE if path == "tc" else STREAMK_GPU_TABLE
    _, bm, bn, bk, nw, ns, per_sm = next(row for row in table[bits] if m <= row[0])
    after = path == "streamk" and bits == 4
    return W4A16Config(bm, bn, bk, 1, nw, ns, True, after, path=path, tma=path == "tc", programs_per_sm=per_sm)


@functools.lru_cache(maxsize=4096)
def config_for(m: int, n: int, k: int, sm_count: int, interpret: bool, bits: int) -> W4A16Config:
    """``choose_config`` with positional arguments, cached: what the launcher calls on every launch."""
    if interpret:
        block_k = 128 if bits == 4 else 32
        if m <= SMALL_M:
            split = max(1, min(4, k // block_k))
            return W4A16Config(16, 32, block_k, split, 4, 1, bits == 4, bits == 4)
        return W4A16Config(32, 32, block_k, 1, 4, 1)
    if bits == 4:
        _, bm, bn, bk, nw, ns, swap, waves, after = next(row for row in W4_GPU_TABLE if m <= row[0])
    else:
        _, bm, bn, bk, nw, ns, swap, waves = next(row for row in W8_GPU_TABLE if m <= row[0])
        after = False
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    split = _split_for(tiles, k // bk, waves, 2 if bits == 4 and bk == 128 else 1, sm_count)
    return W4A16Config(bm, bn, bk, split, nw, ns, swap, after)


def check_config(cfg: W4A16Config, bits: int) -> None:
    """Refuse a configuration the kernels cannot run: tile sizes, the packing block, the split."""
    for name in ("block_m", "block_n", "block_k"):  # tl.dot: power-of-two tiles of at least 16
        value = getattr(cfg, name)
        if value < 16 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two ≥ 16, got {value} in {cfg}")
    if bits == 4 and cfg.block_k % PACK_BLOCK:
        raise ValueError(f"block_k must be a multiple of the packing block {PACK_BLOCK} for int4, got {cfg}")
    if cfg.scale_after and bits != 4:
        raise ValueError(f"scale_after belongs to the int4 kernel, got {cfg} for int{bits}")
    if cfg.split_k < 1 or cfg.num_warps < 1 or cfg.num_stages < 1:
        raise ValueError(f"split_k, num_warps and num_stages must be ≥ 1, got {cfg}")
    if cfg.path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {cfg.path!r} in {cfg}")
    if cfg.programs_per_sm < 1 or cfg.group_n < 1:
        raise ValueError(f"programs_per_sm and group_n must be ≥ 1, got {cfg}")
    if cfg.path != "tiled" and not cfg.swap_ab:
        raise ValueError(f"path {cfg.path!r} runs the swapped product only: swap_ab must be True, got {cfg}")
    if cfg.path == "tc" and cfg.scale_after:
        raise ValueError(f"scale_after is not available on path 'tc' (the scale goes before the product), got {cfg}")
    if cfg.tma and cfg.path != "tc":
        raise ValueError(f"tma belongs to path 'tc', got {cfg}")
