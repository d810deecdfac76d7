"""The ``@triton.jit`` kernels of the W4A16 / W8A16 linear layers (launched by ``kernels.w4a16.w4a16``).

``_w4a16_kernel``: ``y = x @ dequant(W)ᵀ`` on the tensor cores for the int4 format of ``formats``, the weight
dequantised in registers from the packed words (``_w4_dequant_sz``: no int-to-float conversion; PTX on pairs
of weights on sm_90), split-K in one deterministic launch (``_w4_epilogue``). ``_w4_unpack_kernel``: the
unfused baseline, dequantised to memory by the same helper. ``_w8a16_matmul_kernel``: the int8 per-channel
format. Tested through the launcher (tests/kernels/test_w4a16.py) in the interpreter, and compiled for sm_90
on the CPU (wgmma, the PTX pairs, no layout conversion in the K loop, no local memory).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _w4_dequant(words, shift, s, z, SYMMETRIC: tl.constexpr, dtype):
    """``(q − z) · s`` of nibble ``shift // 4`` of every word in fp32, rounded once to ``dtype`` (DEQ 1:
    scales of another dtype than x's; DEQ 2, ``dtype`` fp32: the exact fp32 mode). With 16-bit scales in
    x's dtype the kernel uses ``_w4_dequant_sz`` instead."""
    qf = ((words >> shift) & 0xF).to(tl.float32)
    if SYMMETRIC:
        w = (qf - 8.0) * s.to(tl.float32)
    else:
        w = (qf - z.to(tl.float32)) * s.to(tl.float32)
    return w.to(dtype)


def _pairs_ptx(kind: str, magic: int, scale: bool) -> str:
    """PTX for nibble i of two words at once (``_w4_dequant_sz``): $0 the ``kind`` (f16x2 or bf16x2) result,
    $1 $2 the two words, $3 $4 their scale_zero words, $5 the ``prmt`` selector of nibbles 0–3 or 4–7, $7
    the shift within them ($6 and $8 are the second copies that pack=2 passes)."""
    body = (
        "{ .reg .b32 p, t, z, s; prmt.b32 p, $1, $2, $5; shr.u32 t, p, $7; "
        f"lop3.b32 t, t, 0x000F000F, {magic:#010x}, 0xEA; prmt.b32 z, $3, $4, 0x7632; "
    )
    if scale:
        return body + f"prmt.b32 s, $3, $4, 0x5410; sub.rn.{kind} t, t, z; mul.rn.{kind} $0, t, s; }}"
    return body + f"sub.rn.{kind} $0, t, z; }}"


_PAIRS_IO = tl.constexpr("=r,r,r,r,r,r,r,r,r")
_PAIRS_F16 = tl.constexpr(_pairs_ptx("f16x2", 0x64006400, False))
_PAIRS_F16_SCALE = tl.constexpr(_pairs_ptx("f16x2", 0x64006400, True))
_PAIRS_BF16 = tl.constexpr(_pairs_ptx("bf16x2", 0x43004300, False))
_PAIRS_BF16_SCALE = tl.constexpr(_pairs_ptx("bf16x2", 0x43004300, True))


@triton.jit
def _w4_dequant_sz(words, sz, i: tl.constexpr, MAGIC: tl.constexpr, SCALE: tl.constexpr, USE_ASM: tl.constexpr):
    """Nibble i of every word from the int32 ``scale_zero`` words ``sz`` (broadcast to the words' shape), in
    fp16 (MAGIC 0x6400) or bf16 (0x4300): ``(q − z) · s`` with SCALE (DEQ 0: the same bits as
    ``_w4_dequant``), ``q − z`` (exact) without (DEQ 3, the scale applied to the product's fp32 sum, so the
    weight is never rounded to 16 bits). No int-to-float conversion: ``MAGIC | q`` is the bits of ``2^e + q``
    (1024 + q in fp16, 128 + q in bf16), and subtracting the stored ``2^e + z`` leaves ``q − z`` exactly.

    USE_ASM (compiled for sm_90): PTX on two words at a time, so that each instruction serves two weights
    (an ``f16x2``/``bf16x2`` register): one ``prmt`` puts 16 bits of each word side by side (nibbles 0–3 or
    4–7; shared by four nibbles), then per pair a shift, one ``lop3`` (mask and 2^e exponent bits), one
    ``sub`` of the pair of ``2^e + z`` and with SCALE one ``mul`` by the pair of scales (those pairs are one
    ``prmt`` of the two ``sz`` words, shared by the eight nibbles). Plain Triton otherwise (the interpreter).
    """
    if USE_ASM:
        if i < 4:
            sel = tl.full(words.shape, 0x5410, tl.int32)
        else:
            sel = tl.full(words.shape, 0x7632, tl.int32)
        args = [words, sz, sel, tl.full(words.shape, 4 * (i % 4), tl.int32)]
        if MAGIC == 0x6400:
            if SCALE:
                w = tl.inline_asm_elementwise(_PAIRS_F16_SCALE, _PAIRS_IO, args, tl.float16, is_pure=True, pack=2)
            else:
                w = tl.inline_asm_elementwise(_PAIRS_F16, _PAIRS_IO, args, tl.float16, is_pure=True, pack=2)
        elif SCALE:
            w = tl.inline_asm_elementwise(_PAIRS_BF16_SCALE, _PAIRS_IO, args, tl.bfloat16, is_pure=True, pack=2)
        else:
            w = tl.inline_asm_elementwise(_PAIRS_BF16, _PAIRS_IO, args, tl.bfloat16, is_pure=True, pack=2)
    else:
        if MAGIC == 0x6400:
            dtype = tl.float16
        else:
            dtype = tl.bfloat16
        z = (sz >> 16).to(tl.int16).to(dtype, bitcast=True)
        q = ((words >> (4 * i)) & 0xF) | MAGIC
        w = q.to(tl.int16).to(dtype, bitcast=True) - z
        if SCALE:
            w = w * sz.to(tl.int16).to(dtype, bitcast=True)
    return w


@triton.jit
def _w4_mma(acc, w, x, SWAP_AB: tl.constexpr, DEQ: tl.constexpr):
    """``acc`` plus one K = 16 product: x · Wᵀ, or with SWAP_AB outᵀ = W · xᵀ, so that the dequantised weight
    is the MMA's A operand, the one Hopper's wgmma takes from registers (a decode step's few rows of x become
    the 16-wide N side). DEQ 2 (fp32 activations) keeps an exact IEEE product, not TF32."""
    if SWAP_AB:
        a = w
        b = x
    else:
        a = x
        b = w
    if DEQ == 2:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _w4_x_slice(x_ptrs, xb_mask, x_desc, m0, k, stride_xk, SWAP_AB: tl.constexpr, USE_TMA: tl.constexpr):
    """16 columns of x from input ``k`` on: ``[16, BLOCK_M]`` with SWAP_AB, else ``[BLOCK_M, 16]``; with USE_TMA
    one tensor-descriptor load of the ``[BLOCK_M, 16]`` box at (m0, k) (rows past M read as zeros)."""
    if USE_TMA:
        x = x_desc.load([m0, k])
        if SWAP_AB:
            x = tl.trans(x)
    else:
        x = tl.load(x_ptrs + k * stride_xk, mask=xb_mask, other=0.0)
    return x


@triton.jit
def _w4_block(
    acc,
    words,  # [BLOCK_N, 16] int32 with SWAP_AB (else [16, BLOCK_N]): the 128-input block from kb
    x_ptrs,  # x's columns 0 … 15 of the tile's rows (advanced by the input index)
    xb_mask,
    x_desc,  # USE_TMA: x's tensor descriptor (box [BLOCK_M, 16]), else unused
    m0,  # USE_TMA: the tile's first row
    s_ptrs,
    z_ptrs,
    nb_mask,
    kb,
    stride_xk,
    stride_sg,
    stride_zg,
    GROUP: tl.constexpr,
    SYMMETRIC: tl.constexpr,
    DEQ: tl.constexpr,
    MAGIC: tl.constexpr,
    SWAP_AB: tl.constexpr,
    USE_ASM: tl.constexpr,
    USE_TMA: tl.constexpr,
    dtype: tl.constexpr,
):
    """``acc`` plus the product of one 128-input packing block: 8 products of K = 16, nibble i of the words
    being inputs ``kb + 16i … kb + 16i + 15``, multiplied with the matching 16 columns of x (the kernels'
    shared K-loop body; ``_w4a16_kernel``'s docstring says how DEQ places the scale)."""
    if DEQ == 3:
        # q − z exact in 16 bits, its product with x summed per group in fp32, then times the scale
        for gi in tl.static_range(128 // GROUP):
            sz = tl.load(s_ptrs + (kb // GROUP + gi) * stride_sg, mask=nb_mask, other=0)
            s = sz.to(tl.int16).to(dtype, bitcast=True).to(tl.float32)
            for ii in tl.static_range(GROUP // 16):
                i = gi * (GROUP // 16) + ii
                x = _w4_x_slice(x_ptrs, xb_mask, x_desc, m0, kb + 16 * i, stride_xk, SWAP_AB, USE_TMA)
                if SWAP_AB:
                    w = _w4_dequant_sz(words, sz[:, None], i, MAGIC, False, USE_ASM)
                else:
                    w = _w4_dequant_sz(words, sz[None, :], i, MAGIC, False, USE_ASM)
                if ii == 0:
                    part = _w4_mma(tl.zeros(acc.shape, tl.float32), w, x, SWAP_AB, DEQ)
                else:
                    part = _w4_mma(part, w, x, SWAP_AB, DEQ)
            if SWAP_AB:
                acc += part * s[:, None]
            else:
                acc += part * s[None, :]
    for i in tl.static_range(8 if DEQ != 3 else 0):
        if (16 * i) % GROUP == 0:  # a new group starts with this slice: its scale and zero point
            g = kb // GROUP + (16 * i) // GROUP
            if DEQ == 0:  # S is the int32 scale_zero: scale bits low, 2^e + z bits high
                sz = tl.load(s_ptrs + g * stride_sg, mask=nb_mask, other=0)
            else:
                s = tl.load(s_ptrs + g * stride_sg, mask=nb_mask, other=0.0)
                z = s  # unused when SYMMETRIC
                if not SYMMETRIC:
                    z = tl.load(z_ptrs + g * stride_zg, mask=nb_mask, other=0)
        if DEQ == 0:
            if SWAP_AB:
                w = _w4_dequant_sz(words, sz[:, None], i, MAGIC, True, USE_ASM)
            else:
                w = _w4_dequant_sz(words, sz[None, :], i, MAGIC, True, USE_ASM)
        elif SWAP_AB:
            w = _w4_dequant(words, 4 * i, s[:, None], z[:, None], SYMMETRIC, dtype)
        else:
            w = _w4_dequant(words, 4 * i, s[None, :], z[None, :], SYMMETRIC, dtype)
        x = _w4_x_slice(x_ptrs, xb_mask, x_desc, m0, kb + 16 * i, stride_xk, SWAP_AB, USE_TMA)
        acc = _w4_mma(acc, w, x, SWAP_AB, DEQ)
    return acc


@triton.jit
def _w4_tail(
    acc,
    W,
    S,
    Z,
    w_ptrs,
    x_ptrs,
    w_mask,
    x_mask,
    offs_n,
    k_main,
    stride_wc,
    stride_xk,
    stride_sn,
    stride_sg,
    stride_zn,
    stride_zg,
    GROUP: tl.constexpr,
    SYMMETRIC: tl.constexpr,
    TAIL_WORDS: tl.constexpr,
    DEQ: tl.constexpr,
    MAGIC: tl.constexpr,
    SWAP_AB: tl.constexpr,
    USE_ASM: tl.constexpr,
    dtype: tl.constexpr,
):
    """``acc`` plus the product of the last, shorter block (K − k_main inputs, packed with TAIL_WORDS words per
    row): nibble i of word c is input k_main + i·TAIL_WORDS + c; groups may change inside a slice (12-word
    tails), so the scale is applied before the product here, per element."""
    offs_c = tl.arange(0, 16)
    c_ok = offs_c < TAIL_WORDS
    if SWAP_AB:
        t_mask = w_mask & c_ok[None, :]
        tx_mask = x_mask & c_ok[:, None]
        col = offs_c[None, :]
        sn = offs_n[:, None]
    else:
        t_mask = w_mask & c_ok[:, None]
        tx_mask = x_mask & c_ok[None, :]
        col = offs_c[:, None]
        sn = offs_n[None, :]
    words = tl.load(w_ptrs + (k_main // 8) * stride_wc, mask=t_mask, other=0)
    for i in tl.static_range(8):
        g = (k_main + i * TAIL_WORDS + col) // GROUP
        if DEQ == 0 or DEQ == 3:
            sz = tl.load(S + sn * stride_sn + g * stride_sg, mask=t_mask, other=0)
            w = _w4_dequant_sz(words, sz, i, MAGIC, True, USE_ASM)
        else:
            s = tl.load(S + sn * stride_sn + g * stride_sg, mask=t_mask, other=0.0)
            z = s
            if not SYMMETRIC:
                z = tl.load(Z + sn * stride_zn + g * stride_zg, mask=t_mask, other=0)
            w = _w4_dequant(words, 4 * i, s, z, SYMMETRIC, dtype)
        x = tl.load(x_ptrs + (k_main + i * TAIL_WORDS) * stride_xk, mask=tx_mask, other=0.0)
        acc = _w4_mma(acc, w, x, SWAP_AB, DEQ)
    return acc


@triton.jit
def _w4_run(
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
    k_lo,
    k_hi,
    last,
    k_main,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wc,
    stride_sn,
    stride_sg,
    stride_zn,
    stride_zg,
    GROUP: tl.constexpr,
    SYMMETRIC: tl.constexpr,
    TAIL_WORDS: tl.constexpr,
    DEQ: tl.constexpr,
    MAGIC: tl.constexpr,
    SWAP_AB: tl.constexpr,
    USE_ASM: tl.constexpr,
    USE_TMA: tl.constexpr,
    BLOCK_K: tl.constexpr,
    dtype: tl.constexpr,
):
    """``acc`` plus inputs ``[k_lo, k_hi)`` of one int4 output tile (whole 128-input blocks, BLOCK_K of them a
    loop step; the blocks of a last, partial step read as zeros), then the last, shorter block when this run
    ends the tile (``last``): the K loop every int4 kernel runs. Words and x by pointer loads, or with
    USE_TMA (swapped, 128-input steps) through the descriptors ``w_desc`` (box ``[BLOCK_N, 16]`` words at
    (n0, ·)) and ``x_desc`` (``[BLOCK_M, 16]`` at (m0, ·))."""
    tl.static_assert(not USE_TMA or (SWAP_AB and BLOCK_K == 128), "descriptors: swapped, 128-input steps")
    offs_c = tl.arange(0, 16)
    if SWAP_AB:
        # words (BLOCK_N, 16), x slices (16, BLOCK_M)
        w_ptrs = W + offs_n[:, None] * stride_wn + offs_c[None, :] * stride_wc
        w_mask = n_mask[:, None]
        x_ptrs = X + offs_m[None, :] * stride_xm + offs_c[:, None] * stride_xk
        x_mask = m_mask[None, :]
    else:
        # words (16, BLOCK_N), x slices (BLOCK_M, 16)
        w_ptrs = W + offs_n[None, :] * stride_wn + offs_c[:, None] * stride_wc
        w_mask = n_mask[None, :]
        x_ptrs = X + offs_m[:, None] * stride_xm + offs_c[None, :] * stride_xk
        x_mask = m_mask[:, None]
    s_ptrs = S + offs_n * stride_sn
    z_ptrs = s_ptrs  # unused when SYMMETRIC or the scales are scale_zero words (Z is None)
    if not SYMMETRIC and (DEQ == 1 or DEQ == 2):
        z_ptrs = Z + offs_n * stride_zn
    for k0 in range(k_lo, k_hi, BLOCK_K):
        for b in tl.static_range(BLOCK_K // 128):
            kb = k0 + b * 128
            if BLOCK_K > 128:  # the last step of a run may be partial: its missing blocks read as zeros
                b_ok = kb < k_hi
                wb_mask = w_mask & b_ok
                xb_mask = x_mask & b_ok
                nb_mask = n_mask & b_ok
            else:
                wb_mask = w_mask
                xb_mask = x_mask
                nb_mask = n_mask
            if USE_TMA:
                words = w_desc.load([n0, kb // 8])
            else:
                words = tl.load(w_ptrs + (kb // 8) * stride_wc, mask=wb_mask, other=0)
            acc = _w4_block(
                acc,
                words,
                x_ptrs,
                xb_mask,
                x_desc,
                m0,
                s_ptrs,
                z_ptrs,
                nb_mask,
                kb,
                stride_xk,
                stride_sg,
                stride_zg,
                GROUP,
                SYMMETRIC,
                DEQ,
                MAGIC,
                SWAP_AB,
                USE_ASM,
                USE_TMA,
                dtype,
            )
    if TAIL_WORDS > 0:
        if last:
            acc = _w4_tail(
                acc,
                W,
                S,
                Z,
                w_ptrs,
                x_ptrs,
                w_mask,
                x_mask,
                offs_n,
                k_main,
                stride_wc,
                stride_xk,
                stride_sn,
                stride_sg,
                stride_zn,
                stride_zg,
                GROUP,
                SYMMETRIC,
                TAIL_WORDS,
                DEQ,
                MAGIC,
                SWAP_AB,
                USE_ASM,
                dtype,
            )
    return acc


@triton.jit
def _w8_run(
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
    k_lo,
    k_hi,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    DEQ: tl.constexpr,
    USE_TMA: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``acc [BLOCK_N, BLOCK_M]`` plus inputs ``[k_lo, k_hi)`` of one int8 tile, swapped: ``[BLOCK_N, BLOCK_K]``
    codes converted to x's dtype (exact) times xᵀ, fp32 sums (DEQ 2: fp32 x, exact); the per-channel scale
    is the caller's. With USE_TMA (k_hi = K) through descriptors whose boxes past K read as zeros."""
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if USE_TMA:
            w = w_desc.load([n0, k0])
            x = tl.trans(x_desc.load([m0, k0]))
        else:
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_mask = offs_k < k_hi
            w = tl.load(
                W + offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk,
                mask=n_mask[:, None] & k_mask[None, :],
                other=0,
            )
            x = tl.load(
                X + offs_m[None, :] * stride_xm + offs_k[:, None] * stride_xk,
                mask=m_mask[None, :] & k_mask[:, None],
                other=0.0,
            )
        if DEQ == 2:
            acc = tl.dot(w.to(tl.float32), x, acc, input_precision="ieee")
        else:
            acc = tl.dot(w.to(x.dtype), x, acc)
    return acc


@triton.jit
def _w4a16_kernel(
    X,  # (M, K) activations
    W,  # (N, K // 8) int32, the blocked packing (kernels.w4a16.formats)
    S,  # (N, K // GROUP) scales (any strides; quantize() stores them N-contiguous)
    Z,  # (N, K // GROUP) uint8 zero points, or None (symmetric: the zero is 8)
    Bias,  # (N,) or None
    Out,  # (M, N) in X's dtype, contiguous
    Part,  # SPLIT: (split_k, M, N) float32 partial sums (a cached workspace), else unused
    Cnt,  # SPLIT: int32 arrival counters, one per output tile, 0 between launches, else unused
    M,
    N,
    k_main,  # K rounded down to a multiple of 128: the full packing blocks
    blocks_per_split,  # 128-input blocks per K slice, a multiple of BLOCK_K // 128
    split_k,  # K slices (grid axis 2)
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wc,
    stride_sn,
    stride_sg,
    stride_zn,
    stride_zg,
    stride_bias,  # Bias's stride (any, 0 for an expanded bias)
    GROUP: tl.constexpr,
    SYMMETRIC: tl.constexpr,
    TAIL_WORDS: tl.constexpr,  # (K − k_main) / 8: 0, 4, 8 or 12
    SPLIT: tl.constexpr,  # split_k > 1: partial sums, reduced by the last program of each tile
    DEQ: tl.constexpr,  # 0, 3: scale_zero words, scale before / after the product; 1, 2: _w4_dequant
    MAGIC: tl.constexpr,  # 0x6400 (fp16) or 0x4300 (bf16), for DEQ 0 and 3
    SWAP_AB: tl.constexpr,  # compute outᵀ = W · xᵀ (the weight as the MMA's A operand) instead of x · Wᵀ
    USE_ASM: tl.constexpr,  # DEQ 0 through PTX on pairs of weights (_w4_dequant_sz); compiled for sm_90 only
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,  # a multiple of 128: packing blocks per loop step
):
    """One (M, N) tile over one K slice (``_w4_run``). Per 128-input block a program loads one ``[BLOCK_N, 16]``
    word tile and runs 8 products of K = 16: nibble i of the words is inputs ``k0 + 16i … k0 + 16i + 15`` (no
    reshape), multiplied with the matching 16 columns of x, loaded straight from memory."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    if DEQ == 2:
        dtype = tl.float32
    else:
        dtype = X.dtype.element_ty
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * blocks_per_split * 128
    k_stop = tl.minimum(k_main, k_start + blocks_per_split * 128)
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
        k_start,
        k_stop,
        pid_k == split_k - 1,
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
        SWAP_AB,
        USE_ASM,
        False,
        BLOCK_K,
        dtype,
    )
    tile = pid_m * tl.num_programs(1) + pid_n
    _w4_epilogue(acc, Bias, stride_bias, Out, Part, Cnt, tile, pid_k, split_k, offs_m, offs_n, M, N, SPLIT, SWAP_AB)


@triton.jit
def _w4_finish(acc, Bias, stride_bias, Out, rows, cols, mask, N):
    if Bias is not None:
        b = tl.load(Bias + cols * stride_bias, mask=cols < N, other=0.0).to(tl.float32)
        acc += b
    tl.store(Out + rows * N + cols, acc.to(Out.dtype.element_ty), mask=mask)


@triton.jit
def _w4_epilogue(
    acc,
    Bias,
    stride_bias,
    Out,
    Part,
    Cnt,
    tile,
    pid_k,
    split_k,
    offs_m,
    offs_n,
    M,
    N,
    SPLIT: tl.constexpr,
    TRANS: tl.constexpr,
):
    """Bias, cast and store of a ``[BLOCK_M, BLOCK_N]`` tile (``[BLOCK_N, BLOCK_M]`` when TRANS) of the
    contiguous ``Out [M, N]``. With SPLIT: one launch, deterministic. Each K slice stores its fp32 partial
    sum to ``Part[pid_k]`` and adds 1 to the tile's counter (acq_rel, after a CTA barrier so that every
    thread's stores precede the release); the program that sees ``split_k − 1`` (the last to arrive) sums
    slices 0, 1, …, split_k − 1 in that fixed order (loads bypass L1), adds the bias, stores, and puts the
    counter back to 0 so that the cached counter buffer serves the next launch without a memset."""
    if TRANS:
        rows = offs_m[None, :]
        cols = offs_n[:, None]
    else:
        rows = offs_m[:, None]
        cols = offs_n[None, :]
    mask = (rows < M) & (cols < N)
    if SPLIT:
        part = Part + rows * N + cols
        tl.store(part + pid_k * M * N, acc, mask=mask)
        tl.debug_barrier()
        count = tl.atomic_add(Cnt + tile, 1, sem="acq_rel", scope="gpu")
        if count == split_k - 1:
            total = tl.load(part, mask=mask, other=0.0, cache_modifier=".cg")
            for sl in range(1, split_k):
                total += tl.load(part + sl * M * N, mask=mask, other=0.0, cache_modifier=".cg")
            _w4_finish(total, Bias, stride_bias, Out, rows, cols, mask, N)
            tl.store(Cnt + tile, 0)
    else:
        _w4_finish(acc, Bias, stride_bias, Out, rows, cols, mask, N)


@triton.jit
def _w4_unpack_kernel(
    W,  # (N, K // 8) int32, the blocked packing
    SZ,  # (K // GROUP, N) int32 scale_zero words
    Out,  # (N, K) in the scales' 16-bit dtype
    N,
    k_main,
    stride_wn,
    stride_wc,
    stride_sg,
    stride_sn,
    stride_on,
    GROUP: tl.constexpr,
    TAIL_WORDS: tl.constexpr,
    MAGIC: tl.constexpr,
    USE_ASM: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Dequantise to memory (the unfused path ``dequantize`` takes on a GPU): program (N tile, 128-input
    block) writes ``(q − z) · s`` of its ``[BLOCK_N, 128]`` tile with the matmul kernel's helper, the same
    single rounding as the float32 reference."""
    pid_n = tl.program_id(0)
    kb = tl.program_id(1) * 128
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, 16)
    n_mask = offs_n[:, None] < N
    w_ptrs = W + offs_n[:, None] * stride_wn + offs_c[None, :] * stride_wc
    o_ptrs = Out + offs_n[:, None] * stride_on + offs_c[None, :]
    if kb < k_main:
        words = tl.load(w_ptrs + (kb // 8) * stride_wc, mask=n_mask, other=0)
        for i in tl.static_range(8):
            sz = tl.load(SZ + ((kb + 16 * i) // GROUP) * stride_sg + offs_n * stride_sn, mask=offs_n < N, other=0)
            w = _w4_dequant_sz(words, sz[:, None], i, MAGIC, True, USE_ASM)
            tl.store(o_ptrs + kb + 16 * i, w, mask=n_mask)
    elif TAIL_WORDS > 0:  # the shorter last block: nibble i of word c is input k_main + i·TAIL_WORDS + c
        c_ok = n_mask & (offs_c[None, :] < TAIL_WORDS)
        tail = tl.load(w_ptrs + (k_main // 8) * stride_wc, mask=c_ok, other=0)
        for i in tl.static_range(8):
            cols = k_main + i * TAIL_WORDS + offs_c[None, :]
            sz_t = tl.load(SZ + (cols // GROUP) * stride_sg + offs_n[:, None] * stride_sn, mask=c_ok, other=0)
            tl.store(o_ptrs + k_main + i * TAIL_WORDS, _w4_dequant_sz(tail, sz_t, i, MAGIC, True, USE_ASM), mask=c_ok)


@triton.jit
def _int8_weight_tile(W, offs_n, offs_k, n_mask, k_mask, stride_wn, stride_wk):
    """The int8 codes of a tile ``[BLOCK_K, BLOCK_N]`` as fp32; the per-channel scale comes after the dot."""
    mask = k_mask[:, None] & n_mask[None, :]
    return tl.load(W + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk, mask=mask, other=0).to(tl.float32)


@triton.jit
def _store_rows(Out, acc, offs_m, offs_n, m_mask, n_mask, stride_om, stride_on):
    ptrs = Out + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(ptrs, acc.to(Out.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _w8a16_matmul_kernel(
    X,  # (M, K) activations
    W,  # (N, K) int8
    S,  # (N,) scales
    Bias,  # (N,) or None
    Out,  # SPLIT_K == 1: (M, N) in X's dtype; else (SPLIT_K, M, N) float32 partial sums
    M,
    N,
    k_per_split,  # a multiple of BLOCK_K
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_sn,
    stride_bias,
    stride_os,
    stride_om,
    stride_on,
    SPLIT_K: tl.constexpr,
    IS_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """The int8 per-channel format: a plain tiled kernel, each output channel's scale applied after the K
    loop; with SPLIT_K, fp32 partial sums per K slice that ``_splitk_reduce_kernel`` adds in a fixed order."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    k_start = pid_k * k_per_split
    k_stop = tl.minimum(K, k_start + k_per_split)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_stop, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < k_stop
        x = tl.load(
            X + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
            mask=m_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        w = _int8_weight_tile(W, offs_n, offs_k, n_mask, k_mask, stride_wn, stride_wk)
        # the weight is rounded to the activations' dtype, as a dequantise-then-GEMM would round it
        if IS_FP32:
            acc = tl.dot(x, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w.to(x.dtype), acc)
    # per output channel: the scale factors out of the sum over K (and out of the sum over slices)
    acc *= tl.load(S + offs_n * stride_sn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    if SPLIT_K == 1:
        if Bias is not None:
            acc += tl.load(Bias + offs_n * stride_bias, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        _store_rows(Out, acc, offs_m, offs_n, m_mask, n_mask, stride_om, stride_on)
    else:
        _store_rows(Out + pid_k * stride_os, acc, offs_m, offs_n, m_mask, n_mask, stride_om, stride_on)


@triton.jit
def _splitk_reduce_kernel(
    Partial,  # (SPLIT_K, M, N) float32
    Bias,  # (N,) or None
    Out,  # (M, N)
    M,
    N,
    stride_ps,
    stride_pm,
    stride_pn,
    stride_om,
    stride_on,
    stride_bias,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Sum the K slices in a fixed order (slice 0 first): the same bits on every run."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    mask = m_mask[:, None] & n_mask[None, :]
    ptrs = Partial + offs_m[:, None] * stride_pm + offs_n[None, :] * stride_pn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ptrs + s * stride_ps, mask=mask, other=0.0)
    if Bias is not None:
        acc += tl.load(Bias + offs_n * stride_bias, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    _store_rows(Out, acc, offs_m, offs_n, m_mask, n_mask, stride_om, stride_on)
