"""The Triton kernel of FP8 attention (``kernels.attention.fp8``): the FA-2 forward loop on e4m3 operands.

``_fp8_fwd_kernel`` over ``_fp8_fwd_inner``, with the key-tile bounds, loads and masks of the FA-2 forward
(``common``). The portable kernel: FP8 runs on the FA-3 kernel on Hopper (``fa3_kernels.py``), on this one
on Ada, for other head dims and in the interpreter. Only ``@triton.jit`` code lives here; quantisation,
configuration, checks and the launcher are in ``fp8.py``.
"""

import triton
import triton.language as tl

from kernels.attention.common import key_tile_bounds, load_kv_tile, mask_scores
from kernels.attention.fp8_quant import round_to_e4m3


@triton.jit
def _fp8_fwd_inner(
    acc,  # (BLOCK_M, BLOCK_D) fp32, unnormalised output so far (in units of P_SCALE · V₈, times V scales)
    l_i,  # (BLOCK_M,) fp32 running row sum of exp2 (unscaled P)
    m_i,  # (BLOCK_M,) fp32 running row max in the scaled log2 domain
    q,  # (BLOCK_M, BLOCK_D) e4m3, pre-loaded
    k_ptrs,  # (BLOCK_N, BLOCK_D) pointers to the first K tile of this batch·head
    v_ptrs,
    ks_ptr,  # K descale of this batch·head's first K/V block
    vs_ptr,
    stride_kn,
    stride_vn,
    stride_ksblk,  # 0 unless K's scales are per block
    stride_vsblk,
    kv_scale_block,  # rows per K/V scale block (a multiple of BLOCK_N)
    offs_m,
    offs_n,
    offs_d,
    lo,
    hi,
    seqlen_k,
    diag,
    qk_scale,  # sm_scale · log2(e) · Q descale
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    P_SCALE: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    EVEN_D: tl.constexpr,
    V_SCALE_PER_TILE: tl.constexpr,
    EMULATE_P_CAST: tl.constexpr,
):
    k_ptrs += lo * stride_kn
    v_ptrs += lo * stride_vn
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        k = load_kv_tile(k_ptrs, cols, offs_d, seqlen_k, HEAD_DIM, MASKED, EVEN_D)
        blk = start_n // kv_scale_block
        k_scale = tl.load(ks_ptr + blk * stride_ksblk)
        qk = tl.dot(q, tl.trans(k))  # FP8 × FP8 → fp32
        if MASKED:
            qk = mask_scores(qk, cols, offs_m, seqlen_k, diag, IS_CAUSAL)
        s = qk * (qk_scale * k_scale)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if MASKED:
            # a row that has seen no visible key still has m = -inf; exp2(-inf - -inf) would be NaN
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_use = m_new
        p = tl.math.exp2(s - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = load_kv_tile(v_ptrs, cols, offs_d, seqlen_k, HEAD_DIM, MASKED, EVEN_D)
        if EMULATE_P_CAST:
            # the interpreter's fp32 → e4m3 cast is wrong; an e4m3-rounded P in float16 (exact) times V
            # widened to float16 (exact) with fp32 accumulation is what the FP8 MMA computes
            p_op = round_to_e4m3(p * P_SCALE).to(tl.float16)
            v_op = v.to(tl.float16)
        else:
            p_op = (p * P_SCALE).to(tl.float8e4nv)
            v_op = v
        if V_SCALE_PER_TILE:
            acc += tl.dot(p_op, v_op) * tl.load(vs_ptr + blk * stride_vsblk)
        else:
            acc = tl.dot(p_op, v_op, acc)
        m_i = m_new
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    return acc, l_i, m_i


@triton.jit
def _fp8_fwd_kernel(
    Q,  # (B, H, Nq, d) e4m3
    K,  # (B, H_kv, Nk, d) e4m3
    V,  # like K
    Out,  # (B, H, Nq, d) bfloat16 or float16
    QS,  # Q descale factors, fp32: strides (b, h, block), 0 where the granularity is coarser
    KS,
    VS,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_ob,
    stride_oh,
    stride_om,
    stride_od,
    stride_qsb,
    stride_qsh,
    stride_qsblk,
    stride_ksb,
    stride_ksh,
    stride_ksblk,
    stride_vsb,
    stride_vsh,
    stride_vsblk,
    q_scale_block,  # rows per Q scale block (a multiple of BLOCK_M)
    kv_scale_block,  # rows per K/V scale block (a multiple of BLOCK_N)
    num_heads,
    group,  # query heads per K/V head
    seqlen_q,
    seqlen_k,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_D: tl.constexpr,
    V_SCALE_PER_TILE: tl.constexpr,  # V's scale varies along the keys: applied per tile, not at the end
    EMULATE_P_CAST: tl.constexpr,  # the interpreter's path (see below)
    P_SCALE: tl.constexpr,  # P is multiplied by this before its cast to e4m3 (a power of two)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """BLOCK_M queries of one batch·head against their K/V tiles: the FA-2 forward loop with both products on
    e4m3 operands (head dims padded to a power of two ≥ 32, the K extent of an FP8 MMA).

    S = Q₈ K₈ᵀ (fp32 accumulation) times the tiles' Q and K descales; P = exp2(S − m) ∈ [0, 1] times P_SCALE
    (a power of two: exact) cast to e4m3; O += P₈ V₈ (fp32) times V's descale, per tile or, where V's scale
    does not vary along the keys, once at the end. ℓ sums the fp32 P before its rounding, as FlashAttention-3
    does. On sm_90 Triton's FP8 ``tl.dot`` accumulates with the tensor cores' own reduced-precision fp32
    unless ``max_num_imprecise_acc`` is set; that default is kept. Compiled for sm_90 both products are
    ``wgmma ... e4m3.e4m3`` and P's cast ``cvt.rn.satfinite``, for sm_89 ``mma.sync ... e4m3`` (test_fp8.py).

    EMULATE_P_CAST (the interpreter): Triton 3.6's interpreter runs ``tl.dot`` on e4m3 correctly (widened to
    float16, exactly, with fp32 accumulation) but converts fp32 to e4m3 wrongly (ties round up, a carry past
    the mantissa gives 1.0 for 1.97, subnormals flush to 0, values past 448 wrap). There P is rounded to the
    nearest e4m3 value with fp32 bit arithmetic (``fp8_quant.round_to_e4m3``) and multiplied with V widened to
    float16, which is what an FP8 MMA computes; on a GPU it takes the hardware's saturating rounding.
    """
    start_m = tl.program_id(0) * BLOCK_M
    off_bh = tl.program_id(1)
    off_b = (off_bh // num_heads).to(tl.int64)
    off_h = (off_bh % num_heads).to(tl.int64)
    off_hk = off_h // group

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q_ptrs = Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    k_ptrs = K + off_b * stride_kb + off_hk * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
    v_ptrs = V + off_b * stride_vb + off_hk * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
    io_mask = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(q_ptrs, mask=io_mask, other=0.0)

    q_scale = tl.load(QS + off_b * stride_qsb + off_h * stride_qsh + (start_m // q_scale_block) * stride_qsblk)
    ks_ptr = KS + off_b * stride_ksb + off_hk * stride_ksh
    vs_ptr = VS + off_b * stride_vsb + off_hk * stride_vsh
    qk_scale = sm_scale * 1.4426950408889634 * q_scale
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    diag, full_hi, hi = key_tile_bounds(start_m, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, IS_CAUSAL, EVEN_N)
    acc, l_i, m_i = _fp8_fwd_inner(
        acc,
        l_i,
        m_i,
        q,
        k_ptrs,
        v_ptrs,
        ks_ptr,
        vs_ptr,
        stride_kn,
        stride_vn,
        stride_ksblk,
        stride_vsblk,
        kv_scale_block,
        offs_m,
        offs_n,
        offs_d,
        0,
        full_hi,
        seqlen_k,
        diag,
        qk_scale,
        HEAD_DIM,
        BLOCK_N,
        P_SCALE,
        False,
        IS_CAUSAL,
        EVEN_D,
        V_SCALE_PER_TILE,
        EMULATE_P_CAST,
    )
    acc, l_i, m_i = _fp8_fwd_inner(
        acc,
        l_i,
        m_i,
        q,
        k_ptrs,
        v_ptrs,
        ks_ptr,
        vs_ptr,
        stride_kn,
        stride_vn,
        stride_ksblk,
        stride_vsblk,
        kv_scale_block,
        offs_m,
        offs_n,
        offs_d,
        full_hi,
        hi,
        seqlen_k,
        diag,
        qk_scale,
        HEAD_DIM,
        BLOCK_N,
        P_SCALE,
        True,
        IS_CAUSAL,
        EVEN_D,
        V_SCALE_PER_TILE,
        EMULATE_P_CAST,
    )

    # undo P's scaling (and V's scale when it is one per row of the output) in the one division
    denom = l_i * P_SCALE
    if not V_SCALE_PER_TILE:
        denom = denom / tl.load(vs_ptr)
    acc = acc / tl.where(l_i > 0.0, denom, 1.0)[:, None]  # rows that see no key: acc = 0, output 0
    o_ptrs = Out + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=io_mask)
