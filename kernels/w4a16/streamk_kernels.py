"""The stream-K decoding kernel of the W4A16 / W8A16 layers (``path="streamk"``, launched by
``kernels.w4a16.paths``).

A candidate for small M, measured beside the default split-K kernel before any heuristic adopts it
(docs/limits.md). Decoding is bound by reading the weight, and a split-K grid sized in whole slices leaves
programs idle in its last wave. Here the work is cut into units of one output tile × ``BLOCK_K`` inputs,
numbered tile by tile, and each of the ``programs`` (a few per multiprocessor) takes an equal run of
consecutive units, ``[p·U/P, (p+1)·U/P)``: every program streams the same number of weight bytes, in
``BLOCK_K``-input steps (whole cache lines of packed words per row), crossing tile boundaries as it goes.
A tile covered by one program is stored directly; the programs sharing a tile each store an fp32 partial
(two slots per program: the tile its run starts in, the tile it ends in), and the last to arrive sums them
in program order (deterministic, no memset: it puts the tile's counter back to 0). The product is the
swapped one of ``_w4_run`` (the weight as the MMA's register operand, x's few rows its N side) with the
scale after the product where the scales allow it; int8 codes are converted to x's dtype, their
per-channel scale applied to each partial. Pointer loads only. Tested in the interpreter
(tests/kernels/test_w4a16_paths.py) and compiled for sm_90 on the CPU; not yet timed on a GPU.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.w4a16.w4a16_kernels import _w4_finish, _w4_run, _w8_run


@triton.jit
def _wq_streamk_kernel(
    X,  # (M, K) activations
    W,  # BITS 4: (N, K // 8) int32, the blocked packing; BITS 8: (N, K) int8
    S,  # BITS 4: scale_zero words (K // GROUP, N) (DEQ 0/3) or scales (N, K // GROUP); BITS 8: (N,)
    Z,  # BITS 4, DEQ 1/2, asymmetric: (N, K // GROUP) uint8 zero points; else None
    Bias,  # (N,) or None
    Out,  # (M, N) in X's dtype, contiguous
    Part,  # (programs, 2, BLOCK_N, BLOCK_M) float32 partial sums (a cached workspace)
    Cnt,  # int32 arrival counters, one per output tile, 0 between launches
    M,
    N,
    K,
    k_main,  # BITS 4: K rounded down to a multiple of 128
    steps,  # units per tile: ceil(k_main / BLOCK_K) (int4, at least 1) or ceil(K / BLOCK_K) (int8)
    units,  # output tiles × steps, at least the number of programs
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
    DEQ: tl.constexpr,  # as _w4a16_kernel's (0, 3: scale_zero words, the scale before / after the product)
    MAGIC: tl.constexpr,
    USE_ASM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,  # inputs per unit (int4: a multiple of 128)
):
    pid = tl.program_id(0).to(tl.int64)
    programs = tl.num_programs(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    start = pid * units // programs
    stop = (pid + 1) * units // programs
    if DEQ == 2:
        dtype = tl.float32
    else:
        dtype = X.dtype.element_ty
    u = start
    while u < stop:
        tile = u // steps
        k_first = u - tile * steps
        k_last = tl.minimum(steps, k_first + (stop - u))
        pid_m = tile // tiles_n
        pid_n = tile - pid_m * tiles_n
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
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
                X,
                W,
                0,
                0,
                offs_m,
                offs_n,
                m_mask,
                n_mask,
                k_first * BLOCK_K,
                tl.minimum(k_last * BLOCK_K, k_main),
                k_last == steps,
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
                False,
                BLOCK_K,
                dtype,
            )
        else:
            acc = _w8_run(
                acc,
                X,
                W,
                X,
                W,
                0,
                0,
                offs_m,
                offs_n,
                m_mask,
                n_mask,
                k_first * BLOCK_K,
                tl.minimum(k_last * BLOCK_K, K),
                stride_xm,
                stride_xk,
                stride_wn,
                stride_wc,
                DEQ,
                False,
                BLOCK_K,
            )
            acc *= tl.load(S + offs_n * stride_sn, mask=n_mask, other=0.0).to(tl.float32)[:, None]
        _streamk_epilogue(
            acc,
            Bias,
            stride_bias,
            Out,
            Part,
            Cnt,
            pid,
            programs,
            units,
            steps,
            tile,
            start,
            (k_first == 0) & (k_last == steps),
            offs_m,
            offs_n,
            M,
            N,
            BLOCK_M,
            BLOCK_N,
        )
        u += k_last - k_first


@triton.jit
def _streamk_epilogue(
    acc,
    Bias,
    stride_bias,
    Out,
    Part,
    Cnt,
    pid,
    programs,
    units,
    steps,
    tile,
    start,
    whole,
    offs_m,
    offs_n,
    M,
    N,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Store a tile this program computed whole; else its partial (slot 0: the tile its run starts in, 1: the
    one it ends in) and, for the last of the tile's programs to arrive, the sum of all of them in program
    order. The programs sharing the tile whose units are ``[first, first + steps)`` are those from
    ``p_first`` (the last to start at or before ``first``) to ``p_last`` (the last to start before its end):
    program p starts at ``p·U // P``, so the last to start at or before unit v is ``((v + 1)·P − 1) // U``."""
    rows = offs_m[None, :]
    cols = offs_n[:, None]
    mask = (rows < M) & (cols < N)
    if whole:
        _w4_finish(acc, Bias, stride_bias, Out, rows, cols, mask, N)
    else:
        first = tile * steps
        local = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
        slot = pid * 2 + tl.where(start >= first, 0, 1)
        tl.store(Part + slot * (BLOCK_N * BLOCK_M) + local, acc)
        tl.debug_barrier()  # every thread's partial stored before the release below
        p_first = ((first + 1) * programs - 1) // units
        p_last = ((first + steps) * programs - 1) // units
        count = tl.atomic_add(Cnt + tile, 1, sem="acq_rel", scope="gpu")
        if count == p_last - p_first:
            total = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for p in range(p_first, p_last + 1):
                slot = p * 2 + tl.where(p * units // programs >= first, 0, 1)
                total += tl.load(Part + slot * (BLOCK_N * BLOCK_M) + local, cache_modifier=".cg")
            _w4_finish(total, Bias, stride_bias, Out, rows, cols, mask, N)
            tl.store(Cnt + tile, 0)
