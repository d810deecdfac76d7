"""The Triton kernels of FlashAttention-2 (``kernels.attention.fa2``): forward, and the backward passes.

Forward (``_attn_fwd_kernel`` over ``common.attn_fwd_inner``, the loop decoding shares), then the backward:
Δ (``_attn_bwd_delta_kernel``), dK/dV (``_attn_bwd_dkdv_kernel`` over ``_attn_bwd_dkdv_tiles``) and dQ
(``_attn_bwd_dq_kernel`` over ``_attn_bwd_dq_tiles``). Every kernel but Δ's takes the dense ``[B, H, N, d]``
layout or, with ``IS_VARLEN``, packed ``[tokens, H, d]`` sequences located by int32 ``cu_seqlens`` offsets
(the batch stride is then 0, each program moves its base pointers to its sequence's first token, and the
grid spans the longest sequence: programs past their own sequence's end return at once).

Only ``@triton.jit`` code lives here; configuration, launchers, autograd and the public functions are in
``fa2.py``, which is what callers import.
"""

import triton
import triton.language as tl

from kernels.attention.common import attn_fwd_inner, key_tile_bounds

# ---------------------------------------------------------------------------------------------------
# Triton kernels
# ---------------------------------------------------------------------------------------------------


@triton.jit
def _sequence(CU, off_b):
    """Start (int64) and length (int32) of sequence ``off_b`` of a packed batch, from its offsets ``CU``."""
    start = tl.load(CU + off_b).to(tl.int64)
    return start, (tl.load(CU + off_b + 1) - start).to(tl.int32)


@triton.jit
def _attn_fwd_kernel(
    Q,  # (B, H, Nq, d); varlen: (total_q, H, d)
    K,  # (B, H_kv, Nk, d); varlen: (total_k, H_kv, d)
    V,  # like K
    Out,  # like Q
    LSE,  # (B, H, Nq) fp32, natural-log logsumexp of the scaled scores; varlen: (H, total_q)
    CU_Q,  # varlen only: (B + 1,) int32 offsets of each sequence's first query token; None otherwise
    CU_K,  # varlen only: (B + 1,) int32, of each sequence's first key token
    stride_qb,
    stride_qh,
    stride_qm,
    stride_qd,  # varlen: stride_qb = 0, stride_qm the token stride
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
    stride_lb,
    stride_lh,  # of LSE (row stride 1); the dense path uses the equal off_bh * seqlen_q
    num_heads,
    group,  # query heads per K/V head (1: multi-head; num_heads: multi-query)
    seqlen_q,  # varlen: the longest query sequence (the grid's extent); each program loads its own
    seqlen_k,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    IS_FP32: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    EAGER_RESCALE: tl.constexpr,  # normalise the output at every K/V tile (FA-1) instead of once at the end
    EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M
    off_bh = tl.program_id(1)
    off_b = (off_bh // num_heads).to(tl.int64)
    off_h = (off_bh % num_heads).to(tl.int64)
    off_hk = off_h // group  # the K/V head this query head reads (grouped-query attention)
    if IS_VARLEN:
        # packed sequences: this batch index's slice of the token axis; blocks past its end have no work
        q_start, seqlen_q = _sequence(CU_Q, off_b)
        if start_m >= seqlen_q:
            return
        k_start, seqlen_k = _sequence(CU_K, off_b)
        Q += q_start * stride_qm
        Out += q_start * stride_om
        LSE += q_start
        K += k_start * stride_kn
        V += k_start * stride_vn

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
    diag, full_hi, hi = key_tile_bounds(start_m, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, IS_CAUSAL, EVEN_N)

    acc, l_i, m_i = attn_fwd_inner(
        acc,
        l_i,
        m_i,
        q,
        k_ptrs,
        v_ptrs,
        stride_kn,
        stride_vn,
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
        False,
        IS_CAUSAL,
        EVEN_D,
        IS_FP32,
        EAGER_RESCALE,
    )
    acc, l_i, m_i = attn_fwd_inner(
        acc,
        l_i,
        m_i,
        q,
        k_ptrs,
        v_ptrs,
        stride_kn,
        stride_vn,
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
        True,
        IS_CAUSAL,
        EVEN_D,
        IS_FP32,
        EAGER_RESCALE,
    )

    # lazy: the one division of the whole kernel; rows with no visible key (l = 0) give 0, not NaN
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    if not EAGER_RESCALE:
        acc = acc / l_safe[:, None]
    lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453, float("-inf"))

    if IS_VARLEN:
        lse_ptrs = LSE + off_h * stride_lh + offs_m  # LSE already points at this sequence's first token
    else:
        lse_ptrs = LSE + off_bh.to(tl.int64) * seqlen_q + offs_m  # (B, H, Nq) contiguous
    tl.store(lse_ptrs, lse, mask=offs_m < seqlen_q)
    o_ptrs = Out + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    out = acc.to(Out.dtype.element_ty)
    if EVEN_M and EVEN_D:
        tl.store(o_ptrs, out)
    else:
        tl.store(o_ptrs, out, mask=(offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _attn_bwd_delta_kernel(
    Out,  # (B, H, Nq, d) the forward's output
    DO,  # (B, H, Nq, d) its upstream gradient
    DELTA,  # (B, H, Nq) fp32, rows contiguous: Δ_i = Σ_j dO_ij · O_ij
    stride_ob,
    stride_oh,
    stride_om,
    stride_od,
    stride_dob,
    stride_doh,
    stride_dom,
    stride_dod,
    stride_lb,
    stride_lh,  # of DELTA (its row stride is 1)
    num_heads,
    seqlen,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """Δ for BLOCK_M rows of one batch·head, accumulated in fp32 without an fp32 copy of O or dO in HBM.

    A packed (varlen) batch comes as one batch of total_q rows: the row offsets are 64-bit, since the token
    axis of a whole packed batch can pass 2³¹ elements."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    off_bh = tl.program_id(1)
    off_b = (off_bh // num_heads).to(tl.int64)
    off_h = (off_bh % num_heads).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < seqlen
    mask = m_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(
        Out + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
        mask=mask,
        other=0.0,
    )
    do = tl.load(
        DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
        mask=mask,
        other=0.0,
    )
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + off_b * stride_lb + off_h * stride_lh + offs_m, delta, mask=m_ok)


@triton.jit
def _attn_bwd_dkdv_tiles(
    dk,  # (BLOCK_N, BLOCK_D) fp32, this key block's dK so far (unscaled)
    dv,  # (BLOCK_N, BLOCK_D) fp32
    k,  # (BLOCK_N, BLOCK_D) input dtype, pre-loaded (rows past seqlen_k are 0)
    v,  # (BLOCK_N, BLOCK_D)
    Q_head,  # this query head's row 0 of Q (scalar pointer)
    DO_head,  # and of dO
    LSE_head,  # and of the logsumexp (natural log), rows contiguous
    DELTA_head,  # and of Δ, rows contiguous
    stride_qm,
    stride_qd,
    stride_dom,
    stride_dod,
    offs_m0,  # arange(0, BLOCK_M)
    offs_n,  # start_n + arange(0, BLOCK_N)
    offs_d,
    lo,
    hi,  # query rows [lo, hi), both multiples of BLOCK_M (hi may also be seqlen_q)
    seqlen_q,
    seqlen_k,
    diag,  # seqlen_k - seqlen_q: bottom-right causal alignment
    qk_scale,  # sm_scale * log2(e)
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    EVEN_D: tl.constexpr,
    IS_FP32: tl.constexpr,
):
    """One query head's contribution to a key block's dK and dV over the query tiles [lo, hi).

    MASKED=False is the fast loop, for query tiles that lie inside seqlen_q and whose every row sees every
    key of the block: no bounds masks on the loads, no causal ``where``. Neither loop masks P by the
    sequence ends: query rows past seqlen_q load Q = dO = 0 and add exactly 0 to dK and dV, and key
    columns past seqlen_k only reach their own rows of dK/dV, which are never stored.
    """
    for start_m in range(lo, hi, BLOCK_M):
        # addresses from 1-D offsets inside the loop: loop-carried 2-D pointer tiles cost registers
        offs_m = start_m + offs_m0
        q_ptrs = Q_head + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
        do_ptrs = DO_head + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod
        if MASKED:
            m_ok = offs_m < seqlen_q
            if EVEN_D:
                q_mask = m_ok[:, None]
            else:
                q_mask = m_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
            q = tl.load(q_ptrs, mask=q_mask, other=0.0)
            do = tl.load(do_ptrs, mask=q_mask, other=0.0)
            lse = tl.load(LSE_head + offs_m, mask=m_ok, other=0.0)
            delta = tl.load(DELTA_head + offs_m, mask=m_ok, other=0.0)
        else:
            if EVEN_D:
                q = tl.load(q_ptrs)
                do = tl.load(do_ptrs)
            else:
                q = tl.load(q_ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
                do = tl.load(do_ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
            lse = tl.load(LSE_head + offs_m)
            delta = tl.load(DELTA_head + offs_m)
        if IS_FP32:
            qk = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            qk = tl.dot(q, tl.trans(k))
        p = tl.math.exp2(qk * qk_scale - lse[:, None] * 1.4426950408889634)
        if MASKED and IS_CAUSAL:
            # a query row that sees no key has lse = -inf (p = inf) and every key hidden: where() keeps it out
            p = tl.where(offs_n[None, :] <= offs_m[:, None] + diag, p, 0.0)
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
def _attn_bwd_dkdv_kernel(
    Q,  # (B, H, Nq, d)
    K,  # (B, H_kv, Nk, d)
    V,  # (B, H_kv, Nk, d)
    DO,  # (B, H, Nq, d)
    LSE,  # (B, H, Nq) fp32, rows contiguous
    DELTA,  # (B, H, Nq) fp32, the same layout as LSE
    DK,  # (B, H_kv, Nk, d)
    DV,  # (B, H_kv, Nk, d), the strides of DK
    CU_Q,  # varlen only (all tensors then packed, as in the forward): (B + 1,) int32 query offsets
    CU_K,  # varlen only: (B + 1,) int32 key offsets
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
    stride_dob,
    stride_doh,
    stride_dom,
    stride_dod,
    stride_gb,
    stride_gh,
    stride_gn,
    stride_gd,  # of DK and DV
    stride_lb,
    stride_lh,  # of LSE and DELTA
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
    IS_VARLEN: tl.constexpr,
    EVEN_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """dK and dV of one block of BLOCK_N keys of one K/V head: a pass over the query tiles of every
    query head of its group that can see it.

    Each program owns its dK/dV rows, so no atomics are needed and the result is deterministic.
    """
    start_n = tl.program_id(0) * BLOCK_N
    off_bhk = tl.program_id(1)
    off_b = (off_bhk // num_kv_heads).to(tl.int64)
    off_hk = (off_bhk % num_kv_heads).to(tl.int64)
    if IS_VARLEN:
        k_start, seqlen_k = _sequence(CU_K, off_b)
        if start_n >= seqlen_k:
            return
        q_start, seqlen_q = _sequence(CU_Q, off_b)
        K += k_start * stride_kn
        V += k_start * stride_vn
        DK += k_start * stride_gn
        DV += k_start * stride_gn
        Q += q_start * stride_qm
        DO += q_start * stride_dom
        LSE += q_start
        DELTA += q_start
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    kv_mask = (offs_n[:, None] < seqlen_k) & (offs_d[None, :] < HEAD_DIM)
    k = tl.load(
        K + off_b * stride_kb + off_hk * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
        mask=kv_mask,
        other=0.0,
    )
    v = tl.load(
        V + off_b * stride_vb + off_hk * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
        mask=kv_mask,
        other=0.0,
    )
    qk_scale = sm_scale * 1.4426950408889634
    diag = seqlen_k - seqlen_q

    # Query tiles, in order: [lo, mid) cross the causal diagonal of this key block (masked); [mid, full_end)
    # see all of it and lie inside seqlen_q (the fast loop); [tail, seqlen_q) is the partial last tile.
    full_end = (seqlen_q // BLOCK_M) * BLOCK_M
    if IS_CAUSAL:
        # rows before start_n - diag see none of these keys; rows from start_n + BLOCK_N - 1 - diag see all
        lo = (tl.maximum(start_n - diag, 0) // BLOCK_M) * BLOCK_M
        mid = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - diag, 0), BLOCK_M) * BLOCK_M
        mid = tl.maximum(tl.minimum(mid, full_end), lo)
        tail = tl.maximum(full_end, mid)
    else:
        lo = 0
        mid = 0
        tail = full_end

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    for g in range(0, group):
        off_h = off_hk * group + g
        q_head = Q + off_b * stride_qb + off_h * stride_qh
        do_head = DO + off_b * stride_dob + off_h * stride_doh
        lse_head = LSE + off_b * stride_lb + off_h * stride_lh
        delta_head = DELTA + off_b * stride_lb + off_h * stride_lh
        dk, dv = _attn_bwd_dkdv_tiles(
            dk,
            dv,
            k,
            v,
            q_head,
            do_head,
            lse_head,
            delta_head,
            stride_qm,
            stride_qd,
            stride_dom,
            stride_dod,
            offs_m0,
            offs_n,
            offs_d,
            lo,
            mid,
            seqlen_q,
            seqlen_k,
            diag,
            qk_scale,
            HEAD_DIM,
            BLOCK_M,
            True,
            IS_CAUSAL,
            EVEN_D,
            IS_FP32,
        )
        dk, dv = _attn_bwd_dkdv_tiles(
            dk,
            dv,
            k,
            v,
            q_head,
            do_head,
            lse_head,
            delta_head,
            stride_qm,
            stride_qd,
            stride_dom,
            stride_dod,
            offs_m0,
            offs_n,
            offs_d,
            mid,
            full_end,
            seqlen_q,
            seqlen_k,
            diag,
            qk_scale,
            HEAD_DIM,
            BLOCK_M,
            False,
            IS_CAUSAL,
            EVEN_D,
            IS_FP32,
        )
        dk, dv = _attn_bwd_dkdv_tiles(
            dk,
            dv,
            k,
            v,
            q_head,
            do_head,
            lse_head,
            delta_head,
            stride_qm,
            stride_qd,
            stride_dom,
            stride_dod,
            offs_m0,
            offs_n,
            offs_d,
            tail,
            seqlen_q,
            seqlen_q,
            seqlen_k,
            diag,
            qk_scale,
            HEAD_DIM,
            BLOCK_M,
            True,
            IS_CAUSAL,
            EVEN_D,
            IS_FP32,
        )
    dk = dk * sm_scale
    g_off = off_b * stride_gb + off_hk * stride_gh + offs_n[:, None] * stride_gn + offs_d[None, :] * stride_gd
    tl.store(DK + g_off, dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + g_off, dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _attn_bwd_dq_tiles(
    dq,  # (BLOCK_M, BLOCK_D) fp32, this query block's dQ so far (unscaled)
    q,  # (BLOCK_M, BLOCK_D) input dtype, pre-loaded
    do,  # (BLOCK_M, BLOCK_D)
    lse2,  # (BLOCK_M,) logsumexp in the log2 domain
    delta,  # (BLOCK_M,) Δ
    K_head,  # this K/V head's key 0 (scalar pointer)
    V_head,
    stride_kn,
    stride_kd,
    stride_vn,
    stride_vd,
    offs_m,
    offs_n0,  # arange(0, BLOCK_N)
    offs_d,
    lo,
    hi,  # keys [lo, hi); lo is a multiple of BLOCK_N
    seqlen_k,
    diag,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    EVEN_D: tl.constexpr,
    IS_FP32: tl.constexpr,
):
    """A query block's dQ over the key tiles [lo, hi). MASKED=False: tiles inside seqlen_k that every row
    of the block sees whole (no bounds masks, no ``where``), as in the forward. Query rows past seqlen_q
    need no mask: their Q, dO, Δ and logsumexp load as 0, and their dQ rows are never stored."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        k_ptrs = K_head + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
        v_ptrs = V_head + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
        if MASKED:
            kv_mask = offs_n[:, None] < seqlen_k
            if not EVEN_D:
                kv_mask = kv_mask & (offs_d[None, :] < HEAD_DIM)
            k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
            v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
        elif EVEN_D:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        else:
            k = tl.load(k_ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
            v = tl.load(v_ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
        if IS_FP32:
            qk = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            qk = tl.dot(q, tl.trans(k))
        p = tl.math.exp2(qk * qk_scale - lse2[:, None])
        if MASKED:
            # a row that sees no key has lse = -inf (p = inf) and every key masked: where() keeps it out
            keep = offs_n[None, :] < seqlen_k
            if IS_CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None] + diag)
            p = tl.where(keep, p, 0.0)
        if IS_FP32:
            dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        else:
            dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        if IS_FP32:
            dq += tl.dot(ds, k, input_precision="ieee")
        else:
            dq += tl.dot(ds.to(k.dtype), k)
    return dq


@triton.jit
def _attn_bwd_dq_kernel(
    Q,  # (B, H, Nq, d)
    K,  # (B, H_kv, Nk, d)
    V,  # (B, H_kv, Nk, d)
    DO,  # (B, H, Nq, d)
    LSE,  # (B, H, Nq) fp32, rows contiguous
    DELTA,  # (B, H, Nq) fp32, the same layout as LSE
    DQ,  # (B, H, Nq, d)
    CU_Q,  # varlen only (all tensors then packed, as in the forward): (B + 1,) int32 query offsets
    CU_K,  # varlen only: (B + 1,) int32 key offsets
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
    stride_dob,
    stride_doh,
    stride_dom,
    stride_dod,
    stride_gb,
    stride_gh,
    stride_gm,
    stride_gd,  # of DQ
    stride_lb,
    stride_lh,  # of LSE and DELTA
    num_heads,
    group,
    seqlen_q,
    seqlen_k,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    IS_FP32: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    EVEN_N: tl.constexpr,
    EVEN_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """dQ of one block of BLOCK_M queries: a pass over the key tiles it can see (deterministic)."""
    start_m = tl.program_id(0) * BLOCK_M
    off_bh = tl.program_id(1)
    off_b = (off_bh // num_heads).to(tl.int64)
    off_h = (off_bh % num_heads).to(tl.int64)
    off_hk = off_h // group
    if IS_VARLEN:
        q_start, seqlen_q = _sequence(CU_Q, off_b)
        if start_m >= seqlen_q:
            return
        k_start, seqlen_k = _sequence(CU_K, off_b)
        Q += q_start * stride_qm
        DO += q_start * stride_dom
        DQ += q_start * stride_gm
        LSE += q_start
        DELTA += q_start
        K += k_start * stride_kn
        V += k_start * stride_vn
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < seqlen_q
    q_mask = m_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(
        Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
        mask=q_mask,
        other=0.0,
    )
    do = tl.load(
        DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
        mask=q_mask,
        other=0.0,
    )
    lse_off = off_b * stride_lb + off_h * stride_lh + offs_m
    lse2 = tl.load(LSE + lse_off, mask=m_ok, other=0.0) * 1.4426950408889634
    delta = tl.load(DELTA + lse_off, mask=m_ok, other=0.0)
    k_head = K + off_b * stride_kb + off_hk * stride_kh
    v_head = V + off_b * stride_vb + off_hk * stride_vh
    qk_scale = sm_scale * 1.4426950408889634

    # Key tiles as in the forward: [0, full_hi) visible to every row of the block (the fast loop),
    # [full_hi, hi) crossing the causal diagonal or the sequence end (masked); the rest is hidden.
    diag, full_hi, hi = key_tile_bounds(start_m, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, IS_CAUSAL, EVEN_N)

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dq = _attn_bwd_dq_tiles(
        dq,
        q,
        do,
        lse2,
        delta,
        k_head,
        v_head,
        stride_kn,
        stride_kd,
        stride_vn,
        stride_vd,
        offs_m,
        offs_n0,
        offs_d,
        0,
        full_hi,
        seqlen_k,
        diag,
        qk_scale,
        HEAD_DIM,
        BLOCK_N,
        False,
        IS_CAUSAL,
        EVEN_D,
        IS_FP32,
    )
    dq = _attn_bwd_dq_tiles(
        dq,
        q,
        do,
        lse2,
        delta,
        k_head,
        v_head,
        stride_kn,
        stride_kd,
        stride_vn,
        stride_vd,
        offs_m,
        offs_n0,
        offs_d,
        full_hi,
        hi,
        seqlen_k,
        diag,
        qk_scale,
        HEAD_DIM,
        BLOCK_N,
        True,
        IS_CAUSAL,
        EVEN_D,
        IS_FP32,
    )
    dq = dq * sm_scale
    tl.store(
        DQ + off_b * stride_gb + off_h * stride_gh + offs_m[:, None] * stride_gm + offs_d[None, :] * stride_gd,
        dq.to(DQ.dtype.element_ty),
        mask=q_mask,
    )


# Even sizes select the unmasked loads and stores at compile time; packed (varlen) sequences never are
_fwd_heuristic_kernel = triton.heuristics(
    {
        "EVEN_M": lambda a: not a["IS_VARLEN"] and a["seqlen_q"] % a["BLOCK_M"] == 0,
        "EVEN_N": lambda a: not a["IS_VARLEN"] and a["seqlen_k"] % a["BLOCK_N"] == 0,
    }
)(_attn_fwd_kernel)
