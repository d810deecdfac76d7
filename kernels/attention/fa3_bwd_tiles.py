"""The pieces of the FA-3 backward's tiles (``fa3_bwd_kernels.py``): loads, the mask, dQ's operands and adds.

The tile walk and the producer's loads (TMA, or per-thread ``cp.async``), Pᵀ's mask, the operands of each
consumer's part of dQ = dS K, the fp32 atomic adds of that part (ordered behind a semaphore when
deterministic) and the writer's drain of the staged parts, and the stores of dK and dV. Only ``@gluon.jit``
code; the partitions, the state they share (aggregates, passed here by attribute) and the kernel are in
``fa3_bwd_kernels.py``.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from kernels.attention.fa3_tiles import _copy_layout, _cp_async_tile


@gluon.constexpr_function
def _mma_layout(warps_m, warps_n, n):
    # a wgmma accumulator: 16-row slabs per warp, warpgroups side by side along M, or along N (warps_n = 2)
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps_m, warps_n], instr_shape=[16, n, 16])


# ---------------------------------------------------------------------------------------------------
# The walk and the loads
# ---------------------------------------------------------------------------------------------------


@gluon.jit
def _tile_of(it, prog):
    """Tile ``it`` of the CTA's walk as (query tile, batch·head): every query head of the group in turn, its
    tiles i_lo … n_m - 1 (the masked ones, i < i_mid, first)."""
    count = prog.n_m - prog.i_lo
    g = it // count
    return prog.i_lo + it - g * count, prog.b * prog.heads + prog.h_kv * prog.group + g


@gluon.jit
def _load_kv(var, descs, src, bufs, prog):
    """K_j and V_j into shared memory, one barrier for both (rows past the last key arrive as zeros)."""
    if var.USE_TMA:
        mbarrier.expect(bufs.kv_bar.index(0), 2 * descs.k.block_type.nbytes)
        dst_k = bufs.k.reshape(descs.k.block_type.shape)
        dst_v = bufs.v.reshape(descs.v.block_type.shape)
        tma.async_copy_global_to_shared(descs.k, [prog.b, prog.h_kv, prog.start_n, 0], bufs.kv_bar.index(0), dst_k)
        tma.async_copy_global_to_shared(descs.v, [prog.b, prog.h_kv, prog.start_n, 0], bufs.kv_bar.index(0), dst_v)
    else:
        HEAD_DIM: gl.constexpr = bufs.k.shape[1]
        layout: gl.constexpr = _copy_layout(gl.num_warps(), HEAD_DIM, bufs.k.dtype.primitive_bitwidth)
        _cp_async_tile(bufs.k, src.k, prog.start_n, 0, prog.seqlen_k, HEAD_DIM, src.k_n, 32, layout)
        _cp_async_tile(bufs.v, src.v, prog.start_n, 0, prog.seqlen_k, HEAD_DIM, src.v_n, 32, layout)
        async_copy.mbarrier_arrive(bufs.kv_bar.index(0), increment_count=False)


@gluon.jit
def _load_rows(var, descs, src, bufs, prog, it, i, bh, pred=True):
    """Tile ``it`` (query tile i of batch·head bh)'s Q, dO, logsumexp and Δ into ring slot it % NUM_STAGES,
    one barrier for the four."""
    STAGES: gl.constexpr = bufs.q.shape[0]
    BLOCK_M: gl.constexpr = bufs.q.shape[1]
    HEAD_DIM: gl.constexpr = bufs.q.shape[2]
    slot = it % STAGES
    bar = bufs.ready.index(slot)
    h = bh - prog.b * prog.heads
    row0 = i * BLOCK_M
    if var.USE_TMA:
        nbytes: gl.constexpr = 2 * descs.q.block_type.nbytes + 2 * descs.lse.block_type.nbytes
        mbarrier.expect(bar, nbytes, pred=pred)
        q_dst = bufs.q.index(slot).reshape(descs.q.block_type.shape)
        do_dst = bufs.do.index(slot).reshape(descs.do.block_type.shape)
        tma.async_copy_global_to_shared(descs.q, [prog.b, h, row0, 0], bar, q_dst, pred=pred)
        tma.async_copy_global_to_shared(descs.do, [prog.b, h, row0, 0], bar, do_dst, pred=pred)
        tma.async_copy_global_to_shared(descs.lse, [bh, row0], bar, bufs.lse.index(slot), pred=pred)
        tma.async_copy_global_to_shared(descs.delta, [bh, row0], bar, bufs.delta.index(slot), pred=pred)
    else:
        layout: gl.constexpr = _copy_layout(gl.num_warps(), HEAD_DIM, bufs.q.dtype.primitive_bitwidth)
        row_layout: gl.constexpr = _copy_layout(gl.num_warps(), BLOCK_M, 32)
        q_base = src.q + h.to(gl.int64) * src.q_h
        do_base = src.do + h.to(gl.int64) * src.do_h
        rows_base = bh.to(gl.int64) * prog.q_rows
        _cp_async_tile(bufs.q.index(slot), q_base, row0, 0, prog.seqlen_q, HEAD_DIM, src.q_n, 32, layout)
        _cp_async_tile(bufs.do.index(slot), do_base, row0, 0, prog.seqlen_q, HEAD_DIM, src.do_n, 32, layout)
        _cp_async_tile(bufs.lse.index(slot), src.lse + rows_base, 0, row0, 1, prog.q_rows, 0, 1, row_layout)
        _cp_async_tile(bufs.delta.index(slot), src.delta + rows_base, 0, row0, 1, prog.q_rows, 0, 1, row_layout)
        async_copy.mbarrier_arrive(bar, increment_count=False)


# ---------------------------------------------------------------------------------------------------
# The mask, dQ and the stores
# ---------------------------------------------------------------------------------------------------


@gluon.jit
def _masked(p, n0, m0, prog, IS_CAUSAL: gl.constexpr):
    """Pᵀ of keys past the last one and, if causal, of (key, query) pairs right of the bottom-right-aligned
    diagonal (key n seen by query m iff n <= m + Nk - Nq) → 0."""
    layout: gl.constexpr = p.type.layout
    keys = gl.expand_dims(n0 + gl.arange(0, p.shape[0], gl.SliceLayout(1, layout)), 1)
    keep = keys < prog.seqlen_k
    if IS_CAUSAL:
        queries = gl.expand_dims(m0 + gl.arange(0, p.shape[1], gl.SliceLayout(0, layout)), 0)
        keep = keep & (keys <= queries + (prog.seqlen_k - prog.seqlen_q))
    return gl.where(keep, p, 0.0)


@gluon.jit
def _dq_operands(var, bufs, ds_buf, C: gl.constexpr):
    """dQ = dS K for this consumer's part of the tile: A = dS (dSᵀ read transposed), B = K. With warp
    specialisation each consumer takes half: the rows (SPLIT_M) or the head-dim columns."""
    BLOCK_M: gl.constexpr = bufs.q.shape[1]
    HEAD_DIM: gl.constexpr = bufs.k.shape[1]
    if not var.WARP_SPECIALIZE:
        return ds_buf.permute((1, 0)), bufs.k
    elif var.SPLIT_M:
        part: gl.constexpr = BLOCK_M // var.NUM_CONSUMERS
        return ds_buf.slice(C * part, part, dim=1).permute((1, 0)), bufs.k
    else:
        part: gl.constexpr = HEAD_DIM // var.NUM_CONSUMERS
        return ds_buf.permute((1, 0)), bufs.k.slice(C * part, part, dim=1)


@gluon.jit
def _dq_part(var, bufs, i, C: gl.constexpr):
    """(first row, first column) of consumer C's part of query tile i's dQ: with warp specialisation half the
    rows (SPLIT_M) or half the head-dim columns; without, the whole tile."""
    BLOCK_M: gl.constexpr = bufs.q.shape[1]
    HEAD_DIM: gl.constexpr = bufs.k.shape[1]
    row0 = i * BLOCK_M
    col0 = 0
    if var.WARP_SPECIALIZE:
        if var.SPLIT_M and not var.SPLIT_D:
            row0 = row0 + C * (BLOCK_M // var.NUM_CONSUMERS)
        else:
            col0 = C * (HEAD_DIM // var.NUM_CONSUMERS)
    return row0, col0


@gluon.jit
def _add_dq(vals, var, bufs, prog, out, bh, i, r0, c0, C: gl.constexpr, WAIT: gl.constexpr, RELEASE: gl.constexpr):
    """Rows r0 …, columns c0 … of consumer C's part of tile i's dQ (``_dq_part``) added to the fp32
    accumulator by atomics.
    DETERMINISTIC: first (WAIT) after the CTA of the key block before (the semaphore of the part counts the
    key blocks that have added to it), then (RELEASE) the semaphore advanced, so that every element gets its
    adds in key-block order."""
    HEAD_DIM: gl.constexpr = bufs.k.shape[1]
    layout: gl.constexpr = vals.type.layout
    row0, col0 = _dq_part(var, bufs, i, C)
    rows = row0 + r0 + gl.arange(0, vals.shape[0], gl.SliceLayout(1, layout))
    cols = col0 + c0 + gl.arange(0, vals.shape[1], gl.SliceLayout(0, layout))
    base = out.dq + bh.to(gl.int64) * prog.q_rows * HEAD_DIM
    ptrs = base + gl.expand_dims(rows * HEAD_DIM, 1) + gl.expand_dims(cols, 0)
    if var.DETERMINISTIC:
        sem = out.sem + (bh.to(gl.int64) * prog.n_m + i) * var.NUM_CONSUMERS + C
        if WAIT:  # one thread reads (acquire) and the partition waits on its value
            while gl.atomic_add(sem, 0, sem="acquire", scope="gpu") != prog.j:
                pass
        gl.atomic_add(ptrs, vals, sem="relaxed", scope="gpu")
        if RELEASE:
            gl.thread_barrier()  # every thread's adds issued before the release below
            gl.atomic_add(sem, 1, sem="release", scope="gpu")
    else:
        gl.atomic_add(ptrs, vals, sem="relaxed", scope="gpu")


@gluon.jit
def _drain_dq(t, var, bufs, prog, out):
    """The writer (DQ_WRITER: the producer partition): every consumer's staged part of tile t's dQ added to
    the accumulator, a few rows at a time (few registers), then the staging buffer handed back."""
    ROWS: gl.constexpr = bufs.dq.shape[1]
    COLS: gl.constexpr = bufs.dq.shape[2]
    CHUNK: gl.constexpr = 4 * 32 * gl.num_warps() // COLS  # rows a pass: four floats a thread
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [32 // (COLS // 4), COLS // 4], [gl.num_warps(), 1], [1, 0])
    i, bh = _tile_of(t, prog)
    for c in gl.static_range(var.NUM_CONSUMERS):
        staged = bufs.dq.index(c)
        mbarrier.wait(bufs.dq_full.index(c), t & 1)
        for r in gl.static_range(0, ROWS, CHUNK):
            vals = staged.slice(r, CHUNK).load(layout)
            _add_dq(vals, var, bufs, prog, out, bh, i, r, 0, c, r == 0, r + CHUNK >= ROWS)
        mbarrier.arrive(bufs.dq_empty.index(c))


@gluon.jit
def _store_rows(t, base, stride_n, row0, col0, n_rows, layout: gl.constexpr):
    """``t`` [R, C] into rows row0 … and columns col0 … of a row-major matrix (row stride ``stride_n``), the
    rows before n_rows."""
    rows = row0 + gl.arange(0, t.shape[0], gl.SliceLayout(1, layout))
    cols = col0 + gl.arange(0, t.shape[1], gl.SliceLayout(0, layout))
    ptrs = base + gl.expand_dims(rows.to(gl.int64) * stride_n, 1) + gl.expand_dims(cols, 0)
    gl.store(ptrs, t, mask=gl.expand_dims(rows < n_rows, 1))
