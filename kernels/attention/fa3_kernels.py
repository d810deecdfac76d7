"""The Gluon kernel of FlashAttention-3's forward (``kernels.attention.fa3``), for Hopper (sm_90).

One CTA owns ``NUM_CONSUMERS × BLOCK_M`` query rows of one (batch, head) and streams that head's K/V tiles
through a ring of ``NUM_STAGES`` shared-memory buffers, each guarded by a "ready" and an "empty" mbarrier.
With ``WARP_SPECIALIZE`` the CTA splits into partitions (``gl.warp_specialize``): a producer that only
issues loads (one warp with TMA, a warpgroup with per-thread ``cp.async``), and ``NUM_CONSUMERS`` consumer
warpgroups that only run WGMMA and the online softmax, each owning ``BLOCK_M`` (64) rows, with registers
moved from the producer to the consumers (``setmaxnreg``). Without it, one partition of
``4 · NUM_CONSUMERS`` warps issues its own TMA loads a ring ahead (the schedule FA-2-class kernels use).

Within a consumer (``OVERLAP``), iteration j issues S_j = Q K_jᵀ and then O += P_{j-1} V_{j-1}, and waits
only for S_j before its softmax, so the exponentials of tile j run while the tensor cores finish tile
j-1's product. ``PINGPONG`` makes the two consumers take turns issuing those GEMMs (a pair of mbarriers
passes the turn), so that one warpgroup's softmax runs while the other's GEMMs occupy the tensor cores.

Only ``@gluon.jit`` code lives here; configuration, checks and the launcher are in ``fa3.py``.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

_LN2 = gl.constexpr(0.6931471805599453)


@gluon.constexpr_function
def _mma_layout(num_warps, n, k_width_bits):
    # wgmma's accumulator: 16-row slabs per warp, a warpgroup covers 64 rows; K per instruction = 256 bits
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                     instr_shape=[16, n, 256 // k_width_bits])  # fmt: skip


@gluon.constexpr_function
def _copy_layout(num_warps, head_dim, elem_bits):
    # per-thread loads for the cp.async producer: 16 bytes a thread, a row's threads side by side
    vec = 128 // elem_bits
    cols = min(32, head_dim // vec)
    return gl.BlockedLayout([1, vec], [32 // cols, cols], [num_warps, 1], [1, 0])


# ---------------------------------------------------------------------------------------------------
# Shared pieces: the tile range, loads, the online softmax
# ---------------------------------------------------------------------------------------------------


@gluon.jit
def _tile_range(start_m, seqlen_q, seqlen_k, CTA_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """(tiles to stream, of which the first ones need no mask) for the CTA's rows [start_m, start_m + CTA_M).

    Every partition of the CTA walks the same tiles, so the producer and the consumers agree on the ring's
    phases and the ping-pong turns balance. Causal (bottom-right aligned): row i sees keys j <= i + off."""
    if IS_CAUSAL:
        off = seqlen_k - seqlen_q
        hi = gl.minimum(gl.maximum(start_m + CTA_M + off, 0), seqlen_k)
        n_full = gl.maximum(start_m + off + 1, 0) // BLOCK_N
    else:
        hi = seqlen_k
        n_full = seqlen_k // BLOCK_N
    n_tiles = gl.cdiv(hi, BLOCK_N)
    n_full = gl.minimum(gl.minimum(n_full, seqlen_k // BLOCK_N), n_tiles)
    return n_tiles, n_full


@gluon.jit
def _cp_async_rows(dst, base, row0, nrows, stride_row, ROWS: gl.constexpr, CHUNK: gl.constexpr,
                   HEAD_DIM: gl.constexpr, layout: gl.constexpr):  # fmt: skip
    """Per-thread asynchronous copies of rows [row0, row0 + ROWS) of a (·, HEAD_DIM) matrix into ``dst``,
    CHUNK rows at a time (few live addresses per thread); rows at or past ``nrows`` are zero-filled."""
    cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, layout))
    for r in gl.static_range(0, ROWS, CHUNK):
        rows = row0 + r + gl.arange(0, CHUNK, gl.SliceLayout(1, layout))
        ptrs = base + gl.expand_dims(rows.to(gl.int64) * stride_row, 1) + gl.expand_dims(cols, 0)
        async_copy.async_copy_global_to_shared(dst.slice(r, CHUNK), ptrs, mask=gl.expand_dims(rows < nrows, 1))


@gluon.jit
def _tma_tile(desc, b, h, row, bar, dst, pred=True):
    """One TMA load of a (rows, head_dim) tile of a [B, H, N, d] tensor; rows past N arrive as zeros."""
    mbarrier.expect(bar, desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(desc, [b, h, row, 0], bar, dst.reshape(desc.block_type.shape), pred=pred)


@gluon.jit
def _issue_scores(q_tile, k_tile, s_layout: gl.constexpr):
    """S = Q Kᵀ on the tensor cores, asynchronously (a fresh accumulator: use_acc=False)."""
    shape: gl.constexpr = [q_tile.shape[0], k_tile.shape[0]]
    return warpgroup_mma(q_tile, k_tile.permute((1, 0)), gl.zeros(shape, gl.float32, s_layout), use_acc=False,
                         is_async=True)  # fmt: skip


@gluon.jit
def _masked(s, rows, n0, seqlen_k, causal_off, IS_CAUSAL: gl.constexpr, layout: gl.constexpr):
    """Scores of keys past seqlen_k and, if causal, right of the bottom-right-aligned diagonal → -inf."""
    BLOCK_N: gl.constexpr = s.shape[1]
    cols = gl.expand_dims(n0 + gl.arange(0, BLOCK_N, gl.SliceLayout(0, layout)), 0)
    keep = cols < seqlen_k
    if IS_CAUSAL:
        keep = keep & (cols <= gl.expand_dims(rows, 1) + causal_off)
    return gl.where(keep, s, float("-inf"))


@gluon.jit
def _softmax_step(s, m_i, l_i, qk_scale):
    """One tile of the online softmax in the log2 domain: (P, new row max, new row sum, rescale factor).

    The row max is taken on the raw scores and scaled after (the scale is positive), so that each
    exponent is one fused multiply-add. A row that has seen only masked keys keeps m = -inf; its
    exponentials are taken against 0 so that it gives P = 0 and a factor of 0 instead of NaN."""
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_use, 1))
    l_new = l_i * alpha + gl.sum(p, axis=1)
    return p, m_new, l_new, alpha


# ---------------------------------------------------------------------------------------------------
# Partitions
# ---------------------------------------------------------------------------------------------------


@gluon.jit
def _producer(descs, ptrs, strides, smem, bars, b, h, h_kv, start_m, seqlen_q, seqlen_k,
              USE_TMA: gl.constexpr, NUM_CONSUMERS: gl.constexpr, IS_CAUSAL: gl.constexpr):  # fmt: skip
    """Loads only: the consumers' Q tiles once, then K_j and V_j into ring slot j % NUM_STAGES as soon as the
    consumers have released it (K first: the next S = Q Kᵀ needs it before the P V product needs V)."""
    q_desc, k_desc, v_desc, o_desc = descs
    q_ptr, k_ptr, v_ptr = ptrs
    stride_qn, stride_kn, stride_vn = strides
    q_smem, k_smem, v_smem = smem
    q_bars, k_ready, v_ready, k_empty, v_empty, turn = bars
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.shape[2]
    BLOCK_M: gl.constexpr = q_smem.shape[1]
    layout: gl.constexpr = _copy_layout(gl.num_warps(), HEAD_DIM, k_smem.dtype.primitive_bitwidth)
    n_tiles, n_full = _tile_range(start_m, seqlen_q, seqlen_k, BLOCK_M * NUM_CONSUMERS, BLOCK_N, IS_CAUSAL)

    for c in gl.static_range(NUM_CONSUMERS):
        dst = q_smem.index(c)
        if USE_TMA:
            _tma_tile(q_desc, b, h, start_m + c * BLOCK_M, q_bars.index(c), dst)
        else:
            _cp_async_rows(dst, q_ptr, start_m + c * BLOCK_M, seqlen_q, stride_qn, BLOCK_M, 32, HEAD_DIM, layout)
            async_copy.mbarrier_arrive(q_bars.index(c), increment_count=False)
    for j in range(n_tiles):
        slot = j % STAGES
        phase = (j // STAGES) & 1
        # a fresh mbarrier counts as having completed the phase before its first: the first lap passes
        mbarrier.wait(k_empty.index(slot), phase ^ 1)
        if USE_TMA:
            _tma_tile(k_desc, b, h_kv, j * BLOCK_N, k_ready.index(slot), k_smem.index(slot))
        else:
            _cp_async_rows(k_smem.index(slot), k_ptr, j * BLOCK_N, seqlen_k, stride_kn, BLOCK_N, 32, HEAD_DIM, layout)
            async_copy.mbarrier_arrive(k_ready.index(slot), increment_count=False)
        mbarrier.wait(v_empty.index(slot), phase ^ 1)
        if USE_TMA:
            _tma_tile(v_desc, b, h_kv, j * BLOCK_N, v_ready.index(slot), v_smem.index(slot))
        else:
            _cp_async_rows(v_smem.index(slot), v_ptr, j * BLOCK_N, seqlen_k, stride_vn, BLOCK_N, 32, HEAD_DIM, layout)
            async_copy.mbarrier_arrive(v_ready.index(slot), increment_count=False)


@gluon.jit
def _consumer_tile(j, state, descs, smem, bars, q_tile, rows, b, h_kv, n_tiles, seqlen_k, causal_off, qk_scale,
                   C: gl.constexpr, WARP_SPECIALIZE: gl.constexpr, PINGPONG: gl.constexpr, OVERLAP: gl.constexpr,
                   IS_CAUSAL: gl.constexpr, MASKED: gl.constexpr):  # fmt: skip
    """Tile j of a consumer: issue S_j = Q K_jᵀ, rescale O by tile j-1's factor while it runs, issue
    O += P_{j-1} V_{j-1}, then the softmax of S_j.

    wgmma groups complete in issue order, so waiting for all but one group waits for S_j alone (OVERLAP):
    the exponentials of tile j run while the tensor cores finish P_{j-1} V_{j-1}, and P_j is converted
    to 16 bits into registers of its own before that product is waited for."""
    m_i, l_i, acc, p, alpha, turn_phase = state
    q_desc, k_desc, v_desc, o_desc = descs
    q_smem, k_smem, v_smem = smem
    q_bars, k_ready, v_ready, k_empty, v_empty, turn = bars
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    s_layout: gl.constexpr = _mma_layout(gl.num_warps(), BLOCK_N, k_smem.dtype.primitive_bitwidth)
    o_row_layout: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    slot = j % STAGES
    prev = (j - 1) % STAGES
    mbarrier.wait(k_ready.index(slot), (j // STAGES) & 1)
    if PINGPONG:
        mbarrier.wait(turn.index(C), turn_phase)
        turn_phase = turn_phase ^ 1
    s_tok = _issue_scores(q_tile, k_smem.index(slot), s_layout)
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_row_layout), 1)
    mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
    acc = warpgroup_mma(p, v_smem.index(prev), acc, is_async=True)
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - C))
    if OVERLAP:
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
    else:
        s, acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok, acc, p))
    if WARP_SPECIALIZE:
        mbarrier.arrive(k_empty.index(slot))
    if MASKED:
        s = _masked(s, rows, j * BLOCK_N, seqlen_k, causal_off, IS_CAUSAL, s_layout)
    p_new, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale)
    p_next = gl.convert_layout(p_new.to(k_smem.dtype), p.type.layout)
    if OVERLAP:
        acc, p, p_next = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p, p_next))
    if WARP_SPECIALIZE:
        mbarrier.arrive(v_empty.index(prev))
    else:  # slot `prev` is free again: refill it with the tile NUM_STAGES ahead
        ahead = j - 1 + STAGES
        _tma_tile(k_desc, b, h_kv, ahead * BLOCK_N, k_ready.index(prev), k_smem.index(prev), pred=ahead < n_tiles)
        _tma_tile(v_desc, b, h_kv, ahead * BLOCK_N, v_ready.index(prev), v_smem.index(prev), pred=ahead < n_tiles)
    return m_i, l_i, acc, p_next, alpha, turn_phase


@gluon.jit
def _consumer(descs, smem, bars, lse_ptr, b, h, h_kv, bh, start_m, seqlen_q, seqlen_k, qk_scale,
              C: gl.constexpr, NUM_CONSUMERS: gl.constexpr, WARP_SPECIALIZE: gl.constexpr,
              PINGPONG: gl.constexpr, OVERLAP: gl.constexpr, IS_CAUSAL: gl.constexpr):  # fmt: skip
    """Q Kᵀ, the online softmax and P V for this consumer's rows; then O and the logsumexp out.

    With WARP_SPECIALIZE: consumer C of NUM_CONSUMERS, the producer fills the ring. Without: the only
    partition, every row of the CTA, issuing its own TMA loads NUM_STAGES tiles ahead."""
    q_desc, k_desc, v_desc, o_desc = descs
    q_smem, k_smem, v_smem = smem
    q_bars, k_ready, v_ready, k_empty, v_empty, turn = bars
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.shape[2]
    dtype: gl.constexpr = k_smem.dtype
    ROWS: gl.constexpr = q_smem.shape[1]  # this partition's rows: one TMA transfer of Q and of O
    CTA_M: gl.constexpr = ROWS * NUM_CONSUMERS if WARP_SPECIALIZE else ROWS
    row0 = start_m + C * ROWS
    q_tile = q_smem.index(C)
    num_warps: gl.constexpr = gl.num_warps()
    bits: gl.constexpr = dtype.primitive_bitwidth
    s_layout: gl.constexpr = _mma_layout(num_warps, BLOCK_N, bits)
    o_layout: gl.constexpr = _mma_layout(num_warps, HEAD_DIM, bits)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=32 // bits)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)

    n_tiles, n_full = _tile_range(start_m, seqlen_q, seqlen_k, CTA_M, BLOCK_N, IS_CAUSAL)
    causal_off = seqlen_k - seqlen_q
    rows = row0 + gl.arange(0, ROWS, row_layout)
    if not WARP_SPECIALIZE:
        _tma_tile(q_desc, b, h, row0, q_bars.index(C), q_tile)
        for t in gl.static_range(STAGES):
            _tma_tile(k_desc, b, h_kv, t * BLOCK_N, k_ready.index(t), k_smem.index(t), pred=t < n_tiles)
            _tma_tile(v_desc, b, h_kv, t * BLOCK_N, v_ready.index(t), v_smem.index(t), pred=t < n_tiles)
    mbarrier.wait(q_bars.index(C), 0)

    m_i = gl.full([ROWS], float("-inf"), gl.float32, row_layout)
    l_i = gl.zeros([ROWS], gl.float32, row_layout)
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)
    p = gl.zeros([ROWS, BLOCK_N], dtype, p_layout)
    alpha = gl.zeros([ROWS], gl.float32, row_layout)  # the factor O still owes the last softmax step
    turn_phase = gl.to_tensor(1 - C)  # consumer 0 takes the first turn: a fresh mbarrier lets phase 1 through

    # Tile 0: its scores and softmax, no P V product yet.
    if n_tiles > 0:
        mbarrier.wait(k_ready.index(0), 0)
        if PINGPONG:
            mbarrier.wait(turn.index(C), turn_phase)
            turn_phase = turn_phase ^ 1
        s_tok = _issue_scores(q_tile, k_smem.index(0), s_layout)
        if PINGPONG:
            mbarrier.arrive(turn.index(1 - C))
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
        if WARP_SPECIALIZE:
            mbarrier.arrive(k_empty.index(0))
        if n_full == 0:
            s = _masked(s, rows, 0, seqlen_k, causal_off, IS_CAUSAL, s_layout)
        p_new, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale)
        p = gl.convert_layout(p_new.to(dtype), p_layout)

    # Tiles 1 … n_full-1 need no mask, the rest (the causal diagonal, the sequence's end) do.
    state = (m_i, l_i, acc, p, alpha, turn_phase)
    for j in range(1, n_full):
        state = _consumer_tile(j, state, descs, smem, bars, q_tile, rows, b, h_kv, n_tiles, seqlen_k, causal_off,
                               qk_scale, C, WARP_SPECIALIZE, PINGPONG, OVERLAP, IS_CAUSAL, False)  # fmt: skip
    for j in range(gl.maximum(n_full, 1), n_tiles):
        state = _consumer_tile(j, state, descs, smem, bars, q_tile, rows, b, h_kv, n_tiles, seqlen_k, causal_off,
                               qk_scale, C, WARP_SPECIALIZE, PINGPONG, OVERLAP, IS_CAUSAL, True)  # fmt: skip
    m_i, l_i, acc, p, alpha, turn_phase = state

    # The last P V product.
    if n_tiles > 0:
        last = (n_tiles - 1) % STAGES
        mbarrier.wait(v_ready.index(last), ((n_tiles - 1) // STAGES) & 1)
        if PINGPONG:
            mbarrier.wait(turn.index(C), turn_phase)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_row_layout), 1)
        acc = warpgroup_mma(p, v_smem.index(last), acc, is_async=True)
        if PINGPONG:
            mbarrier.arrive(turn.index(1 - C))
        acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p))
        if WARP_SPECIALIZE:
            mbarrier.arrive(v_empty.index(last))

    # O = acc / ℓ through Q's shared memory (no longer read) and TMA; the logsumexp per row.
    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    out = acc / gl.expand_dims(gl.convert_layout(l_safe, o_row_layout), 1)
    lse = gl.where(l_i == 0.0, float("-inf"), (m_i + gl.log2(l_safe)) * _LN2)
    q_tile.store(out.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [b, h, row0, 0], q_tile.reshape(o_desc.block_type.shape))
    gl.store(lse_ptr + bh.to(gl.int64) * seqlen_q + rows, lse, mask=rows < seqlen_q)
    tma.store_wait(0)


# ---------------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------------


@gluon.jit
def _fa3_fwd_kernel(
    q_desc, k_desc, v_desc, o_desc,  # [B, H, Nq, d], [B, H_kv, Nk, d] ×2, [B, H, Nq, d]: TMA descriptors
    q_ptr, k_ptr, v_ptr,  # the same tensors' bases, for the per-thread (cp.async) producer
    lse_ptr,  # [B, H, Nq] fp32, contiguous
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    seqlen_q, seqlen_k, heads, kv_group, qk_scale,
    BLOCK_M: gl.constexpr,  # rows per consumer warpgroup
    BLOCK_N: gl.constexpr,
    NUM_CONSUMERS: gl.constexpr,
    NUM_STAGES: gl.constexpr,
    IS_CAUSAL: gl.constexpr,
    WARP_SPECIALIZE: gl.constexpr,
    PINGPONG: gl.constexpr,
    OVERLAP: gl.constexpr,
    USE_TMA: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
):  # fmt: skip
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[3]
    dtype: gl.constexpr = q_desc.dtype
    CTA_M: gl.constexpr = BLOCK_M * NUM_CONSUMERS
    # causal: the CTAs with the most tiles start first, so the last wave is made of short ones
    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)
    bh = gl.program_id(1)
    b = bh // heads
    h = bh % heads
    h_kv = h // kv_group
    start_m = pid_m * CTA_M

    ROWS: gl.constexpr = q_desc.block_type.shape[2]  # a consumer's rows (all of the CTA's without WS)
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, HEAD_DIM], dtype)
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
    q_smem = gl.allocate_shared_memory(dtype, [CTA_M // ROWS, ROWS, HEAD_DIM], q_layout)
    k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    q_bars = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], bar_layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], bar_layout)
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], bar_layout)
    k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], bar_layout)
    v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], bar_layout)
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)
    # a TMA load arrives once (with its byte count); per-thread copies arrive once per producer thread
    arrivals: gl.constexpr = 1 if USE_TMA else 32 * gl.num_warps()
    for i in gl.static_range(NUM_CONSUMERS):
        mbarrier.init(q_bars.index(i), count=arrivals)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(i), count=arrivals)
        mbarrier.init(v_ready.index(i), count=arrivals)
        mbarrier.init(k_empty.index(i), count=NUM_CONSUMERS)
        mbarrier.init(v_empty.index(i), count=NUM_CONSUMERS)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)

    descs = (q_desc, k_desc, v_desc, o_desc)
    smem = (q_smem, k_smem, v_smem)
    bars = (q_bars, k_ready, v_ready, k_empty, v_empty, turn)
    if WARP_SPECIALIZE:
        base_q = q_ptr + b.to(gl.int64) * stride_qb + h.to(gl.int64) * stride_qh
        base_k = k_ptr + b.to(gl.int64) * stride_kb + h_kv.to(gl.int64) * stride_kh
        base_v = v_ptr + b.to(gl.int64) * stride_vb + h_kv.to(gl.int64) * stride_vh
        ptrs = (base_q, base_k, base_v)
        strides = (stride_qn, stride_kn, stride_vn)
        gl.static_assert(NUM_CONSUMERS == 1 or NUM_CONSUMERS == 2, "one or two consumer warpgroups")
        if NUM_CONSUMERS == 2:
            gl.warp_specialize(
                [
                    (_producer, (descs, ptrs, strides, smem, bars, b, h, h_kv, start_m, seqlen_q, seqlen_k,
                                 USE_TMA, NUM_CONSUMERS, IS_CAUSAL)),
                    (_consumer, (descs, smem, bars, lse_ptr, b, h, h_kv, bh, start_m, seqlen_q, seqlen_k, qk_scale,
                                 0, NUM_CONSUMERS, WARP_SPECIALIZE, PINGPONG, OVERLAP, IS_CAUSAL)),
                    (_consumer, (descs, smem, bars, lse_ptr, b, h, h_kv, bh, start_m, seqlen_q, seqlen_k, qk_scale,
                                 1, NUM_CONSUMERS, WARP_SPECIALIZE, PINGPONG, OVERLAP, IS_CAUSAL)),
                ],
                [4, 4], [CONSUMER_REGS, CONSUMER_REGS],
            )  # fmt: skip
        else:
            gl.warp_specialize(
                [
                    (_producer, (descs, ptrs, strides, smem, bars, b, h, h_kv, start_m, seqlen_q, seqlen_k,
                                 USE_TMA, NUM_CONSUMERS, IS_CAUSAL)),
                    (_consumer, (descs, smem, bars, lse_ptr, b, h, h_kv, bh, start_m, seqlen_q, seqlen_k, qk_scale,
                                 0, NUM_CONSUMERS, WARP_SPECIALIZE, PINGPONG, OVERLAP, IS_CAUSAL)),
                ],
                [4], [CONSUMER_REGS],
            )  # fmt: skip
    else:
        _consumer(descs, smem, bars, lse_ptr, b, h, h_kv, bh, start_m, seqlen_q, seqlen_k, qk_scale,
                  0, NUM_CONSUMERS, WARP_SPECIALIZE, PINGPONG, OVERLAP, IS_CAUSAL)  # fmt: skip
