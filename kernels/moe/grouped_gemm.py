"""Grouped GEMM in Triton: one launch multiplies each expert's contiguous segment of rows by its own matrix.

What it is: ``out[r] = a[r] @ b[e]`` for every row ``r`` of expert ``e``'s segment, with torch._grouped_mm's
conventions: ``a [total_rows, K]`` sorted by expert, ``b [E, K, N]``, ``expert_offsets [E]`` int32
cumulative END offsets (expert ``e`` owns rows ``[offsets[e-1], offsets[e])``, the last offset is
``total_rows``), output ``[total_rows, N]``. The grid is (row tiles over all segments, N tiles): each
expert's segment is cut into ``ceil(count / BLOCK_M)`` tiles, and a small tile → (expert, first row) map,
built on the device with torch ops from the offsets (no host read-back), tells each program which
expert it serves. The grid's row extent is the host-known bound ``ceil(total_rows / BLOCK_M) + E``
(every segment adds at most one partial tile); programs past the last tile return at once, and an empty
expert has no tile, so it costs nothing. Rows past a segment's end, columns past N and the K tail are
masked, so any segment length and any K, N work. fp32 accumulation; the output has the inputs' dtype.

An optional epilogue (``swiglu_b``) fuses a SwiGLU expert's first layer: the program keeps two fp32
accumulators, ``a @ b[e]`` (gate) and ``a @ swiglu_b[e]`` (up), and writes ``silu(gate) · up``, so the
gate and up products never go to memory.

Handles: float16 and bfloat16 on the GPU; float32 (IEEE products, not TF32) as a testing mode; arbitrary
strides. Does not handle: a transposed ``b`` layout flag, split-K, per-expert scales (FP8), or
autotuning (one configuration per dtype; ``config=`` pins another).

Tested: in Triton's interpreter on CPU (float16, float32; odd K, N and segment lengths:
tests/kernels/test_moe.py) and compiled, not run, for sm_90 with the GPU default tiles, float16 and
bfloat16, plain and fused (wgmma only, fp32 accumulation, 96 KiB of shared memory; 16-divisible sizes
and strides assumed). Not yet run on a GPU.

Layers, top to bottom: the ``@triton.jit`` kernel; configuration; the tile map and the launcher
checks; the public function ``grouped_gemm`` (allocation, grid, launch).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels._runtime import INTERPRET, check_device

__all__ = ["GroupedGemmConfig", "TileMap", "default_config", "grouped_gemm", "tile_map"]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ---------------------------------------------------------------------------------------------------
# Kernel
# ---------------------------------------------------------------------------------------------------


@triton.jit
def _grouped_gemm_kernel(
    A,  # [rows, K], rows sorted by expert
    B,  # [E, K, N]
    B2,  # [E, K, N]: the up projection when FUSE_SWIGLU, else unused
    C,  # [rows, N]
    TileExpert,  # [max_tiles] int32: expert of each row tile, -1 past the last tile
    TileRow,  # [max_tiles] int32: first row of each row tile
    Offsets,  # [E] int32: cumulative end offsets of the segments
    N,
    K,
    stride_am,
    stride_ak,
    stride_be,
    stride_bk,
    stride_bn,
    stride_b2e,
    stride_b2k,
    stride_b2n,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FUSE_SWIGLU: tl.constexpr,
    IS_FP32: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(TileExpert + pid_m)
    if expert < 0:  # past the last tile of the last non-empty expert
        return
    row_start = tl.load(TileRow + pid_m)
    row_end = tl.load(Offsets + expert)

    # int64 row offsets: rows · stride passes 2^31 at a few hundred thousand rows of a wide hidden size
    offs_m = (row_start + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < row_end
    mask_n = offs_n < N

    a_ptrs = A + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    e64 = expert.to(tl.int64)
    b_ptrs = B + e64 * stride_be + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if FUSE_SWIGLU:
        b2_ptrs = B2 + e64 * stride_b2e + offs_k[:, None] * stride_b2k + offs_n[None, :] * stride_b2n
        acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)

    for k0 in range(0, K, BLOCK_K):
        mask_k = offs_k < K - k0
        a = tl.load(a_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        if IS_FP32:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        if FUSE_SWIGLU:
            b2 = tl.load(b2_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
            if IS_FP32:
                acc2 = tl.dot(a, b2, acc2, input_precision="ieee")
            else:
                acc2 = tl.dot(a, b2, acc2)
            b2_ptrs += BLOCK_K * stride_b2k
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    if FUSE_SWIGLU:
        # silu(gate) · up on the fp32 accumulators: the gate is not rounded before the nonlinearity
        acc = acc / (1.0 + tl.exp(-acc)) * acc2
    c_ptrs = C + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


# ---------------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GroupedGemmConfig:
    """One launch configuration: tile sizes and the compiler's warps and pipeline depth."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two ≥ 16 (tl.dot's minimum), got {value}")


def default_config(dtype: torch.dtype, fuse_swiglu: bool = False) -> GroupedGemmConfig:
    """The configuration used when none is pinned.

    In the interpreter: 16×16×16 tiles, short CPU runs that still cross several tiles of every dimension.
    On a GPU: 128×128×64 with 8 warps (two warpgroups, Hopper's wgmma shape) and 3 stages, a common
    starting point for Hopper GEMMs, not yet tuned here; the fused SwiGLU epilogue keeps two
    accumulators and two B tiles per stage, so it uses 128×64 tiles; float32 tiles are twice as wide in
    bytes, so they use 64×64×32. Sweeping these on an H200 is left to a GPU session.
    """
    if INTERPRET:
        return GroupedGemmConfig(16, 16, 16, 4, 1)
    if dtype == torch.float32:
        return GroupedGemmConfig(64, 64, 32, 4, 2)
    if fuse_swiglu:
        return GroupedGemmConfig(128, 64, 64, 8, 3)
    return GroupedGemmConfig(128, 128, 64, 8, 3)


# ---------------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------------


class TileMap(NamedTuple):
    """The row tiles of every segment: ``tile_expert[t]`` (-1 past the last tile) and ``tile_row[t]``,
    both int32 ``[ceil(total_rows / block_m) + E]``, for tiles of ``block_m`` rows."""

    tile_expert: torch.Tensor
    tile_row: torch.Tensor
    block_m: int


def tile_map(expert_offsets: torch.Tensor, total_rows: int, block_m: int) -> TileMap:
    """The row tiles of every segment, built on the device with torch ops (no host read-back).

    ``max_tiles = ceil(total_rows / block_m) + E`` (a host-known bound). Tile ``t`` belongs to expert
    ``tile_expert[t]`` and starts at row ``tile_row[t]``; tiles past the last are marked expert -1.
    Several grouped GEMMs over the same segments and ``block_m`` can share one map (``moe_ffn`` does).
    """
    num_experts = expert_offsets.numel()
    ends = expert_offsets.long()
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    tiles = (counts + block_m - 1) // block_m
    tile_ends = torch.cumsum(tiles, 0)
    max_tiles = triton.cdiv(total_rows, block_m) + num_experts
    t = torch.arange(max_tiles, device=ends.device)
    expert = torch.searchsorted(tile_ends, t, right=True)  # the first expert whose tiles end after t
    valid = expert < num_experts
    e = expert.clamp(max=num_experts - 1)
    tile_row = (ends - counts)[e] + (t - (tile_ends - tiles)[e]) * block_m
    tile_expert = torch.where(valid, expert, -1)
    return TileMap(tile_expert.to(torch.int32), torch.where(valid, tile_row, 0).to(torch.int32), block_m)


def _check_inputs(
    a: torch.Tensor, b: torch.Tensor, expert_offsets: torch.Tensor, b2: torch.Tensor | None, check_offsets: bool
) -> None:
    named = [("a", a), ("b", b), ("expert_offsets", expert_offsets)] + ([("swiglu_b", b2)] if b2 is not None else [])
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if a.dim() != 2:
        raise ValueError(f"a must be [total_rows, K], got shape {tuple(a.shape)}")
    if b.dim() != 3:
        raise ValueError(f"b must be [E, K, N], got shape {tuple(b.shape)}")
    if b.shape[0] == 0:
        raise ValueError("b has no experts (E = 0)")
    if a.shape[1] != b.shape[1]:
        raise ValueError(
            f"a's K ({a.shape[1]}) does not match b's K ({b.shape[1]}): a {tuple(a.shape)}, b {tuple(b.shape)}"
        )
    if b2 is not None and b2.shape != b.shape:
        raise ValueError(f"swiglu_b must have b's shape {tuple(b.shape)}, got {tuple(b2.shape)}")
    if a.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"a has dtype {a.dtype}; supported: float16, bfloat16, float32")
    for name, t in named[1:2] + named[3:]:
        if t.dtype != a.dtype:
            raise TypeError(f"{name} must have a's dtype {a.dtype}, got {t.dtype}")
    if expert_offsets.dtype != torch.int32:
        raise TypeError(f"expert_offsets must be int32 (torch._grouped_mm's convention), got {expert_offsets.dtype}")
    if expert_offsets.shape != (b.shape[0],):
        raise ValueError(f"expert_offsets must be [E] = [{b.shape[0]}], got shape {tuple(expert_offsets.shape)}")
    check_device(*(t for _, t in named), names=tuple(n for n, _ in named))
    if a.dtype == torch.bfloat16 and a.device.type == "cpu":
        # Triton's interpreter mis-computes tl.dot on bfloat16 (triton-lang/triton#11584)
        raise TypeError("bfloat16 is not supported in Triton's interpreter (wrong tl.dot results); use float16")
    if a.dtype == torch.bfloat16 and a.device.type == "cuda" and torch.cuda.get_device_capability(a.device)[0] < 8:
        raise TypeError("bfloat16 needs a GPU of compute capability 8.0 or newer")
    if check_offsets:  # reads the offsets back: one device-to-host synchronisation
        offsets = expert_offsets.cpu().long()
        if (offsets < 0).any() or (offsets.diff() < 0).any():
            raise ValueError(f"expert_offsets must be non-negative and non-decreasing, got {offsets.tolist()}")
        if offsets[-1].item() != a.shape[0]:
            raise ValueError(
                f"expert_offsets must end at total_rows = {a.shape[0]} (cumulative END offsets), "
                f"got last offset {offsets[-1].item()}"
            )


def grouped_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    expert_offsets: torch.Tensor,
    *,
    swiglu_b: torch.Tensor | None = None,
    config: GroupedGemmConfig | None = None,
    check_offsets: bool = True,
    tiles: TileMap | None = None,
) -> torch.Tensor:
    """``out[r] = a[r] @ b[e]`` for the rows ``r`` of each expert ``e``'s segment, in one launch.

    ``a [total_rows, K]`` sorted by expert, ``b [E, K, N]``, ``expert_offsets [E]`` int32 cumulative END
    offsets (last = total_rows), all on one device with one dtype (float16, bfloat16; float32 as a
    testing mode). Returns ``[total_rows, N]`` in that dtype, accumulated in fp32.

    ``swiglu_b [E, K, N]``: fuse a SwiGLU expert's first layer, returning ``silu(a @ b[e]) · (a @ swiglu_b[e])``.
    ``check_offsets``: verify the offsets' values (non-negative, non-decreasing, last = total_rows),
    which reads them back to the host; pass False when they come from ``routing.dispatch`` and the
    launch must not synchronise. Unchecked bad offsets give wrong results or out-of-bounds reads.
    ``tiles``: a ``tile_map(expert_offsets, total_rows, config.block_m)`` built earlier, to share it
    between GEMMs over the same segments (its ``block_m`` must be the configuration's).
    Raises ``ValueError`` / ``TypeError`` on bad shapes, dtypes, devices or offsets.
    """
    _check_inputs(a, b, expert_offsets, swiglu_b, check_offsets)
    fuse = swiglu_b is not None
    cfg = config or default_config(a.dtype, fuse)
    rows, k = a.shape
    num_experts, _, n = b.shape
    out = torch.empty((rows, n), device=a.device, dtype=a.dtype)
    if rows == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()  # an empty sum; with the SwiGLU epilogue silu(0) · 0 = 0 as well
    if tiles is None:
        tiles = tile_map(expert_offsets, rows, cfg.block_m)
    elif tiles.block_m != cfg.block_m or tiles.tile_expert.numel() != triton.cdiv(rows, cfg.block_m) + num_experts:
        raise ValueError(
            f"tiles were built for block_m = {tiles.block_m} and {tiles.tile_expert.numel()} tiles; this launch "
            f"uses block_m = {cfg.block_m} over {rows} rows and {num_experts} experts"
        )
    b2 = swiglu_b if fuse else b
    grid = (tiles.tile_expert.numel(), triton.cdiv(n, cfg.block_n))
    _grouped_gemm_kernel[grid](
        a, b, b2, out, tiles.tile_expert, tiles.tile_row, expert_offsets,
        n, k,
        a.stride(0), a.stride(1),
        b.stride(0), b.stride(1), b.stride(2),
        b2.stride(0), b2.stride(1), b2.stride(2),
        out.stride(0), out.stride(1),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        FUSE_SWIGLU=fuse, IS_FP32=a.dtype == torch.float32,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out
