"""The persistent tensor-core kernel of the W4A16 / W8A16 layers (``path="tc"``, launched by ``kernels.w4a16.paths``).

A candidate for M ≥ 64, measured beside the default kernel before any heuristic adopts it (docs/limits.md).
One program per multiprocessor walks the output tiles in a grouped order (``GROUP_N`` weight tiles swept
over every row tile of x, so that a wave's weight and activation tiles stay in L2), computing
``outᵀ = dequant(W) · xᵀ`` per tile: the weight is dequantised in registers just before the MMA as its
register operand (``_w4_run``: nibble i of a 128-input block's words, 8 products of K = 16), x the
shared-memory operand. With USE_TMA the packed words and x come through tensor descriptors made on the
device once per program (TMA on Hopper: the launcher asks for them where the layouts allow); otherwise
masked pointer loads. The int8 format (BITS 8) multiplies ``BLOCK_K``-input tiles of codes converted to x's
dtype, the per-channel scale after the K loop. No split-K: a persistent grid keeps every SM busy without it
at these M. Tested in the interpreter (tests/kernels/test_w4a16_paths.py, both load forms) and compiled for
sm_90 on the CPU (wgmma, TMA, no local memory); not yet timed on a GPU.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels._tiling import grouped_order
from kernels.w4a16.w4a16_kernels import _w4_finish, _w4_run, _w8_run


@triton.jit
def _wq_tc_kernel(
    X,  # (M, K) activations
    W,  # BITS 4: (N, K // 8) int32, the blocked packing; BITS 8: (N, K) int8
    S,  # BITS 4: the scale_zero words (K // GROUP, N) int32 (DEQ 0) or scales (N, K // GROUP); BITS 8: (N,)
    Z,  # BITS 4, DEQ 1/2, asymmetric: (N, K // GROUP) uint8 zero points; else None
    Bias,  # (N,) or None
    Out,  # (M, N) in X's dtype, contiguous
    M,
    N,
    K,
    k_main,  # BITS 4: K rounded down to a multiple of 128 (the full packing blocks)
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wc,
    stride_sn,
    stride_sg,
    stride_zn,
    stride_zg,
    stride_bias,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    SYMMETRIC: tl.constexpr,
    TAIL_WORDS: tl.constexpr,
    DEQ: tl.constexpr,  # 0: scale_zero words, the scale before the product; 1: other scales; 2: fp32 x (exact)
    MAGIC: tl.constexpr,
    USE_ASM: tl.constexpr,
    USE_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,  # BITS 8: inputs per loop step (BITS 4 steps one 128-input block)
    GROUP_N: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    if DEQ == 2:
        dtype = tl.float32
    else:
        dtype = X.dtype.element_ty
    if USE_TMA:
        if BITS == 4:
            x_desc = tl.make_tensor_descriptor(X, shape=[M, K], strides=[stride_xm, 1], block_shape=[BLOCK_M, 16])
            w_desc = tl.make_tensor_descriptor(W, shape=[N, K // 8], strides=[stride_wn, 1], block_shape=[BLOCK_N, 16])
        else:
            x_desc = tl.make_tensor_descriptor(X, shape=[M, K], strides=[stride_xm, 1], block_shape=[BLOCK_M, BLOCK_K])
            w_desc = tl.make_tensor_descriptor(W, shape=[N, K], strides=[stride_wn, 1], block_shape=[BLOCK_N, BLOCK_K])
    else:
        x_desc = X  # unused
        w_desc = W
    for tile in range(pid, tiles_m * tiles_n, programs):
        pid_n, pid_m = grouped_order(tile, tiles_n, tiles_m, GROUP_N)
        m0 = pid_m * BLOCK_M
        n0 = pid_n * BLOCK_N
        offs_m = m0 + tl.arange(0, BLOCK_M)
        offs_n = n0 + tl.arange(0, BLOCK_N)
        m_mask = offs_m < M
        n_mask = offs_n < N
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        if BITS == 4:
            acc = _w4_run(
                acc,
                X,
                W,
                S,
                Z,
                x_desc,
                w_desc,
                m0,
                n0,
                offs_m,
                offs_n,
                m_mask,
                n_mask,
                0,
                k_main,
                True,
                k_main,
                stride_xm,
                stride_xk,
                stride_wn,
                stride_wc,
                stride_sn,
                stride_sg,
                stride_zn,
                stride_zg,
                GROUP,
                SYMMETRIC,
                TAIL_WORDS,
                DEQ,
                MAGIC,
                True,
                USE_ASM,
                USE_TMA,
                128,
                dtype,
            )
        else:
            acc = _w8_run(
                acc,
                X,
                W,
                x_desc,
                w_desc,
                m0,
                n0,
                offs_m,
                offs_n,
                m_mask,
                n_mask,
                0,
                K,
                stride_xm,
                stride_xk,
                stride_wn,
                stride_wc,
                DEQ,
                USE_TMA,
                BLOCK_K,
            )
            acc *= tl.load(S + offs_n * stride_sn, mask=n_mask, other=0.0).to(tl.float32)[:, None]
        rows = offs_m[None, :]
        cols = offs_n[:, None]
        _w4_finish(acc, Bias, stride_bias, Out, rows, cols, (rows < M) & (cols < N), N)
