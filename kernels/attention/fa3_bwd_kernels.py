"""The Gluon kernel of FlashAttention-3's backward for Hopper (sm_90) (``kernels.attention.fa3_bwd``).

A CTA owns BLOCK_N keys of one (batch, K/V head): K_j and V_j stay in shared memory while the query tiles of
every query head of its group stream through a ring of NUM_STAGES slots (Q, dO, the log2-domain logsumexp
and Δ = rowsum(dO ∘ O) of BLOCK_M rows, each slot guarded by a "ready" and an "empty" mbarrier). A producer
partition loads (TMA, or per-thread ``cp.async``); consumer warpgroups of 64 keys each compute, with the keys
on the rows of every product, Sᵀ = K Qᵀ and dPᵀ = V dOᵀ, Pᵀ and dSᵀ, and accumulate dV += Pᵀ dO and
dK += dSᵀ Q in registers. dSᵀ goes through shared memory (both consumers' halves) for dQ = dS K, which each
consumer computes for its half of the tile (half the head dim, or half the rows where BLOCK_M = 128) and adds
in fp32 to a global accumulator with atomics (or, DQ_WRITER, stages for the producer partition to add), in
key-block order behind a semaphore when DETERMINISTIC. The preprocess (Δ, the logsumexp in log2, the
accumulator zeroed) and the conversion of dQ at the end are Triton kernels in ``fa3_bwd.py``; the tiles'
pieces (loads, mask, dQ's adds) are in ``fa3_bwd_tiles.py``. ``fa3_bwd.BwdSchedule`` says what each switch
changes. At d = 256 (BLOCK_N = 64, SPLIT_D) the two consumers share the block's keys and split the head dim
instead (``_consumer_tile_split_d``).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.language.core import _aggregate as aggregate

from kernels.attention.fa3_bwd_tiles import (
    _add_dq,
    _dq_operands,
    _drain_dq,
    _load_kv,
    _load_rows,
    _masked,
    _mma_layout,
    _store_rows,
    _tile_of,
)

_KEYS_PER_CONSUMER = gl.constexpr(64)  # one warpgroup's wgmma tile is 64 rows high: 64 keys
_INT = (gl.tensor, gl.constexpr)  # a runtime int that Triton may have made a constexpr (a value of 1)


# ---------------------------------------------------------------------------------------------------
# What the partitions share
# ---------------------------------------------------------------------------------------------------


@aggregate
class BwdVariant:
    """Compile-time choices (``fa3_bwd.kernel_specialisation`` sets them): consumer warpgroups, warp
    specialisation, TMA, the ordered dQ adds, who adds dQ (DQ_WRITER: the producer partition, from a staging
    buffer; else the consumers), the causal mask, and how dQ's tile is split between the consumers (SPLIT_M:
    by rows, where BLOCK_M = 128; else by head-dim columns). SPLIT_D (d = 256, BLOCK_N = 64): the consumers
    share the block's 64 keys and split the head dim of dK, dV and dQ (``_consumer_tile_split_d``)."""

    NUM_CONSUMERS: gl.constexpr
    WARP_SPECIALIZE: gl.constexpr
    USE_TMA: gl.constexpr
    DETERMINISTIC: gl.constexpr
    DQ_WRITER: gl.constexpr
    IS_CAUSAL: gl.constexpr
    SPLIT_M: gl.constexpr
    SPLIT_D: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, NUM_CONSUMERS, WARP_SPECIALIZE, USE_TMA, DETERMINISTIC, DQ_WRITER, IS_CAUSAL, SPLIT_M, SPLIT_D):
        self.NUM_CONSUMERS = gl.constexpr(NUM_CONSUMERS)
        self.WARP_SPECIALIZE = gl.constexpr(WARP_SPECIALIZE)
        self.USE_TMA = gl.constexpr(USE_TMA)
        self.DETERMINISTIC = gl.constexpr(DETERMINISTIC)
        self.DQ_WRITER = gl.constexpr(DQ_WRITER)
        self.IS_CAUSAL = gl.constexpr(IS_CAUSAL)
        self.SPLIT_M = gl.constexpr(SPLIT_M)
        self.SPLIT_D = gl.constexpr(SPLIT_D)


@aggregate
class BwdProgram:
    """The CTA's keys: key block ``j`` (its first key ``start_n``) of batch ``b``, K/V head ``h_kv``; the
    lengths; the query heads of the group (``group`` of ``heads``); the query tiles it walks per head,
    ``i_lo`` … ``n_m`` - 1, of which ``i_lo`` … ``i_mid`` - 1 need a mask (the causal diagonal, or every
    tile where the block runs past the last key); ``q_rows``: the padded rows of the dQ accumulator."""

    b: gl.tensor
    h_kv: gl.tensor
    j: gl.tensor
    start_n: gl.tensor
    seqlen_q: _INT
    seqlen_k: _INT
    heads: _INT
    group: _INT
    n_m: _INT
    i_lo: _INT
    i_mid: _INT
    q_rows: _INT

    @gluon.constexpr_function
    def __init__(self, b, h_kv, j, start_n, seqlen_q, seqlen_k, heads, group, n_m, i_lo, i_mid, q_rows):
        self.b = b
        self.h_kv = h_kv
        self.j = j
        self.start_n = start_n
        self.seqlen_q = seqlen_q if isinstance(seqlen_q, gl.tensor) else gl.constexpr(seqlen_q)
        self.seqlen_k = seqlen_k if isinstance(seqlen_k, gl.tensor) else gl.constexpr(seqlen_k)
        self.heads = heads if isinstance(heads, gl.tensor) else gl.constexpr(heads)
        self.group = group if isinstance(group, gl.tensor) else gl.constexpr(group)
        self.n_m = n_m if isinstance(n_m, gl.tensor) else gl.constexpr(n_m)
        self.i_lo = i_lo if isinstance(i_lo, gl.tensor) else gl.constexpr(i_lo)
        self.i_mid = i_mid if isinstance(i_mid, gl.tensor) else gl.constexpr(i_mid)
        self.q_rows = q_rows if isinstance(q_rows, gl.tensor) else gl.constexpr(q_rows)


@aggregate
class BwdDescriptors:
    """TMA descriptors: Q and dO ``[B, H, Nq, d]``, K and V ``[B, H_kv, Nk, d]``, the log2 logsumexp and Δ
    ``[B·H, q_rows]``."""

    q: tma.tensor_descriptor
    k: tma.tensor_descriptor
    v: tma.tensor_descriptor
    do: tma.tensor_descriptor
    lse: tma.tensor_descriptor
    delta: tma.tensor_descriptor

    @gluon.constexpr_function
    def __init__(self, q, k, v, do, lse, delta):
        self.q = q
        self.k = k
        self.v = v
        self.do = do
        self.lse = lse
        self.delta = delta


@aggregate
class BwdSources:
    """The same tensors for per-thread copies (no TMA): Q's and dO's first element at the CTA's batch and
    their head and row strides, K's and V's at its K/V head and their row strides, the rows' bases."""

    q: gl.tensor
    do: gl.tensor
    k: gl.tensor
    v: gl.tensor
    lse: gl.tensor
    delta: gl.tensor
    q_h: _INT
    q_n: _INT
    do_h: _INT
    do_n: _INT
    k_n: _INT
    v_n: _INT

    @gluon.constexpr_function
    def __init__(self, q, do, k, v, lse, delta, q_h, q_n, do_h, do_n, k_n, v_n):
        self.q = q
        self.do = do
        self.k = k
        self.v = v
        self.lse = lse
        self.delta = delta
        self.q_h = q_h if isinstance(q_h, gl.tensor) else gl.constexpr(q_h)
        self.q_n = q_n if isinstance(q_n, gl.tensor) else gl.constexpr(q_n)
        self.do_h = do_h if isinstance(do_h, gl.tensor) else gl.constexpr(do_h)
        self.do_n = do_n if isinstance(do_n, gl.tensor) else gl.constexpr(do_n)
        self.k_n = k_n if isinstance(k_n, gl.tensor) else gl.constexpr(k_n)
        self.v_n = v_n if isinstance(v_n, gl.tensor) else gl.constexpr(v_n)


@aggregate
class BwdBuffers:
    """Shared memory: K_j and V_j, the ring (Q, dO, logsumexp and Δ rows per slot), Pᵀ and dSᵀ of the block
    (dSᵀ two buffers, tiles alternating), each consumer's part of dQ staged for the writer (DQ_WRITER);
    mbarriers: K/V loaded, each slot ready and released, each dSᵀ buffer written by every consumer, each
    staged dQ full and drained."""

    k: gl.shared_memory_descriptor
    v: gl.shared_memory_descriptor
    q: gl.shared_memory_descriptor
    do: gl.shared_memory_descriptor
    lse: gl.shared_memory_descriptor
    delta: gl.shared_memory_descriptor
    p: gl.shared_memory_descriptor
    ds: gl.shared_memory_descriptor
    dq: gl.shared_memory_descriptor
    kv_bar: gl.shared_memory_descriptor
    ready: gl.shared_memory_descriptor
    empty: gl.shared_memory_descriptor
    ds_bar: gl.shared_memory_descriptor
    dq_full: gl.shared_memory_descriptor
    dq_empty: gl.shared_memory_descriptor

    @gluon.constexpr_function
    def __init__(self, k, v, q, do, lse, delta, p, ds, dq, kv_bar, ready, empty, ds_bar, dq_full, dq_empty):
        self.k = k
        self.v = v
        self.q = q
        self.do = do
        self.lse = lse
        self.delta = delta
        self.p = p
        self.ds = ds
        self.dq = dq
        self.kv_bar = kv_bar
        self.ready = ready
        self.empty = empty
        self.ds_bar = ds_bar
        self.dq_full = dq_full
        self.dq_empty = dq_empty


@aggregate
class BwdOutputs:
    """Where results go: the fp32 dQ accumulator ``[B·H, q_rows, d]`` (contiguous), the dQ semaphores
    ``[B·H, n_m, consumers]`` int32 (DETERMINISTIC), dK and dV ``[B, H_kv, Nk, d]`` and their (batch, head,
    row) strides; the score factor (sm_scale · log2 e) and sm_scale. (The kernel's own arguments: the CTA's
    offsets are taken after the loops, so that nothing of the epilogue stays in registers through them.)"""

    dq: gl.tensor
    sem: gl.tensor
    dk: gl.tensor
    dv: gl.tensor
    dk_b: _INT
    dk_h: _INT
    dk_n: _INT
    dv_b: _INT
    dv_h: _INT
    dv_n: _INT
    qk_scale: gl.tensor
    sm_scale: gl.tensor

    @gluon.constexpr_function
    def __init__(self, dq, sem, dk, dv, dk_b, dk_h, dk_n, dv_b, dv_h, dv_n, qk_scale, sm_scale):
        self.dq = dq
        self.sem = sem
        self.dk = dk
        self.dv = dv
        self.dk_b = dk_b if isinstance(dk_b, gl.tensor) else gl.constexpr(dk_b)
        self.dk_h = dk_h if isinstance(dk_h, gl.tensor) else gl.constexpr(dk_h)
        self.dk_n = dk_n if isinstance(dk_n, gl.tensor) else gl.constexpr(dk_n)
        self.dv_b = dv_b if isinstance(dv_b, gl.tensor) else gl.constexpr(dv_b)
        self.dv_h = dv_h if isinstance(dv_h, gl.tensor) else gl.constexpr(dv_h)
        self.dv_n = dv_n if isinstance(dv_n, gl.tensor) else gl.constexpr(dv_n)
        self.qk_scale = qk_scale
        self.sm_scale = sm_scale


# ---------------------------------------------------------------------------------------------------
# The producer
# ---------------------------------------------------------------------------------------------------


@gluon.jit
def _producer(var, descs, src, bufs, prog, out):
    """K_j and V_j once, then every tile's rows into the ring as soon as the consumers have released its slot,
    in the consumers' order (``_tile_of``); one thread issues the TMA copies, or the partition's threads the
    per-thread ones. DQ_WRITER: also the dQ writer, a ring behind its loads (tile t's dQ is staged before its
    slot is released), then the last tiles'."""
    STAGES: gl.constexpr = bufs.q.shape[0]
    _load_kv(var, descs, src, bufs, prog)
    count = prog.n_m - prog.i_lo
    for g in range(prog.group):
        bh = prog.b * prog.heads + prog.h_kv * prog.group + g
        for i in range(prog.i_lo, prog.n_m):
            it = g * count + i - prog.i_lo
            # a fresh mbarrier counts as having completed the phase before its first: the first lap passes
            mbarrier.wait(bufs.empty.index(it % STAGES), ((it // STAGES) & 1) ^ 1)
            _load_rows(var, descs, src, bufs, prog, it, i, bh)
            if var.DQ_WRITER:  # the tile whose slot this one took is done: its dQ is staged
                if it >= STAGES:
                    _drain_dq(it - STAGES, var, bufs, prog, out)
    if var.DQ_WRITER:
        total = prog.group * count
        for t in range(gl.maximum(total - STAGES, 0), total):
            _drain_dq(t, var, bufs, prog, out)


# ---------------------------------------------------------------------------------------------------
# Consumers
# ---------------------------------------------------------------------------------------------------


@gluon.jit
def _consumer_tile(it, i, bh, dk, dv, var, descs, src, bufs, prog, out, C: gl.constexpr, MASKED: gl.constexpr):
    """One query tile against this consumer's keys (``_consumer_tile_keys``), or at d = 256 against the block's
    keys on this consumer's half of the head dim (``_consumer_tile_split_d``)."""
    if var.SPLIT_D:
        dk, dv = _consumer_tile_split_d(it, i, bh, dk, dv, var, bufs, prog, out, C, MASKED)
    else:
        dk, dv = _consumer_tile_keys(it, i, bh, dk, dv, var, descs, src, bufs, prog, out, C, MASKED)
    return dk, dv


@gluon.jit
def _consumer_tile_keys(it, i, bh, dk, dv, var, descs, src, bufs, prog, out, C: gl.constexpr, MASKED: gl.constexpr):
    """One query tile against this consumer's keys: Sᵀ and dPᵀ issued together; Pᵀ (while dPᵀ runs) and
    dV += Pᵀ dO; dSᵀ = Pᵀ ∘ (dPᵀ − Δ) and dK += dSᵀ Q; dSᵀ to shared memory and, once every consumer's part
    is there, dQ = dS K; the slot released; dQ added to the accumulator."""
    STAGES: gl.constexpr = bufs.q.shape[0]
    BLOCK_M: gl.constexpr = bufs.q.shape[1]
    dtype: gl.constexpr = bufs.q.dtype
    ROWS: gl.constexpr = dk.shape[0]  # this partition's keys
    s_layout: gl.constexpr = _mma_layout(gl.num_warps(), 1, BLOCK_M)
    slot = it % STAGES
    q_t = bufs.q.index(slot)
    do_t = bufs.do.index(slot)
    k_rows = bufs.k.slice(C * ROWS, ROWS)
    v_rows = bufs.v.slice(C * ROWS, ROWS)
    p_rows = bufs.p.index(0).slice(C * ROWS, ROWS)
    ds_buf = bufs.ds.index(it % 2)
    ds_rows = ds_buf.slice(C * ROWS, ROWS)
    mbarrier.wait(bufs.ready.index(slot), (it // STAGES) & 1)
    zero = gl.zeros([ROWS, BLOCK_M], gl.float32, s_layout)
    s_tok = warpgroup_mma(k_rows, q_t.permute((1, 0)), zero, use_acc=False, is_async=True)
    dp_tok = warpgroup_mma(v_rows, do_t.permute((1, 0)), zero, use_acc=False, is_async=True)
    # (the rows' values loaded after each wait: loaded before it, ptxas keeps them in registers across it)
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
    lse = bufs.lse.index(slot).load(s_layout)  # [1, BLOCK_M]: the rows' log2 logsumexp (+inf: P = 0)
    p = gl.exp2(s * out.qk_scale - lse)
    if MASKED:
        p = _masked(p, prog.start_n + C * ROWS, i * BLOCK_M, prog, var.IS_CAUSAL)
    # Pᵀ and dSᵀ reach their products through shared memory: as register operands they would stay live
    # until the products finish, beside dK's and dV's accumulators (the consumers then spilled)
    p_rows.store(p.to(dtype))
    fence_async_shared()
    gl.thread_barrier()
    dv = warpgroup_mma(p_rows, do_t, dv, is_async=True)
    dp = warpgroup_mma_wait(num_outstanding=1, deps=(dp_tok,))
    delta = bufs.delta.index(slot).load(s_layout)
    ds_rows.store((p * (dp - delta)).to(dtype))
    fence_async_shared()
    # dQ needs every consumer's dSᵀ: each says its part is written (the arrive waits for all its threads)
    if var.WARP_SPECIALIZE:
        mbarrier.arrive(bufs.ds_bar.index(it % 2))
    else:
        gl.thread_barrier()
    dk = warpgroup_mma(ds_rows, q_t, dk, is_async=True)
    if var.WARP_SPECIALIZE:
        mbarrier.wait(bufs.ds_bar.index(it % 2), (it // 2) & 1)
    dq_a, dq_b = _dq_operands(var, bufs, ds_buf, C)
    dq_shape: gl.constexpr = [dq_a.shape[0], dq_b.shape[1]]
    if var.WARP_SPECIALIZE:
        dq_layout: gl.constexpr = _mma_layout(gl.num_warps(), 1, dq_b.shape[1])
    elif dq_a.shape[0] == 64:  # the CTA's warpgroups side by side along the head dim
        dq_layout: gl.constexpr = _mma_layout(4, gl.num_warps() // 4, dq_b.shape[1] * 4 // gl.num_warps())
    else:
        dq_layout: gl.constexpr = _mma_layout(gl.num_warps(), 1, dq_b.shape[1])
    dq_tok = warpgroup_mma(dq_a, dq_b, gl.zeros(dq_shape, gl.float32, dq_layout), use_acc=False, is_async=True)
    dv, dk, dq = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, dq_tok))
    if var.DQ_WRITER:  # staged for the writer, once it has drained this consumer's previous part
        mbarrier.wait(bufs.dq_empty.index(C), (it & 1) ^ 1)
        bufs.dq.index(C).store(dq)
        mbarrier.arrive(bufs.dq_full.index(C))
    if var.WARP_SPECIALIZE:
        mbarrier.arrive(bufs.empty.index(slot))
    else:  # the slot is free again: refill it with the tile NUM_STAGES ahead
        ahead = it + STAGES
        i_ahead, bh_ahead = _tile_of(ahead, prog)
        total = prog.group * (prog.n_m - prog.i_lo)
        _load_rows(var, descs, src, bufs, prog, ahead, i_ahead, bh_ahead, pred=ahead < total)
    if not var.DQ_WRITER:
        _add_dq(dq, var, bufs, prog, out, bh, i, 0, 0, C, True, True)
    return dk, dv


@gluon.jit
def _consumer_tile_split_d(it, i, bh, dk, dv, var, bufs, prog, out, C: gl.constexpr, MASKED: gl.constexpr):
    """One query tile at d = 256 (SPLIT_D): dK and dV of all 64 keys would take 256 registers a thread, so
    each consumer keeps half of their columns (and computes half of dQ's), and takes half of the tile's
    queries for Sᵀ and dPᵀ: Pᵀ and dSᵀ of its queries to shared memory (two buffers each, tiles alternating),
    then, once both halves are there, dV += Pᵀ dO, dK += dSᵀ Q and dQ = dS K on its columns."""
    STAGES: gl.constexpr = bufs.q.shape[0]
    BLOCK_M: gl.constexpr = bufs.q.shape[1]
    HEAD_DIM: gl.constexpr = bufs.q.shape[2]
    dtype: gl.constexpr = bufs.q.dtype
    ROWS: gl.constexpr = bufs.k.shape[0]  # the block's keys, every consumer
    QCOLS: gl.constexpr = BLOCK_M // var.NUM_CONSUMERS  # this consumer's queries of Sᵀ and dPᵀ
    HALF: gl.constexpr = HEAD_DIM // var.NUM_CONSUMERS  # this consumer's columns of dK, dV and dQ
    s_layout: gl.constexpr = _mma_layout(gl.num_warps(), 1, QCOLS)
    slot = it % STAGES
    q_t = bufs.q.index(slot)
    do_t = bufs.do.index(slot)
    p_buf = bufs.p.index(it % 2)
    ds_buf = bufs.ds.index(it % 2)
    mbarrier.wait(bufs.ready.index(slot), (it // STAGES) & 1)
    zero = gl.zeros([ROWS, QCOLS], gl.float32, s_layout)
    s_tok = warpgroup_mma(bufs.k, q_t.slice(C * QCOLS, QCOLS).permute((1, 0)), zero, use_acc=False, is_async=True)
    dp_tok = warpgroup_mma(bufs.v, do_t.slice(C * QCOLS, QCOLS).permute((1, 0)), zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
    lse = bufs.lse.index(slot).slice(C * QCOLS, QCOLS, dim=1).load(s_layout)
    p = gl.exp2(s * out.qk_scale - lse)
    if MASKED:
        p = _masked(p, prog.start_n, i * BLOCK_M + C * QCOLS, prog, var.IS_CAUSAL)
    p_buf.slice(C * QCOLS, QCOLS, dim=1).store(p.to(dtype))
    dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp_tok,))
    delta = bufs.delta.index(slot).slice(C * QCOLS, QCOLS, dim=1).load(s_layout)
    ds_buf.slice(C * QCOLS, QCOLS, dim=1).store((p * (dp - delta)).to(dtype))
    fence_async_shared()
    # every product below reads both consumers' halves of Pᵀ and dSᵀ
    mbarrier.arrive(bufs.ds_bar.index(it % 2))
    mbarrier.wait(bufs.ds_bar.index(it % 2), (it // 2) & 1)
    dv = warpgroup_mma(p_buf, do_t.slice(C * HALF, HALF, dim=1), dv, is_async=True)
    dk = warpgroup_mma(ds_buf, q_t.slice(C * HALF, HALF, dim=1), dk, is_async=True)
    dq_layout: gl.constexpr = _mma_layout(gl.num_warps(), 1, HALF)
    dq_zero = gl.zeros([BLOCK_M, HALF], gl.float32, dq_layout)
    dq_tok = warpgroup_mma(
        ds_buf.permute((1, 0)), bufs.k.slice(C * HALF, HALF, dim=1), dq_zero, use_acc=False, is_async=True
    )
    dv, dk, dq = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, dq_tok))
    mbarrier.arrive(bufs.empty.index(slot))
    _add_dq(dq, var, bufs, prog, out, bh, i, 0, 0, C, True, True)
    return dk, dv


@gluon.jit
def _consumer(var, descs, src, bufs, prog, out, C: gl.constexpr):
    """dK and dV of this consumer's keys (all of the CTA's without warp specialisation), over every query
    tile of every query head of the group; then stored (dK times sm_scale), straight from registers."""
    STAGES: gl.constexpr = bufs.q.shape[0]
    HEAD_DIM: gl.constexpr = bufs.k.shape[1]
    dtype: gl.constexpr = bufs.q.dtype
    ROWS: gl.constexpr = _KEYS_PER_CONSUMER if var.WARP_SPECIALIZE else bufs.k.shape[0]
    COLS: gl.constexpr = HEAD_DIM // var.NUM_CONSUMERS if var.SPLIT_D else HEAD_DIM  # of dK and dV
    kv_layout: gl.constexpr = _mma_layout(gl.num_warps(), 1, COLS)
    if not var.WARP_SPECIALIZE:
        _load_kv(var, descs, src, bufs, prog)
        for t in gl.static_range(STAGES):
            i_t, bh_t = _tile_of(t, prog)
            _load_rows(var, descs, src, bufs, prog, t, i_t, bh_t, pred=t < prog.group * (prog.n_m - prog.i_lo))
    mbarrier.wait(bufs.kv_bar.index(0), 0)
    dk = gl.zeros([ROWS, COLS], gl.float32, kv_layout)
    dv = gl.zeros([ROWS, COLS], gl.float32, kv_layout)
    count = prog.n_m - prog.i_lo
    for g in range(prog.group):  # the walk of _tile_of
        bh = prog.b * prog.heads + prog.h_kv * prog.group + g
        first = g * count - prog.i_lo
        for i in range(prog.i_lo, prog.i_mid):
            dk, dv = _consumer_tile(first + i, i, bh, dk, dv, var, descs, src, bufs, prog, out, C, True)
        for i in range(prog.i_mid, prog.n_m):
            dk, dv = _consumer_tile(first + i, i, bh, dk, dv, var, descs, src, bufs, prog, out, C, False)
    row0 = prog.start_n if var.SPLIT_D else prog.start_n + C * ROWS
    col0 = C * COLS if var.SPLIT_D else 0
    b = prog.b.to(gl.int64)
    h = prog.h_kv.to(gl.int64)
    dk_base = out.dk + b * out.dk_b + h * out.dk_h
    dv_base = out.dv + b * out.dv_b + h * out.dv_h
    _store_rows((dk * out.sm_scale).to(dtype), dk_base, out.dk_n, row0, col0, prog.seqlen_k, kv_layout)
    _store_rows(dv.to(dtype), dv_base, out.dv_n, row0, col0, prog.seqlen_k, kv_layout)


# ---------------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------------


@gluon.jit
def _fa3_bwd_kernel(
    q_desc,
    k_desc,
    v_desc,
    do_desc,  # [B, H, Nq, d], [B, H_kv, Nk, d] (the block BLOCK_N keys), [B, H_kv, Nk, d], [B, H, Nq, d]
    lse_desc,
    delta_desc,  # [B·H, q_rows] fp32: the logsumexp in log2 (+inf past Nq and where a row sees no key), Δ
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,  # the same tensors' bases, for the per-thread (cp.async) producer
    dq_ptr,  # [B·H, q_rows, d] fp32, zeroed: dQ / sm_scale accumulated
    sem_ptr,  # [B·H, q_rows / BLOCK_M, consumers] int32, zeroed (DETERMINISTIC)
    dk_ptr,
    dv_ptr,  # [B, H_kv, Nk, d] in the inputs' dtype, last dim contiguous
    stride_qb,
    stride_qh,
    stride_qn,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_dob,
    stride_doh,
    stride_don,
    stride_dkb,
    stride_dkh,
    stride_dkn,
    stride_dvb,
    stride_dvh,
    stride_dvn,
    seqlen_q,
    seqlen_k,
    heads,
    kv_heads,
    q_rows,
    qk_scale,  # sm_scale · log2 e
    sm_scale,
    BLOCK_M: gl.constexpr,  # query rows per tile
    BLOCK_N: gl.constexpr,  # keys per CTA: 64 per consumer warpgroup
    NUM_CONSUMERS: gl.constexpr,
    NUM_STAGES: gl.constexpr,
    IS_CAUSAL: gl.constexpr,
    WARP_SPECIALIZE: gl.constexpr,
    USE_TMA: gl.constexpr,
    DETERMINISTIC: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    DQ_WRITER: gl.constexpr = False,  # the producer partition adds dQ from a staging buffer (warp specialised)
):
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[3]
    dtype: gl.constexpr = q_desc.dtype
    SPLIT_D: gl.constexpr = WARP_SPECIALIZE and BLOCK_N == _KEYS_PER_CONSUMER  # (d = 256: see BwdVariant)
    j = gl.program_id(0)
    bhk = gl.program_id(1)
    b = bhk // kv_heads
    h_kv = bhk % kv_heads
    group = heads // kv_heads
    start_n = j * BLOCK_N

    # The query tiles that see this block's keys; those crossing the causal diagonal, or all where the
    # block runs past the last key, are masked.
    n_m = gl.cdiv(seqlen_q, BLOCK_M)
    if IS_CAUSAL:
        off = seqlen_k - seqlen_q
        i_lo = gl.maximum(start_n - off, 0) // BLOCK_M
        i_mid = gl.cdiv(gl.maximum(start_n + BLOCK_N - 1 - off, 0), BLOCK_M)
    else:
        i_lo = 0
        i_mid = 0
    i_mid = gl.where(start_n + BLOCK_N > seqlen_k, n_m, i_mid)
    i_lo = gl.minimum(i_lo, n_m)
    i_mid = gl.minimum(gl.maximum(i_mid, i_lo), n_m)
    prog = BwdProgram(b, h_kv, j, start_n, seqlen_q, seqlen_k, heads, group, n_m, i_lo, i_mid, q_rows)

    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], dtype)
    row_layout: gl.constexpr = lse_desc.layout
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], kv_layout)
    q_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_M, HEAD_DIM], q_layout)
    do_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_M, HEAD_DIM], q_layout)
    lse_smem = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, 1, BLOCK_M], row_layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, 1, BLOCK_M], row_layout)
    # (SPLIT_D: both consumers' products read all of Pᵀ, which then alternates between two buffers as dSᵀ)
    p_smem = gl.allocate_shared_memory(dtype, [2 if SPLIT_D else 1, BLOCK_N, BLOCK_M], ds_layout)
    ds_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M], ds_layout)
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    kv_bar = gl.allocate_shared_memory(gl.int64, [1, 1], bar_layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], bar_layout)
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], bar_layout)
    ds_bar = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)
    dq_full = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], bar_layout)
    dq_empty = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], bar_layout)
    if DQ_WRITER:  # each consumer's part of a tile's dQ: half the rows (BLOCK_M = 128) or half the columns
        part: gl.constexpr = [BLOCK_M // NUM_CONSUMERS, HEAD_DIM] if BLOCK_M == 128 else [BLOCK_M, HEAD_DIM // 2]
        dq_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for(part, gl.float32)
        dq_smem = gl.allocate_shared_memory(gl.float32, [NUM_CONSUMERS] + part, dq_layout)
    else:
        dq_smem = ds_smem
    for c in gl.static_range(NUM_CONSUMERS):
        mbarrier.init(dq_full.index(c), count=1)
        mbarrier.init(dq_empty.index(c), count=1)
    # a TMA load arrives once (with its byte count); per-thread copies once per producer thread
    arrivals: gl.constexpr = 1 if USE_TMA else 32 * gl.num_warps()
    mbarrier.init(kv_bar.index(0), count=arrivals)
    for s in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(s), count=arrivals)
        mbarrier.init(empty.index(s), count=NUM_CONSUMERS)
    for s in gl.static_range(2):
        mbarrier.init(ds_bar.index(s), count=NUM_CONSUMERS)

    var = BwdVariant(
        NUM_CONSUMERS, WARP_SPECIALIZE, USE_TMA, DETERMINISTIC, DQ_WRITER, IS_CAUSAL, BLOCK_M == 128, SPLIT_D
    )
    descs = BwdDescriptors(q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc)
    bufs = BwdBuffers(
        k_smem,
        v_smem,
        q_smem,
        do_smem,
        lse_smem,
        delta_smem,
        p_smem,
        ds_smem,
        dq_smem,
        kv_bar,
        ready,
        empty,
        ds_bar,
        dq_full,
        dq_empty,
    )
    b64 = b.to(gl.int64)
    h64 = h_kv.to(gl.int64)
    src = BwdSources(
        q_ptr + b64 * stride_qb,
        do_ptr + b64 * stride_dob,
        k_ptr + b64 * stride_kb + h64 * stride_kh,
        v_ptr + b64 * stride_vb + h64 * stride_vh,
        lse_ptr,
        delta_ptr,
        stride_qh,
        stride_qn,
        stride_doh,
        stride_don,
        stride_kn,
        stride_vn,
    )
    out = BwdOutputs(
        dq_ptr,
        sem_ptr,
        dk_ptr,
        dv_ptr,
        stride_dkb,
        stride_dkh,
        stride_dkn,
        stride_dvb,
        stride_dvh,
        stride_dvn,
        qk_scale,
        sm_scale,
    )
    if WARP_SPECIALIZE:
        gl.static_assert(
            BLOCK_N == _KEYS_PER_CONSUMER * NUM_CONSUMERS or SPLIT_D, "64 keys per consumer warpgroup, or shared"
        )
        gl.static_assert(NUM_CONSUMERS == 2, "two consumer warpgroups")
        gl.static_assert(not (SPLIT_D and (DQ_WRITER or BLOCK_M != 64)), "d = 256: 64-row tiles, no writer")
    else:
        gl.static_assert(not DQ_WRITER, "the dQ writer is the producer partition: warp specialisation")
    if WARP_SPECIALIZE:
        gl.warp_specialize(
            [
                (_producer, (var, descs, src, bufs, prog, out)),
                (_consumer, (var, descs, src, bufs, prog, out, 0)),
                (_consumer, (var, descs, src, bufs, prog, out, 1)),
            ],
            [4, 4],
            [CONSUMER_REGS, CONSUMER_REGS],
        )
    else:
        _consumer(var, descs, src, bufs, prog, out, 0)
