"""The Gluon kernel of FlashAttention-3's forward for Hopper (sm_90), 16-bit and FP8 (``kernels.attention.fa3``).

A CTA owns NUM_CONSUMERS × 64 query rows of one (batch, head) and streams that head's K/V tiles through a ring
of NUM_STAGES shared-memory slots, each guarded by a "ready" and an "empty" mbarrier: a producer partition
loads (TMA, or per-thread ``cp.async``) and consumer warpgroups run WGMMA and the online softmax
(``fa3.Schedule`` says what each switch changes). FP8 (IS_FP8) runs both products on e4m3 with fp32 descales,
V in ``fa3.FP8Values``' layout. The partitions' shared state travels in aggregates (``Variant``, ``Program``,
``Buffers``, ...). What bounds the FP8 loop, and what was tried against it: docs/limits.md.
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
from triton.language.core import _aggregate as aggregate

from kernels.attention.fa3_tiles import (
    _copy_layout,
    _cp_async_tile,
    _issue_row_sums,
    _issue_scores,
    _masked,
    _mma_layout,
    _p_operand,
    _pv_a,
    _softmax_step,
    _tile_range,
    _tile_scale,
    _tma_tile,
    _tma_v,
    _v_operand,
)

_LN2 = gl.constexpr(0.6931471805599453)
# e4m3's 1.0 as a byte: sign 0, exponent 0111 (the bias), mantissa 000
_E4M3_ONE = gl.constexpr(0x38)


# ---------------------------------------------------------------------------------------------------
# What the partitions share (aggregates: flattened into the partitions' arguments as tuples are)
# ---------------------------------------------------------------------------------------------------

# A runtime int: Triton passes an argument equal to 1 (a length, a stride) as a constexpr, so a field that takes
# one, or a value made from one, holds either. (The constructors are constexpr functions, which get constexprs
# as plain Python values: they wrap them again.)
_INT = (gl.tensor, gl.constexpr)


@aggregate
class Variant:
    """One variant's compile-time choices (``fa3.kernel_specialisation`` sets them): the consumer warpgroups,
    the schedule's switches, the mask, and FP8 (e4m3 operands with descales, V transposed; P computed times
    2^P_SHIFT; one Q descale per Q_BLOCK rows and one K/V descale per KV_BLOCK keys where they are per block;
    the row sums on the tensor cores with SUMS_ON_MMA)."""

    NUM_CONSUMERS: gl.constexpr
    WARP_SPECIALIZE: gl.constexpr
    PINGPONG: gl.constexpr
    OVERLAP: gl.constexpr
    USE_TMA: gl.constexpr
    IS_CAUSAL: gl.constexpr
    IS_FP8: gl.constexpr
    P_SHIFT: gl.constexpr
    Q_BLOCK: gl.constexpr
    KV_BLOCK: gl.constexpr
    SUMS_ON_MMA: gl.constexpr

    @gluon.constexpr_function
    def __init__(
        self,
        NUM_CONSUMERS,
        WARP_SPECIALIZE,
        PINGPONG,
        OVERLAP,
        USE_TMA,
        IS_CAUSAL,
        IS_FP8,
        P_SHIFT,
        Q_BLOCK,
        KV_BLOCK,
        SUMS_ON_MMA,
    ):
        self.NUM_CONSUMERS = gl.constexpr(NUM_CONSUMERS)
        self.WARP_SPECIALIZE = gl.constexpr(WARP_SPECIALIZE)
        self.PINGPONG = gl.constexpr(PINGPONG)
        self.OVERLAP = gl.constexpr(OVERLAP)
        self.USE_TMA = gl.constexpr(USE_TMA)
        self.IS_CAUSAL = gl.constexpr(IS_CAUSAL)
        self.IS_FP8 = gl.constexpr(IS_FP8)
        self.P_SHIFT = gl.constexpr(P_SHIFT)
        self.Q_BLOCK = gl.constexpr(Q_BLOCK)
        self.KV_BLOCK = gl.constexpr(KV_BLOCK)
        self.SUMS_ON_MMA = gl.constexpr(SUMS_ON_MMA)


@aggregate
class Program:
    """The CTA's work: batch ``b``, query head ``h`` and the K/V head ``h_kv`` it reads (``bh`` = b · heads + h),
    its first query row, and the sequence lengths."""

    b: gl.tensor
    h: gl.tensor
    h_kv: gl.tensor
    bh: gl.tensor
    start_m: gl.tensor
    seqlen_q: _INT
    seqlen_k: _INT

    @gluon.constexpr_function
    def __init__(self, b, h, h_kv, bh, start_m, seqlen_q, seqlen_k):
        self.b = b
        self.h = h
        self.h_kv = h_kv
        self.bh = bh
        self.start_m = start_m
        self.seqlen_q = seqlen_q if isinstance(seqlen_q, gl.tensor) else gl.constexpr(seqlen_q)
        self.seqlen_k = seqlen_k if isinstance(seqlen_k, gl.tensor) else gl.constexpr(seqlen_k)


@aggregate
class Descriptors:
    """The TMA descriptors of Q, K, V and O (FP8's V: ``[B, H_kv, d, N']``)."""

    q: tma.tensor_descriptor
    k: tma.tensor_descriptor
    v: tma.tensor_descriptor
    o: tma.tensor_descriptor

    @gluon.constexpr_function
    def __init__(self, q, k, v, o):
        self.q = q
        self.k = k
        self.v = v
        self.o = o


@aggregate
class Buffers:
    """Shared memory: the Q tiles (one per consumer, or the CTA's rows), the K/V ring of NUM_STAGES slots, O's
    staging tiles (Q's with 16 bits), the e4m3 ones of the row sums' product (SUMS_ON_MMA); and the mbarriers:
    Q loaded, each ring slot's K and V ready and released, and the ping-pong turns."""

    q: gl.shared_memory_descriptor
    k: gl.shared_memory_descriptor
    v: gl.shared_memory_descriptor
    o: gl.shared_memory_descriptor
    ones: gl.shared_memory_descriptor
    q_bars: gl.shared_memory_descriptor
    k_ready: gl.shared_memory_descriptor
    v_ready: gl.shared_memory_descriptor
    k_empty: gl.shared_memory_descriptor
    v_empty: gl.shared_memory_descriptor
    turn: gl.shared_memory_descriptor

    @gluon.constexpr_function
    def __init__(self, q, k, v, o, ones, q_bars, k_ready, v_ready, k_empty, v_empty, turn):
        self.q = q
        self.k = k
        self.v = v
        self.o = o
        self.ones = ones
        self.q_bars = q_bars
        self.k_ready = k_ready
        self.v_ready = v_ready
        self.k_empty = k_empty
        self.v_empty = v_empty
        self.turn = turn


@aggregate
class Bases:
    """Q's, K's and V's first element at the CTA's heads and the stride along each: of the inputs' rows (for
    the per-thread ``cp.async`` copies), or of the FP8 descales' blocks (0 unless per block; with 16 bits the
    descales are not read)."""

    q: gl.tensor
    k: gl.tensor
    v: gl.tensor
    stride_q: _INT
    stride_k: _INT
    stride_v: _INT

    @gluon.constexpr_function
    def __init__(self, q, k, v, stride_q, stride_k, stride_v):
        self.q = q
        self.k = k
        self.v = v
        self.stride_q = stride_q if isinstance(stride_q, gl.tensor) else gl.constexpr(stride_q)
        self.stride_k = stride_k if isinstance(stride_k, gl.tensor) else gl.constexpr(stride_k)
        self.stride_v = stride_v if isinstance(stride_v, gl.tensor) else gl.constexpr(stride_v)


@aggregate
class Rows:
    """Consumer C's rows: their indices, Q tile, and factor from raw scores to the log2 domain (sm_scale ·
    log2 e, times the Q descale with FP8); the K/V tiles the CTA streams and the causal offset
    (row i sees key j <= i + causal_off)."""

    C: gl.constexpr
    q_tile: gl.shared_memory_descriptor
    rows: gl.tensor
    scale: gl.tensor
    n_tiles: _INT
    causal_off: _INT

    @gluon.constexpr_function
    def __init__(self, C, q_tile, rows, scale, n_tiles, causal_off):
        self.C = gl.constexpr(C)
        self.q_tile = q_tile
        self.rows = rows
        self.scale = scale
        self.n_tiles = n_tiles if isinstance(n_tiles, gl.tensor) else gl.constexpr(n_tiles)
        self.causal_off = causal_off if isinstance(causal_off, gl.tensor) else gl.constexpr(causal_off)


# ---------------------------------------------------------------------------------------------------
# Partitions
# ---------------------------------------------------------------------------------------------------


@gluon.jit
def _producer(var, descs, src, bufs, prog):
    """Loads only: the consumers' Q tiles once, then K_j and V_j into ring slot j % NUM_STAGES as soon as the
    consumers have released it (K first: the next S = Q Kᵀ needs it before the P V product needs V). It runs
    in the CTA's 4 warps: one thread issues the TMA copies, or the warpgroup the per-thread ones."""
    STAGES: gl.constexpr = bufs.k.shape[0]
    BLOCK_N: gl.constexpr = bufs.k.shape[1]
    HEAD_DIM: gl.constexpr = bufs.k.shape[2]
    BLOCK_M: gl.constexpr = bufs.q.shape[1]
    V_T: gl.constexpr = var.IS_FP8  # FP8's V comes transposed, [d, N']
    bits: gl.constexpr = bufs.k.dtype.primitive_bitwidth
    layout: gl.constexpr = _copy_layout(gl.num_warps(), HEAD_DIM, bits)
    v_layout: gl.constexpr = _copy_layout(gl.num_warps(), BLOCK_N if V_T else HEAD_DIM, bits)
    b, h, h_kv, start_m = prog.b, prog.h, prog.h_kv, prog.start_m
    n_tiles, n_full = _tile_range(
        start_m, prog.seqlen_q, prog.seqlen_k, BLOCK_M * var.NUM_CONSUMERS, BLOCK_N, var.IS_CAUSAL
    )

    for c in gl.static_range(var.NUM_CONSUMERS):
        dst = bufs.q.index(c)
        if var.USE_TMA:
            _tma_tile(descs.q, b, h, start_m + c * BLOCK_M, bufs.q_bars.index(c), dst)
        else:
            _cp_async_tile(dst, src.q, start_m + c * BLOCK_M, 0, prog.seqlen_q, HEAD_DIM, src.stride_q, 32, layout)
            async_copy.mbarrier_arrive(bufs.q_bars.index(c), increment_count=False)
    for j in range(n_tiles):
        slot = j % STAGES
        phase = (j // STAGES) & 1
        # a fresh mbarrier counts as having completed the phase before its first: the first lap passes
        mbarrier.wait(bufs.k_empty.index(slot), phase ^ 1)
        if var.USE_TMA:
            _tma_tile(descs.k, b, h_kv, j * BLOCK_N, bufs.k_ready.index(slot), bufs.k.index(slot))
        else:
            _cp_async_tile(bufs.k.index(slot), src.k, j * BLOCK_N, 0, prog.seqlen_k, HEAD_DIM, src.stride_k, 32, layout)
            async_copy.mbarrier_arrive(bufs.k_ready.index(slot), increment_count=False)
        mbarrier.wait(bufs.v_empty.index(slot), phase ^ 1)
        if var.USE_TMA:
            _tma_v(descs.v, b, h_kv, j, bufs.v_ready.index(slot), bufs.v.index(slot), V_T)
        elif V_T:  # FP8's V: the keys rounded up to its layout's groups of 32, whose padding is zeros
            _cp_async_tile(
                bufs.v.index(slot), src.v, 0, j * BLOCK_N, HEAD_DIM, prog.seqlen_k, src.stride_v, 32, v_layout, 32
            )
            async_copy.mbarrier_arrive(bufs.v_ready.index(slot), increment_count=False)
        else:
            _cp_async_tile(
                bufs.v.index(slot), src.v, j * BLOCK_N, 0, prog.seqlen_k, HEAD_DIM, src.stride_v, 32, v_layout
            )
            async_copy.mbarrier_arrive(bufs.v_ready.index(slot), increment_count=False)


@gluon.jit
def _consumer_tile(j, state, var, descs, bufs, scales, prog, mine, MASKED: gl.constexpr):
    """Tile j of a consumer: issue S_j = Q K_jᵀ, rescale O by tile j-1's factor while it runs, issue
    O += P_{j-1} V_{j-1}, then the softmax of S_j.

    wgmma groups complete in issue order, so waiting for all but one group waits for S_j alone (OVERLAP):
    the exponentials of tile j run while the tensor cores finish P_{j-1} V_{j-1}. With 16 bits P_j is
    converted to the operand type into registers of its own before that product is waited for; FP8 carries
    P_j in fp32 to the next tile and converts it as that tile issues P_j V_j (``_pv_a``)."""
    m_i, l_i, acc, p, alpha, vs_prev, turn_phase, k_scale, v_scale = state
    STAGES: gl.constexpr = bufs.k.shape[0]
    BLOCK_N: gl.constexpr = bufs.k.shape[1]
    bits: gl.constexpr = bufs.k.dtype.primitive_bitwidth
    V_T: gl.constexpr = var.IS_FP8
    C: gl.constexpr = mine.C
    s_layout: gl.constexpr = _mma_layout(gl.num_warps(), BLOCK_N, bits)
    o_row_layout: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc.type.layout, k_width=32 // bits)
    slot = j % STAGES
    prev = (j - 1) % STAGES
    mbarrier.wait(bufs.k_ready.index(slot), (j // STAGES) & 1)
    if var.PINGPONG:
        mbarrier.wait(bufs.turn.index(C), turn_phase)
        turn_phase = turn_phase ^ 1
    s_tok = _issue_scores(mine.q_tile, bufs.k.index(slot), s_layout)
    # O is kept in units of the last V tile's scale (so P V still accumulates in place): the factor carries
    # the change of scale too
    acc = acc * gl.expand_dims(gl.convert_layout(alpha * (vs_prev / v_scale), o_row_layout), 1)
    mbarrier.wait(bufs.v_ready.index(prev), ((j - 1) // STAGES) & 1)
    a_op = _pv_a(p, p_layout, var.IS_FP8)
    acc = warpgroup_mma(a_op, _v_operand(bufs.v.index(prev), V_T), acc, is_async=True)
    if var.SUMS_ON_MMA:  # the row sums of the P that P V multiplies, on the tensor cores: ℓ ← ℓ · α + P · 1
        l_i, l_tile = _issue_row_sums(a_op, bufs.ones, l_i, alpha)
    if var.PINGPONG:
        mbarrier.arrive(bufs.turn.index(1 - C))
    # the next tile's descales, a tile ahead: their loads' latency hides behind this tile's softmax
    k_next = _tile_scale(scales.k, j + 1, mine.n_tiles, scales.stride_k, BLOCK_N, var.KV_BLOCK, var.IS_FP8)
    v_next = _tile_scale(scales.v, j, mine.n_tiles, scales.stride_v, BLOCK_N, var.KV_BLOCK, var.IS_FP8)
    if var.OVERLAP:  # (P V's group still outstanding, and the row sums')
        s = warpgroup_mma_wait(num_outstanding=2 if var.SUMS_ON_MMA else 1, deps=(s_tok,))
    elif var.SUMS_ON_MMA:
        s, acc, l_tile = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok, acc, l_tile))
        l_i = l_i + l_tile
    elif var.IS_FP8:  # (the wait's lowering keeps 16- and 32-bit values alive, not e4m3 ones: ptxas guards P's)
        s, acc = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok, acc))
    else:
        s, acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok, acc, p))
    if var.WARP_SPECIALIZE:
        mbarrier.arrive(bufs.k_empty.index(slot))
    if MASKED:
        s = _masked(s, mine.rows, j * BLOCK_N, prog.seqlen_k, mine.causal_off, var.IS_CAUSAL, s_layout)
    p_new, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, mine.scale * k_scale, var.P_SHIFT, not var.SUMS_ON_MMA)
    p_next = _p_operand(p_new, p)
    if var.OVERLAP and var.SUMS_ON_MMA:
        acc, l_tile = warpgroup_mma_wait(num_outstanding=0, deps=(acc, l_tile))
        l_i = l_i + l_tile
    elif var.OVERLAP and var.IS_FP8:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    elif var.OVERLAP:
        acc, p, p_next = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p, p_next))
    if var.WARP_SPECIALIZE:
        mbarrier.arrive(bufs.v_empty.index(prev))
    else:  # slot `prev` is free again: refill it with the tile NUM_STAGES ahead
        ahead = j - 1 + STAGES
        pred = ahead < mine.n_tiles
        _tma_tile(descs.k, prog.b, prog.h_kv, ahead * BLOCK_N, bufs.k_ready.index(prev), bufs.k.index(prev), pred=pred)
        _tma_v(descs.v, prog.b, prog.h_kv, ahead, bufs.v_ready.index(prev), bufs.v.index(prev), V_T, pred=pred)
    return m_i, l_i, acc, p_next, alpha, v_scale, turn_phase, k_next, v_next


@gluon.jit
def _consumer(var, descs, bufs, scales, lse_ptr, prog, qk_scale, C: gl.constexpr):
    """Q Kᵀ, the online softmax and P V for this consumer's rows; then O and the logsumexp out.

    With WARP_SPECIALIZE: consumer C of NUM_CONSUMERS, the producer fills the ring. Without: the only
    partition, every row of the CTA, issuing its own TMA loads NUM_STAGES tiles ahead."""
    STAGES: gl.constexpr = bufs.k.shape[0]
    BLOCK_N: gl.constexpr = bufs.k.shape[1]
    HEAD_DIM: gl.constexpr = bufs.k.shape[2]
    V_T: gl.constexpr = var.IS_FP8
    dtype: gl.constexpr = bufs.k.dtype
    ROWS: gl.constexpr = bufs.q.shape[1]  # this partition's rows: one TMA transfer of Q and of O
    CTA_M: gl.constexpr = ROWS * var.NUM_CONSUMERS if var.WARP_SPECIALIZE else ROWS
    b, h, h_kv, start_m = prog.b, prog.h, prog.h_kv, prog.start_m
    row0 = start_m + C * ROWS
    q_tile = bufs.q.index(C)
    o_tile = bufs.o.index(C)
    num_warps: gl.constexpr = gl.num_warps()
    bits: gl.constexpr = dtype.primitive_bitwidth
    s_layout: gl.constexpr = _mma_layout(num_warps, BLOCK_N, bits)
    o_layout: gl.constexpr = _mma_layout(num_warps, HEAD_DIM, bits)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=32 // bits)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)

    n_tiles, n_full = _tile_range(start_m, prog.seqlen_q, prog.seqlen_k, CTA_M, BLOCK_N, var.IS_CAUSAL)
    causal_off = prog.seqlen_k - prog.seqlen_q
    rows = row0 + gl.arange(0, ROWS, row_layout)
    # each row's factor from raw scores to the log2 domain (FP8: times its Q block's descale)
    row_scale = gl.full([ROWS], qk_scale, gl.float32, row_layout)
    if var.IS_FP8:
        q_descale = gl.load(scales.q + (rows // var.Q_BLOCK) * scales.stride_q, mask=rows < prog.seqlen_q, other=1.0)
        row_scale = row_scale * q_descale
    mine = Rows(C, q_tile, rows, row_scale, n_tiles, causal_off)
    if not var.WARP_SPECIALIZE:
        _tma_tile(descs.q, b, h, row0, bufs.q_bars.index(C), q_tile)
        for t in gl.static_range(STAGES):
            _tma_tile(descs.k, b, h_kv, t * BLOCK_N, bufs.k_ready.index(t), bufs.k.index(t), pred=t < n_tiles)
            _tma_v(descs.v, b, h_kv, t, bufs.v_ready.index(t), bufs.v.index(t), V_T, pred=t < n_tiles)
    mbarrier.wait(bufs.q_bars.index(C), 0)

    m_i = gl.full([ROWS], float("-inf"), gl.float32, row_layout)
    if var.SUMS_ON_MMA:  # every column of a row holds its sum
        l_i = gl.zeros([ROWS, 8], gl.float32, _mma_layout(num_warps, 8, bits))
    else:
        l_i = gl.zeros([ROWS], gl.float32, row_layout)
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)
    if var.IS_FP8:
        p = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    else:
        p = gl.zeros([ROWS, BLOCK_N], dtype, p_layout)
    alpha = gl.zeros([ROWS], gl.float32, row_layout)  # the factor O still owes the last softmax step
    vs_prev = gl.to_tensor(1.0)  # the V scale O is in units of (FP8; O is still 0 before the first tile)
    turn_phase = gl.to_tensor(1 - C)  # consumer 0 takes the first turn: a fresh mbarrier lets phase 1 through

    # Tile 0: its scores and softmax, no P V product yet.
    if n_tiles > 0:
        k_scale = _tile_scale(scales.k, 0, n_tiles, scales.stride_k, BLOCK_N, var.KV_BLOCK, var.IS_FP8)
        mbarrier.wait(bufs.k_ready.index(0), 0)
        if var.PINGPONG:
            mbarrier.wait(bufs.turn.index(C), turn_phase)
            turn_phase = turn_phase ^ 1
        s_tok = _issue_scores(q_tile, bufs.k.index(0), s_layout)
        if var.PINGPONG:
            mbarrier.arrive(bufs.turn.index(1 - C))
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
        if var.WARP_SPECIALIZE:
            mbarrier.arrive(bufs.k_empty.index(0))
        if n_full == 0:
            s = _masked(s, rows, 0, prog.seqlen_k, causal_off, var.IS_CAUSAL, s_layout)
        p_new, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, row_scale * k_scale, var.P_SHIFT, not var.SUMS_ON_MMA)
        p = _p_operand(p_new, p)

    # Tiles 1 … n_full-1 need no mask, the rest (the causal diagonal, the sequence's end) do.
    k_next = _tile_scale(scales.k, 1, n_tiles, scales.stride_k, BLOCK_N, var.KV_BLOCK, var.IS_FP8)
    v_next = _tile_scale(scales.v, 0, n_tiles, scales.stride_v, BLOCK_N, var.KV_BLOCK, var.IS_FP8)
    state = (m_i, l_i, acc, p, alpha, vs_prev, turn_phase, k_next, v_next)
    for j in range(1, n_full):
        state = _consumer_tile(j, state, var, descs, bufs, scales, prog, mine, False)
    for j in range(gl.maximum(n_full, 1), n_tiles):
        state = _consumer_tile(j, state, var, descs, bufs, scales, prog, mine, True)
    m_i, l_i, acc, p, alpha, vs_prev, turn_phase, _, v_scale = state  # v_scale: the last tile's

    # The last P V product.
    if n_tiles > 0:
        last = (n_tiles - 1) % STAGES
        mbarrier.wait(bufs.v_ready.index(last), ((n_tiles - 1) // STAGES) & 1)
        if var.PINGPONG:
            mbarrier.wait(bufs.turn.index(C), turn_phase)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha * (vs_prev / v_scale), o_row_layout), 1)
        a_op = _pv_a(p, p_layout, var.IS_FP8)
        acc = warpgroup_mma(a_op, _v_operand(bufs.v.index(last), V_T), acc, is_async=True)
        if var.SUMS_ON_MMA:
            l_i, l_tile = _issue_row_sums(a_op, bufs.ones, l_i, alpha)
        if var.PINGPONG:
            mbarrier.arrive(bufs.turn.index(1 - C))
        if var.SUMS_ON_MMA:
            acc, l_tile = warpgroup_mma_wait(num_outstanding=0, deps=(acc, l_tile))
            l_i = l_i + l_tile
        elif var.IS_FP8:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        else:
            acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p))
        if var.WARP_SPECIALIZE:
            mbarrier.arrive(bufs.v_empty.index(last))
        vs_prev = v_scale

    if var.SUMS_ON_MMA:
        l_i = gl.convert_layout(gl.max(l_i, axis=1), row_layout)
    # O = acc / ℓ (FP8: times the V scale O is in units of; P's scale is in ℓ too) through shared memory
    # (16-bit: Q's, no longer read) and TMA; the logsumexp per row (P's scale taken out).
    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    if var.IS_FP8:
        denom = l_safe / vs_prev
    else:
        denom = l_safe
    out = acc / gl.expand_dims(gl.convert_layout(denom, o_row_layout), 1)
    lse = gl.where(l_i == 0.0, float("-inf"), (m_i + gl.log2(l_safe) - var.P_SHIFT) * _LN2)
    o_tile.store(out.to(descs.o.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(descs.o, [b, h, row0, 0], o_tile.reshape(descs.o.block_type.shape))
    gl.store(lse_ptr + prog.bh.to(gl.int64) * prog.seqlen_q + rows, lse, mask=rows < prog.seqlen_q)
    tma.store_wait(0)


# ---------------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------------


@gluon.jit
def _fa3_fwd_kernel(
    q_desc,
    k_desc,
    v_desc,
    o_desc,  # [B, H, Nq, d], [B, H_kv, Nk, d] (FP8's V: [B, H_kv, d, Nk]), [B, H, Nq, d]
    q_ptr,
    k_ptr,
    v_ptr,  # the same tensors' bases, for the per-thread (cp.async) producer
    lse_ptr,  # [B, H, Nq] fp32, contiguous
    qs_ptr,
    ks_ptr,
    vs_ptr,  # FP8 descale factors, fp32; strides (b, h, block), 0 where coarser (16-bit: unused)
    stride_qb,
    stride_qh,
    stride_qn,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_qsb,
    stride_qsh,
    stride_qsblk,
    stride_ksb,
    stride_ksh,
    stride_ksblk,
    stride_vsb,
    stride_vsh,
    stride_vsblk,
    seqlen_q,
    seqlen_k,
    heads,
    kv_group,
    qk_scale,
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
    IS_FP8: gl.constexpr = False,  # e4m3 Q, K and V (transposed) with descales, P scaled before its e4m3 cast
    P_SHIFT: gl.constexpr = 0.0,  # FP8: P is computed times 2^P_SHIFT (its scale before the e4m3 cast)
    Q_BLOCK: gl.constexpr = 64,  # query rows per Q descale factor (per-block scales; a multiple of BLOCK_M)
    KV_BLOCK: gl.constexpr = 128,  # keys per K/V descale factor (per-block scales; a multiple of BLOCK_N)
    SUMS_ON_MMA: gl.constexpr = False,  # FP8: the row sums on the tensor cores, P · 1 (``fa3.fp8_row_sums``)
):
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
    v_shape: gl.constexpr = [HEAD_DIM, BLOCK_N] if IS_FP8 else [BLOCK_N, HEAD_DIM]
    v_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for(v_shape, dtype)
    q_smem = gl.allocate_shared_memory(dtype, [CTA_M // ROWS, ROWS, HEAD_DIM], q_layout)
    k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + v_shape, v_layout)
    if IS_FP8:  # O is 16-bit: a staging buffer of its own (Q's is e4m3)
        o_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, HEAD_DIM], o_desc.dtype)
        o_smem = gl.allocate_shared_memory(o_desc.dtype, [CTA_M // ROWS, ROWS, HEAD_DIM], o_layout)
    else:
        o_smem = q_smem
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

    if SUMS_ON_MMA:  # the B operand of the row sums' product P · 1 (K-major, as V's)
        ones_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([8, BLOCK_N], dtype)
        ones_smem = gl.allocate_shared_memory(dtype, [8, BLOCK_N], ones_layout)
        fill: gl.constexpr = gl.BlockedLayout([1, 16], [1, 32], [gl.num_warps(), 1], [1, 0])
        # (written as bits: converted from an fp32 1.0, half of each word's bytes came out garbage)
        ones_smem.store(gl.full([8, BLOCK_N], _E4M3_ONE, gl.uint8, fill).to(dtype, bitcast=True))
        fence_async_shared()
        gl.thread_barrier()
    else:
        ones_smem = o_smem
    var = Variant(
        NUM_CONSUMERS,
        WARP_SPECIALIZE,
        PINGPONG,
        OVERLAP,
        USE_TMA,
        IS_CAUSAL,
        IS_FP8,
        P_SHIFT,
        Q_BLOCK,
        KV_BLOCK,
        SUMS_ON_MMA,
    )
    prog = Program(b, h, h_kv, bh, start_m, seqlen_q, seqlen_k)
    descs = Descriptors(q_desc, k_desc, v_desc, o_desc)
    bufs = Buffers(q_smem, k_smem, v_smem, o_smem, ones_smem, q_bars, k_ready, v_ready, k_empty, v_empty, turn)
    scales = Bases(
        qs_ptr + b.to(gl.int64) * stride_qsb + h.to(gl.int64) * stride_qsh,
        ks_ptr + b.to(gl.int64) * stride_ksb + h_kv.to(gl.int64) * stride_ksh,
        vs_ptr + b.to(gl.int64) * stride_vsb + h_kv.to(gl.int64) * stride_vsh,
        stride_qsblk,
        stride_ksblk,
        stride_vsblk,
    )
    if WARP_SPECIALIZE:
        src = Bases(
            q_ptr + b.to(gl.int64) * stride_qb + h.to(gl.int64) * stride_qh,
            k_ptr + b.to(gl.int64) * stride_kb + h_kv.to(gl.int64) * stride_kh,
            v_ptr + b.to(gl.int64) * stride_vb + h_kv.to(gl.int64) * stride_vh,
            stride_qn,
            stride_kn,
            stride_vn,
        )
        gl.static_assert(NUM_CONSUMERS == 1 or NUM_CONSUMERS == 2, "one or two consumer warpgroups")
        # the producer runs in the CTA's own 4 warps, each consumer in a warpgroup of its own
        if NUM_CONSUMERS == 2:
            gl.warp_specialize(
                [
                    (_producer, (var, descs, src, bufs, prog)),
                    (_consumer, (var, descs, bufs, scales, lse_ptr, prog, qk_scale, 0)),
                    (_consumer, (var, descs, bufs, scales, lse_ptr, prog, qk_scale, 1)),
                ],
                [4, 4],
                [CONSUMER_REGS, CONSUMER_REGS],
            )
        else:
            gl.warp_specialize(
                [
                    (_producer, (var, descs, src, bufs, prog)),
                    (_consumer, (var, descs, bufs, scales, lse_ptr, prog, qk_scale, 0)),
                ],
                [4],
                [CONSUMER_REGS],
            )
    else:
        _consumer(var, descs, bufs, scales, lse_ptr, prog, qk_scale, 0)


# The same kernel with the sequence lengths always runtime values, for calls where one of them is 1: Triton
# would fold a 1 into the code as a constant, and with the key mask constant the e4m3 packing of P miscompiles.
# P's masked columns are then the same value, ptxas packs them with ``F2FP.…PACK_AB_MERGE_C`` taking the
# other half of the register from one nothing wrote (``R5`` in the SASS, where the general code has ``RZ``),
# and P's operand held whatever that register did: FP8 outputs that changed from run to run on an H200, NaN
# at times (Triton 3.6's ptxas; Nq = Nk = 1; seen with FP8's default schedule at d = 64, FA-3's full one at
# d = 128 and the per-thread copies at d = 64 and 128). Runtime lengths give the general code; the length
# that is not 1 only loses its 16-divisibility hint. ``fa3.kernel_for_lengths`` picks this one.
_fa3_fwd_kernel_any_length = gluon.jit(do_not_specialize=["seqlen_q", "seqlen_k"])(_fa3_fwd_kernel.fn)
