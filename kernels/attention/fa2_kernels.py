"""The Triton kernels of FlashAttention-2 (``kernels.attention.fa2``): forward, and the backward passes.

Only ``@triton.jit`` code lives here; configuration, launchers, autograd and the public functions are in
``fa2.py``, which is what callers import. Split out once the op passed ~800 lines (see STYLE.md).
"""

import triton
import triton.language as tl

# ---------------------------------------------------------------------------------------------------
# Triton kernels
# ---------------------------------------------------------------------------------------------------


@triton.jit
def _attn_fwd_inner(
    acc,  # (BLOCK_M, BLOCK_D) fp32, unnormalised output
    l_i,  # (BLOCK_M,) fp32, running row sum of exp2
    m_i,  # (BLOCK_M,) fp32, running row max in the scaled log2 domain
    q,  # (BLOCK_M, BLOCK_D) input dtype, pre-loaded
    k_ptrs,  # (BLOCK_N, BLOCK_D) pointers to the first K tile of this batch·head
    v_ptrs,  # (BLOCK_N, BLOCK_D) pointers to the first V tile
    stride_kn,
    stride_vn,
    offs_m,
    offs_n,
    offs_d,
    lo,
    hi,
    seqlen_k,
    diag,  # seqlen_k - seqlen_q: bottom-right causal alignment
    qk_scale,  # sm_scale * log2(e)
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    EVEN_D: tl.constexpr,
    IS_FP32: tl.constexpr,
):
    k_ptrs += lo * stride_kn
    v_ptrs += lo * stride_vn
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        if MASKED:
            kv_mask = cols[:, None] < seqlen_k
            if not EVEN_D:
                kv_mask = kv_mask & (offs_d[None, :] < HEAD_DIM)
            k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
        elif EVEN_D:
            k = tl.load(k_ptrs)
        else:
            k = tl.load(k_ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
        if IS_FP32:
            # the fp32 mode exists to be exact; Triton's default for an fp32 dot is TF32
            qk = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            qk = tl.dot(q, tl.trans(k))
        if MASKED:
            keep = cols[None, :] < seqlen_k
            if IS_CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None] + diag)
            qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        if MASKED:
            # a row that has seen no visible key still has m = -inf; exp2(-inf - -inf) would be NaN
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_use = m_new
        p = tl.math.exp2(qk * qk_scale - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if MASKED:
            v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
        elif EVEN_D:
            v = tl.load(v_ptrs)
        else:
            v = tl.load(v_ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
        if IS_FP32:
            acc = tl.dot(p, v, acc, input_precision="ieee")
        else:
            acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_kernel(
    Q,  # (B, H, Nq, d)
    K,  # (B, H, Nk, d)
    V,  # (B, H, Nk, d)
    Out,  # (B, H, Nq, d)
    LSE,  # (B, H, Nq) fp32, natural-log logsumexp of the scaled scores
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    num_heads,
    group,  # query heads per K/V head (1: multi-head; num_heads: multi-query)
    seqlen_q,
    seqlen_k,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    IS_FP32: tl.constexpr,
    EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    start_m = tl.program_id(0) * BLOCK_M
    off_bh = tl.program_id(1)
    off_b = (off_bh // num_heads).to(tl.int64)
    off_h = (off_bh % num_heads).to(tl.int64)
    off_hk = off_h // group  # the K/V head this query head reads (grouped-query attention)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    q_ptrs = Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    k_ptrs = K + off_b * stride_kb + off_hk * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
    v_ptrs = V + off_b * stride_vb + off_hk * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd

    if EVEN_M and EVEN_D:
        q = tl.load(q_ptrs)
    elif EVEN_M:
        q = tl.load(q_ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    elif EVEN_D:
        q = tl.load(q_ptrs, mask=offs_m[:, None] < seqlen_q, other=0.0)
    else:
        q = tl.load(q_ptrs, mask=(offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM), other=0.0)

    qk_scale = sm_scale * 1.4426950408889634
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # Split the K/V range into tiles every row of this Q tile sees whole (no mask: the fast loop) and
    # tiles that cross the causal diagonal or the sequence end (masked); tiles past both are skipped.
    if IS_CAUSAL:
        diag = seqlen_k - seqlen_q
        first_partial = tl.maximum(start_m + diag + 1, 0)  # keys below this are visible to every row
        full_hi = (first_partial // BLOCK_N) * BLOCK_N
        hi = tl.maximum(tl.minimum(seqlen_k, start_m + BLOCK_M + diag), full_hi)
    else:
        diag = 0
        if EVEN_N:
            full_hi = seqlen_k
        else:
            full_hi = (seqlen_k // BLOCK_N) * BLOCK_N
        hi = seqlen_k

    acc, l_i, m_i = _attn_fwd_inner(
        acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n, offs_d,
        0, full_hi, seqlen_k, diag, qk_scale,
        HEAD_DIM, BLOCK_N, False, IS_CAUSAL, EVEN_D, IS_FP32,
    )  # fmt: skip
    acc, l_i, m_i = _attn_fwd_inner(
        acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_n, offs_d,
        full_hi, hi, seqlen_k, diag, qk_scale,
        HEAD_DIM, BLOCK_N, True, IS_CAUSAL, EVEN_D, IS_FP32,
    )  # fmt: skip

    # the one division of the whole kernel; rows with no visible key (l = 0) give 0, not NaN
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    acc = acc / l_safe[:, None]
    lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453, float("-inf"))

    tl.store(LSE + off_bh.to(tl.int64) * seqlen_q + offs_m, lse, mask=offs_m < seqlen_q)
    o_ptrs = Out + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    out = acc.to(Out.dtype.element_ty)
    if EVEN_M and EVEN_D:
        tl.store(o_ptrs, out)
    else:
        tl.store(o_ptrs, out, mask=(offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _attn_bwd_p(
    q,  # (BLOCK_M, BLOCK_D)
    k,  # (BLOCK_N, BLOCK_D)
    lse2,  # (BLOCK_M,) logsumexp in the log2 domain
    offs_m,
    offs_n,
    seqlen_q,
    seqlen_k,
    diag,
    qk_scale,  # sm_scale * log2(e)
    IS_CAUSAL: tl.constexpr,
    IS_FP32: tl.constexpr,
):
    """Recompute the probabilities P (BLOCK_M, BLOCK_N) of one tile from Q, K and the saved logsumexp."""
    if IS_FP32:
        qk = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        qk = tl.dot(q, tl.trans(k))
    keep = (offs_m[:, None] < seqlen_q) & (offs_n[None, :] < seqlen_k)
    if IS_CAUSAL:
        keep = keep & (offs_n[None, :] <= offs_m[:, None] + diag)
    # rows that see no key have lse = -inf and every entry masked: where() keeps the inf out
    p = tl.math.exp2(qk * qk_scale - lse2[:, None])
    return tl.where(keep, p, 0.0)


@triton.jit
def _attn_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_gb, stride_gh, stride_gn, stride_gd,  # of DK and DV: contiguous, the shape of K
    num_heads,
    num_kv_heads,
    group,  # query heads per K/V head: their contributions are summed here, in order
    seqlen_q,
    seqlen_k,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    IS_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    """dK and dV of one block of BLOCK_N keys of one K/V head: a pass over the query blocks of every
    query head of its group that can see it.

    Each program owns its dK/dV rows, so no atomics are needed and the result is deterministic.
    """
    start_n = tl.program_id(0) * BLOCK_N
    off_bhk = tl.program_id(1)
    off_b = (off_bhk // num_kv_heads).to(tl.int64)
    off_hk = (off_bhk % num_kv_heads).to(tl.int64)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d[None, :] < HEAD_DIM
    kv_mask = (offs_n[:, None] < seqlen_k) & d_ok
    k = tl.load(K + off_b * stride_kb + off_hk * stride_kh + offs_n[:, None] * stride_kn
                + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)  # fmt: skip
    v = tl.load(V + off_b * stride_vb + off_hk * stride_vh + offs_n[:, None] * stride_vn
                + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)  # fmt: skip
    qk_scale = sm_scale * 1.4426950408889634
    diag = seqlen_k - seqlen_q
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    # query rows before start_n - diag see none of these keys under the causal mask
    lo = 0
    if IS_CAUSAL:
        lo = (tl.maximum(start_n - diag, 0) // BLOCK_M) * BLOCK_M
    for g in range(0, group):
        off_h = off_hk * group + g
        off_bh = off_b * num_heads + off_h
        dk, dv = _attn_bwd_dkdv_head(
            dk, dv, k, v, Q, DO, LSE, DELTA, off_b, off_h, off_bh,
            stride_qb, stride_qh, stride_qm, stride_qd, stride_dob, stride_doh, stride_dom, stride_dod,
            offs_n, offs_d, d_ok, lo, seqlen_q, seqlen_k, diag, qk_scale,
            IS_CAUSAL, IS_FP32, BLOCK_M,
        )  # fmt: skip
    dk = dk * sm_scale
    out_mask = kv_mask
    g_off = off_b * stride_gb + off_hk * stride_gh + offs_n[:, None] * stride_gn + offs_d[None, :] * stride_gd
    tl.store(DK + g_off, dk.to(DK.dtype.element_ty), mask=out_mask)
    tl.store(DV + g_off, dv.to(DV.dtype.element_ty), mask=out_mask)


@triton.jit
def _attn_bwd_dkdv_head(
    dk, dv, k, v, Q, DO, LSE, DELTA, off_b, off_h, off_bh,
    stride_qb, stride_qh, stride_qm, stride_qd, stride_dob, stride_doh, stride_dom, stride_dod,
    offs_n, offs_d, d_ok, lo, seqlen_q, seqlen_k, diag, qk_scale,
    IS_CAUSAL: tl.constexpr,
    IS_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
):  # fmt: skip
    """One query head's contribution to a K/V block's dK and dV (unscaled)."""
    for start_m in range(lo, seqlen_q, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_ok = offs_m < seqlen_q
        q_mask = m_ok[:, None] & d_ok
        q = tl.load(Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qm
                    + offs_d[None, :] * stride_qd, mask=q_mask, other=0.0)  # fmt: skip
        do = tl.load(DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_dom
                     + offs_d[None, :] * stride_dod, mask=q_mask, other=0.0)  # fmt: skip
        lse = tl.load(LSE + off_bh * seqlen_q + offs_m, mask=m_ok, other=0.0)
        delta = tl.load(DELTA + off_bh * seqlen_q + offs_m, mask=m_ok, other=0.0)
        p = _attn_bwd_p(q, k, lse * 1.4426950408889634, offs_m, offs_n, seqlen_q, seqlen_k, diag, qk_scale,
                        IS_CAUSAL, IS_FP32)  # fmt: skip
        if IS_FP32:
            dv += tl.dot(tl.trans(p), do, input_precision="ieee")
            dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        else:
            dv += tl.dot(tl.trans(p.to(do.dtype)), do)
            dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        if IS_FP32:
            dk += tl.dot(tl.trans(ds), q, input_precision="ieee")
        else:
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
    return dk, dv


@triton.jit
def _attn_bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_gb, stride_gh, stride_gm, stride_gd,  # of DQ: contiguous, the shape of Q
    num_heads,
    group,
    seqlen_q,
    seqlen_k,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    IS_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    """dQ of one block of BLOCK_M queries: a pass over the key blocks it can see (deterministic)."""
    start_m = tl.program_id(0) * BLOCK_M
    off_bh = tl.program_id(1)
    off_b = (off_bh // num_heads).to(tl.int64)
    off_h = (off_bh % num_heads).to(tl.int64)
    off_hk = off_h // group
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d[None, :] < HEAD_DIM
    m_ok = offs_m < seqlen_q
    q_mask = m_ok[:, None] & d_ok
    q = tl.load(Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=q_mask, other=0.0)  # fmt: skip
    do = tl.load(DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_dom
                 + offs_d[None, :] * stride_dod, mask=q_mask, other=0.0)  # fmt: skip
    lse = tl.load(LSE + off_bh.to(tl.int64) * seqlen_q + offs_m, mask=m_ok, other=0.0)
    delta = tl.load(DELTA + off_bh.to(tl.int64) * seqlen_q + offs_m, mask=m_ok, other=0.0)
    qk_scale = sm_scale * 1.4426950408889634
    diag = seqlen_k - seqlen_q
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    hi = seqlen_k
    if IS_CAUSAL:  # keys past the last row's diagonal are hidden from the whole block
        hi = tl.maximum(tl.minimum(seqlen_k, start_m + BLOCK_M + diag), 0)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n[:, None] < seqlen_k) & d_ok
        k = tl.load(K + off_b * stride_kb + off_hk * stride_kh + offs_n[:, None] * stride_kn
                    + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)  # fmt: skip
        v = tl.load(V + off_b * stride_vb + off_hk * stride_vh + offs_n[:, None] * stride_vn
                    + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)  # fmt: skip
        p = _attn_bwd_p(q, k, lse * 1.4426950408889634, offs_m, offs_n, seqlen_q, seqlen_k, diag, qk_scale,
                        IS_CAUSAL, IS_FP32)  # fmt: skip
        if IS_FP32:
            dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        else:
            dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        if IS_FP32:
            dq += tl.dot(ds, k, input_precision="ieee")
        else:
            dq += tl.dot(ds.to(k.dtype), k)
    dq = dq * sm_scale
    tl.store(DQ + off_b * stride_gb + off_h * stride_gh + offs_m[:, None] * stride_gm + offs_d[None, :] * stride_gd,
             dq.to(DQ.dtype.element_ty), mask=q_mask)  # fmt: skip


_fwd_heuristic_kernel = triton.heuristics(
    {
        "EVEN_M": lambda a: a["seqlen_q"] % a["BLOCK_M"] == 0,
        "EVEN_N": lambda a: a["seqlen_k"] % a["BLOCK_N"] == 0,
    }
)(_attn_fwd_kernel)
