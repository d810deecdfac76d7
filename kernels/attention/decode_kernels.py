"""The Triton kernels of decoding attention (``kernels.attention.decode`` launches them and says what they handle).

- ``kv_rows``: where a K/V tile's keys are. A contiguous cache strides through one request's keys; a paged one
  looks each key's page up in the request's block table (one entry a tile when a tile fits in a page, one a
  key otherwise), clamps an entry outside the cache to a page that exists and raises the request's flag.
- ``decode_inner``: the online softmax over a range of K/V tiles, through ``kv_rows``: the loop the paged and
  the contiguous path share (one K/V tile of it is ``common.softmax_step``, as in FA-2's loop).
- ``_decode_split_kernel``: one program per (key split, request, group of query heads sharing a K/V head,
  block of packed rows); its tile stacks the query rows of every head of the group, so each K/V byte it
  reads serves all of them.
- ``_decode_merge_kernel``: the splits' partial outputs merged by their logsumexps.
- ``_append_kernel``: new tokens' K/V written into their pages (a page entry outside the cache: nothing is
  written, the flag is raised).

The flag of request b holds 1 + the largest logical page (its index in the request's block table) that was
out of range, or 1 + the table's length when the request's length needs more pages than the table has; 0 when
every page was good. ``decode.check_page_flags`` turns it into a message.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.attention.common import accumulate_pv, load_kv_tile, mask_scores, softmax_step, tile_scores

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def kv_rows(
    start_n,
    offs_n,
    off_b,
    seqlen,
    BT,  # (B, table_len) int32: the request's pages, in order (paged only)
    FLAGS,  # (B,) int32 page flags (HAS_FLAGS only)
    stride_btb,
    stride_btp,
    num_pages,
    stride_kt,  # paged: between the tokens of a page; contiguous: between keys
    stride_kp,  # paged: between pages
    stride_vt,
    stride_vp,
    PAGED: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_FLAGS: tl.constexpr,
):
    """Offsets (int64, in elements, from the K/V head's base) of the keys ``start_n + offs_n``: ``(k_rows,
    v_rows)``. Keys at or past ``seqlen`` (which the caller clamped to the table's capacity) are masked by the
    loads; their page is not looked up."""
    cols = start_n + offs_n
    if PAGED:
        if PAGE % BLOCK_N == 0:  # the tile lies in one page: one lookup
            lp = start_n // PAGE
            page = tl.load(BT + off_b * stride_btb + lp * stride_btp)
            bad = (page < 0) | (page >= num_pages)
            if HAS_FLAGS:
                tl.atomic_max(FLAGS + off_b, lp + 1, mask=bad)
            slot = (start_n % PAGE + offs_n).to(tl.int64)
        else:  # a tile spans pages: one lookup per key
            lp = cols // PAGE
            live = cols < seqlen
            page = tl.load(BT + off_b * stride_btb + lp * stride_btp, mask=live, other=0)
            bad = live & ((page < 0) | (page >= num_pages))
            if HAS_FLAGS:
                tl.atomic_max(FLAGS + off_b + 0 * lp, lp + 1, mask=bad)
            slot = (cols % PAGE).to(tl.int64)
        page = tl.minimum(tl.maximum(page, 0), num_pages - 1).to(tl.int64)  # never outside the cache
        k_rows = page * stride_kp + slot * stride_kt
        v_rows = page * stride_vp + slot * stride_vt
    else:
        k_rows = cols.to(tl.int64) * stride_kt
        v_rows = cols.to(tl.int64) * stride_vt
    return k_rows, v_rows


@triton.jit
def decode_inner(
    acc,  # (BLOCK_M, BLOCK_D) fp32, unnormalised output so far
    l_i,  # (BLOCK_M,) fp32 running row sum
    m_i,  # (BLOCK_M,) fp32 running row max (scaled log2 domain)
    q,  # (BLOCK_M, BLOCK_D) the packed query rows
    q_idx,  # (BLOCK_M,) each row's position among the request's new tokens (for the causal mask)
    K,  # the K head's base (contiguous: of this request too)
    V,
    BT,
    FLAGS,
    off_b,
    offs_n,
    offs_d,
    lo,
    hi,
    seqlen,  # keys of this request
    diag,  # seqlen - seqlen_q: bottom-right causal alignment
    qk_scale,
    stride_btb,
    stride_btp,
    num_pages,
    stride_kt,
    stride_kp,
    stride_kd,
    stride_vt,
    stride_vp,
    stride_vd,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    EVEN_D: tl.constexpr,
    IS_FP32: tl.constexpr,
    PAGED: tl.constexpr,
    PAGE: tl.constexpr,
    HAS_FLAGS: tl.constexpr,
):
    """Stream keys [lo, hi) of one request through the online softmax of its packed query rows; every tile
    masked (a split's last tile and the causal diagonal need it, and decoding is bound by the loads)."""
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        k_rows, v_rows = kv_rows(
            start_n,
            offs_n,
            off_b,
            seqlen,
            BT,
            FLAGS,
            stride_btb,
            stride_btp,
            num_pages,
            stride_kt,
            stride_kp,
            stride_vt,
            stride_vp,
            PAGED,
            PAGE,
            BLOCK_N,
            HAS_FLAGS,
        )
        k = load_kv_tile(
            K + k_rows[:, None] + offs_d[None, :] * stride_kd, cols, offs_d, seqlen, HEAD_DIM, True, EVEN_D
        )
        qk = mask_scores(tile_scores(q, k, IS_FP32), cols, q_idx, seqlen, diag, IS_CAUSAL)
        p, acc, l_i, m_i = softmax_step(acc, l_i, m_i, qk, qk_scale, True, False)
        v = load_kv_tile(
            V + v_rows[:, None] + offs_d[None, :] * stride_vd, cols, offs_d, seqlen, HEAD_DIM, True, EVEN_D
        )
        acc = accumulate_pv(acc, p, v, l_i, True, IS_FP32, False)
    return acc, l_i, m_i


@triton.jit
def _decode_split_kernel(
    Q,  # (B, H, Nq, d)
    K,  # contiguous: (B, H_kv, Nk, d); paged: (num_pages, page, H_kv, d) or (num_pages, H_kv, page, d)
    V,  # as K
    PART_O,  # (S, B·H·Nq, d) fp32: normalised output of each split
    PART_LSE,  # (S, B·H·Nq) fp32: natural-log logsumexp of each split (-inf where it saw no key)
    LENS,  # (B,) int32 keys per request (HAS_LENS)
    BT,  # (B, table_len) int32 block table (PAGED)
    FLAGS,  # (B,) int32 page flags (HAS_FLAGS)
    stride_qb,
    stride_qh,
    stride_qm,
    stride_qd,
    stride_kb,  # contiguous: between requests; paged: 0
    stride_kp,  # paged: between pages; contiguous: 0
    stride_kt,  # between the keys of a request (contiguous) or of a page (paged)
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vp,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_lens,
    stride_btb,
    stride_btp,
    num_heads,
    group,  # query heads per K/V head
    heads_per_prog,  # query heads a program packs into its tile (group, or 1 unpacked)
    m_blocks,  # programs per head group along the packed rows
    seqlen_q,
    seqlen_k,  # contiguous: keys of every request (their most, with LENS); paged: the table's capacity
    table_len,
    num_pages,
    chunk,  # keys per split, a multiple of BLOCK_N
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    IS_FP32: tl.constexpr,
    EVEN_D: tl.constexpr,
    PAGED: tl.constexpr,
    PAGE: tl.constexpr,
    HAS_LENS: tl.constexpr,
    HAS_FLAGS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    split = tl.program_id(0)
    pid = tl.program_id(1)
    num_splits = tl.num_programs(0)
    n_groups = num_heads // heads_per_prog
    m_block = pid % m_blocks
    off_g = (pid // m_blocks) % n_groups
    off_b = pid // (m_blocks * n_groups)
    first_head = off_g * heads_per_prog
    off_hk = (first_head // group).to(tl.int64)
    # the tile's rows: (head of the group, new token) pairs, head-major
    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < heads_per_prog * seqlen_q
    q_idx = rows % seqlen_q
    head = first_head + rows // seqlen_q
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d[None, :] < HEAD_DIM
    b64 = off_b.to(tl.int64)
    q = tl.load(
        Q
        + b64 * stride_qb
        + head[:, None].to(tl.int64) * stride_qh
        + q_idx[:, None] * stride_qm
        + offs_d[None, :] * stride_qd,
        mask=row_ok[:, None] & d_ok,
        other=0.0,
    )
    seqlen = seqlen_k
    if HAS_LENS:
        seqlen = tl.load(LENS + off_b * stride_lens)
        if PAGED and HAS_FLAGS:  # a length the block table cannot hold, or a negative one
            tl.atomic_max(FLAGS + off_b, table_len + 1, mask=seqlen > seqlen_k)
            tl.atomic_max(FLAGS + off_b, 1, mask=seqlen < 0)
        seqlen = tl.minimum(tl.maximum(seqlen, 0), seqlen_k)
    lo = split * chunk
    hi = tl.where(split == num_splits - 1, seqlen, tl.minimum(lo + chunk, seqlen))  # the last split takes the rest
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    acc, l_i, m_i = decode_inner(
        acc,
        l_i,
        m_i,
        q,
        q_idx,
        K + b64 * stride_kb + off_hk * stride_kh,
        V + b64 * stride_vb + off_hk * stride_vh,
        BT,
        FLAGS,
        off_b,
        offs_n,
        offs_d,
        lo,
        hi,
        seqlen,
        seqlen - seqlen_q,
        sm_scale * LOG2E,
        stride_btb,
        stride_btp,
        num_pages,
        stride_kt,
        stride_kp,
        stride_kd,
        stride_vt,
        stride_vp,
        stride_vd,
        HEAD_DIM,
        BLOCK_N,
        IS_CAUSAL,
        EVEN_D,
        IS_FP32,
        PAGED,
        PAGE,
        HAS_FLAGS,
    )
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) * LN2, float("-inf"))
    total_rows = tl.num_programs(1) // m_blocks * heads_per_prog * seqlen_q  # B·H·Nq
    out_row = split.to(tl.int64) * total_rows + (b64 * num_heads + head) * seqlen_q + q_idx
    tl.store(PART_LSE + out_row, lse, mask=row_ok)
    tl.store(PART_O + out_row[:, None] * HEAD_DIM + offs_d[None, :], acc / l_safe[:, None], mask=row_ok[:, None] & d_ok)


@triton.jit
def _decode_merge_kernel(
    PART_O,  # (S, B·H·Nq, d) fp32
    PART_LSE,  # (S, B·H·Nq) fp32
    Out,  # (B, H, Nq, d) contiguous
    LSE,  # (B·H·Nq,) fp32
    num_splits,
    rows,  # B·H·Nq
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """One program per output row: weights exp(L_s − L) over the splits, then the weighted sum."""
    row = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < num_splits
    lse_s = tl.load(PART_LSE + offs_s * rows + row, mask=s_ok, other=float("-inf"))
    m = tl.max(lse_s, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.where(lse_s == float("-inf"), 0.0, tl.exp(lse_s - m_safe))
    total = tl.sum(w, 0)
    o_s = tl.load(
        PART_O + (offs_s[:, None] * rows + row) * HEAD_DIM + offs_d[None, :],
        mask=s_ok[:, None] & (offs_d[None, :] < HEAD_DIM),
        other=0.0,
    )
    total_safe = tl.where(total > 0.0, total, 1.0)
    o = tl.sum(o_s * w[:, None], 0) / total_safe
    tl.store(Out + row * HEAD_DIM + offs_d, o.to(Out.dtype.element_ty), mask=offs_d < HEAD_DIM)
    tl.store(LSE + row, tl.where(total > 0.0, m_safe + tl.log(total_safe), float("-inf")))


@triton.jit
def _append_kernel(
    K_NEW,  # (B, H_kv, N_new, d)
    V_NEW,  # (B, H_kv, N_new, d)
    K,  # (num_pages, page, H_kv, d) or (num_pages, H_kv, page, d)
    V,
    CACHE_LENS,  # (B,) int32: tokens already in each request's pages
    BT,  # (B, table_len) int32
    FLAGS,  # (B,) int32 (HAS_FLAGS)
    stride_knb,
    stride_knh,
    stride_knn,
    stride_knd,
    stride_vnb,
    stride_vnh,
    stride_vnn,
    stride_vnd,
    stride_kp,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vp,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_lens,
    stride_btb,
    stride_btp,
    heads_kv,
    n_new,
    table_len,
    num_pages,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    HAS_FLAGS: tl.constexpr,
):
    """One program per (request, new token): its K and V rows of every K/V head into the token's slot, the
    page looked up in the request's block table. A page entry outside the cache (or a position past the
    table) writes nothing, so no other request's page is overwritten."""
    pid = tl.program_id(0)
    off_b = pid // n_new
    tok = pid % n_new
    pos = tl.load(CACHE_LENS + off_b * stride_lens) + tok
    lp = pos // PAGE
    in_table = (pos >= 0) & (lp < table_len)
    page = tl.load(BT + off_b * stride_btb + lp * stride_btp, mask=in_table, other=-1)
    good = in_table & (page >= 0) & (page < num_pages)
    if HAS_FLAGS:
        tl.atomic_max(FLAGS + off_b, tl.maximum(lp, 0) + 1, mask=~good)
    page64 = tl.where(good, page, 0).to(tl.int64)
    slot = (pos % PAGE).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < heads_kv) & (offs_d[None, :] < HEAD_DIM)
    b64 = off_b.to(tl.int64)
    src_k = K_NEW + b64 * stride_knb + offs_h[:, None] * stride_knh + tok * stride_knn + offs_d[None, :] * stride_knd
    src_v = V_NEW + b64 * stride_vnb + offs_h[:, None] * stride_vnh + tok * stride_vnn + offs_d[None, :] * stride_vnd
    dst_k = K + page64 * stride_kp + slot * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :] * stride_kd
    dst_v = V + page64 * stride_vp + slot * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :] * stride_vd
    tl.store(dst_k, tl.load(src_k, mask=mask), mask=mask & good)
    tl.store(dst_v, tl.load(src_v, mask=mask), mask=mask & good)
