"""The ``@triton.jit`` kernels of the grouped GEMM (launched by ``kernels.moe.grouped_gemm``).

``_grouped_gemm_kernel`` (``path="grouped"``, the default): one program per possible tile, the grid sized on
the host by a bound (every expert may add a partial tile), programs past the last real tile returning at
once; masked pointer loads. ``_grouped_persistent_kernel`` (``path="persistent"``, a candidate for large
token counts, not yet timed on a GPU): a fixed grid (programs per multiprocessor × SMs) walks the real
tiles, ``pid, pid + P, …`` of all experts' row tiles × N tiles. With USE_TMA (Hopper, layouts that allow
it) each tile's operands come through tensor descriptors made on the device for its expert segment: A's and
C's rows of that segment only (the hardware clips loads and stores at the segment's end, so no row of
another expert is written) and the expert's B (and the up projection's); otherwise the same masked pointer
loads as the default (``_pointer_tile``). Both take tiles in the grouped order (``kernels._tiling``: GROUP_M
row tiles sweep the N tiles together, so that their A rows and each B panel are read from HBM about once),
find each tile's expert from the offsets alone (``_tile_map``, ``_segment_rows``), read nothing back to the
host and fuse the SwiGLU epilogue. Tested in the interpreter (tests/kernels/test_moe.py,
test_moe_persistent.py: both load forms) and compiled for sm_90 on the CPU; the default also on an H200.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels._tiling import grouped_order


@triton.jit
def _grouped_gemm_kernel(
    A,  # [rows, K], rows sorted by expert
    B,  # [E, K, N]
    B2,  # [E, K, N]: the up projection when FUSE_SWIGLU, else unused
    C,  # [rows, N]
    Offsets,  # [E] int32: cumulative end offsets of the segments (any stride)
    stride_off,
    num_experts,
    max_tiles,  # ceil(rows / BLOCK_M) + E: a host-known bound on the row tiles of all segments
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
    E_POW2: tl.constexpr,  # next power of two ≥ num_experts
    GROUP_M: tl.constexpr,  # row tiles per group of the grouped program order
):
    """One (row tile, N tile) of the grouped product. The row tiles are each expert's segment cut into
    ceil(count / BLOCK_M) tiles, laid end to end in expert order; a program finds its expert and first row
    from a prefix sum of the E tile counts (in registers). ``max_tiles`` bounds the row tiles on the host
    (every segment adds at most one partial tile): programs past the last one return at once. Rows past a
    segment's end, columns past N and the K tail are masked; fp32 accumulation, the output in the inputs'
    dtype."""
    pid_m, pid_n = grouped_order(tl.program_id(0), max_tiles, tl.cdiv(N, BLOCK_N), GROUP_M)
    e, starts, ends, tiles, tile_end = _tile_map(Offsets, stride_off, num_experts, BLOCK_M, E_POW2)
    if pid_m >= tl.sum(tiles):  # past the last tile of the last non-empty expert
        return
    expert, row_start, row_end = _segment_rows(pid_m, e, starts, ends, tiles, tile_end, BLOCK_M)
    _pointer_tile(
        A,
        B,
        B2,
        C,
        expert,
        row_start,
        row_end,
        pid_n,
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
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
        FUSE_SWIGLU,
        IS_FP32,
    )


@triton.jit
def _tile_map(Offsets, stride_off, num_experts, BLOCK_M: tl.constexpr, E_POW2: tl.constexpr):
    """The row tiles of every expert, from the offsets alone (no tile map built on the host side): each
    expert's segment is ceil(count / BLOCK_M) tiles, laid end to end in expert order. Returns the expert
    lanes, each segment's start and end, its tiles and the cumulative tile ends (in registers)."""
    e = tl.arange(0, E_POW2)
    ends = tl.load(Offsets + e * stride_off, mask=e < num_experts, other=0)
    starts = tl.load(Offsets + (e - 1) * stride_off, mask=(e > 0) & (e < num_experts), other=0)
    tiles = (ends - starts + BLOCK_M - 1) // BLOCK_M  # 0 for empty experts and for the padding lanes
    return e, starts, ends, tiles, tl.cumsum(tiles, 0)


@triton.jit
def _segment_rows(pid_m, e, starts, ends, tiles, tile_end, BLOCK_M: tl.constexpr):
    """(expert, first row, segment end) of row tile ``pid_m`` (below the total of ``tiles``)."""
    expert = tl.sum((tile_end <= pid_m).to(tl.int32))
    mine = e == expert
    row_start = tl.sum(tl.where(mine, starts + (pid_m - (tile_end - tiles)) * BLOCK_M, 0))
    row_end = tl.sum(tl.where(mine, ends, 0))
    return expert, row_start, row_end


@triton.jit
def _pointer_tile(
    A,
    B,
    B2,
    C,
    expert,
    row_start,
    row_end,
    pid_n,
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
    """One output tile by masked pointer loads: rows ``[row_start, row_start + BLOCK_M)`` below ``row_end`` of
    ``expert``'s segment times its B, columns of N tile ``pid_n``; fp32 accumulation, SwiGLU fused."""
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
        acc = _swiglu(acc, acc2)
    c_ptrs = C + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _swiglu(gate, up):
    """silu(gate) · up on the fp32 accumulators: the gate is not rounded before the nonlinearity."""
    return gate / (1.0 + tl.exp(-gate)) * up


@triton.jit
def _grouped_persistent_kernel(
    A,  # [rows, K], rows sorted by expert
    B,  # [E, K, N]
    B2,  # [E, K, N]: the up projection when FUSE_SWIGLU, else unused
    C,  # [rows, N]
    Offsets,  # [E] int32: cumulative end offsets of the segments (any stride)
    stride_off,
    num_experts,
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
    E_POW2: tl.constexpr,  # next power of two ≥ num_experts
    GROUP_M: tl.constexpr,
    USE_TMA: tl.constexpr,  # descriptors per expert segment (unit strides along K for A, along N for B and C)
):
    e, starts, ends, tiles, tile_end = _tile_map(Offsets, stride_off, num_experts, BLOCK_M, E_POW2)
    tiles_m = tl.sum(tiles)
    tiles_n = tl.cdiv(N, BLOCK_N)
    for tile in range(tl.program_id(0), tiles_m * tiles_n, tl.num_programs(0)):
        pid_m, pid_n = grouped_order(tile, tiles_m, tiles_n, GROUP_M)
        expert, row_start, row_end = _segment_rows(pid_m, e, starts, ends, tiles, tile_end, BLOCK_M)
        if USE_TMA:
            seg_start = tl.sum(tl.where(e == expert, starts, 0))
            _descriptor_tile(
                A,
                B,
                B2,
                C,
                expert,
                seg_start,
                row_start,
                row_end,
                pid_n,
                N,
                K,
                stride_am,
                stride_be,
                stride_bk,
                stride_b2e,
                stride_b2k,
                stride_cm,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
                FUSE_SWIGLU,
                IS_FP32,
            )
        else:
            _pointer_tile(
                A,
                B,
                B2,
                C,
                expert,
                row_start,
                row_end,
                pid_n,
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
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
                FUSE_SWIGLU,
                IS_FP32,
            )


@triton.jit
def _descriptor_tile(
    A,
    B,
    B2,
    C,
    expert,
    seg_start,
    row_start,
    seg_end,
    pid_n,
    N,
    K,
    stride_am,
    stride_be,
    stride_bk,
    stride_b2e,
    stride_b2k,
    stride_cm,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FUSE_SWIGLU: tl.constexpr,
    IS_FP32: tl.constexpr,
):
    """One output tile through tensor descriptors of its expert's segment ``[seg_start, seg_end)``: A's and C's
    rows of the segment only, so that the box past its end reads zeros and is not stored, and the expert's
    B; the K tail and the columns past N are clipped the same way."""
    first = seg_start.to(tl.int64)  # rows · stride passes 2^31 at a few hundred thousand rows
    rows = seg_end - seg_start
    e64 = expert.to(tl.int64)
    a_desc = tl.make_tensor_descriptor(
        A + first * stride_am, shape=[rows, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K]
    )
    b_desc = tl.make_tensor_descriptor(
        B + e64 * stride_be, shape=[K, N], strides=[stride_bk, 1], block_shape=[BLOCK_K, BLOCK_N]
    )
    local = row_start - seg_start
    n0 = pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if FUSE_SWIGLU:
        b2_desc = tl.make_tensor_descriptor(
            B2 + e64 * stride_b2e, shape=[K, N], strides=[stride_b2k, 1], block_shape=[BLOCK_K, BLOCK_N]
        )
        acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = a_desc.load([local, k0])
        b = b_desc.load([k0, n0])
        if IS_FP32:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        if FUSE_SWIGLU:
            b2 = b2_desc.load([k0, n0])
            if IS_FP32:
                acc2 = tl.dot(a, b2, acc2, input_precision="ieee")
            else:
                acc2 = tl.dot(a, b2, acc2)
    if FUSE_SWIGLU:
        acc = _swiglu(acc, acc2)
    c_desc = tl.make_tensor_descriptor(
        C + first * stride_cm, shape=[rows, N], strides=[stride_cm, 1], block_shape=[BLOCK_M, BLOCK_N]
    )
    c_desc.store([local, n0], acc.to(C.dtype.element_ty))
