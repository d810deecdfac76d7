"""The pieces of one K/V tile of the FA-3 kernel (``fa3_kernels.py``): loads, products, softmax step, P's operand.

The tile range every partition walks, the TMA and per-thread (``cp.async``) loads, S = Q Kᵀ and its mask, one
step of the online softmax, P as the A operand of P V (16-bit, or packed to e4m3 in place for FP8), the row
sums on the tensor cores, the per-tile descales; and the register layouts they use. Only ``@gluon.jit`` code;
the partitions, the state they share and the kernel are in ``fa3_kernels.py``.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma

# four fp32 values into one register of four e4m3 (saturating round-to-nearest-even, as the 16-bit path's cast)
_E4M3X4 = gl.constexpr(
    "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3; "
    "mov.b32 $0, {lo, hi}; }"
)


@gluon.constexpr_function
def _mma_layout(num_warps, n, k_width_bits):
    # wgmma's accumulator: 16-row slabs per warp, a warpgroup covers 64 rows; K per instruction = 256 bits
    return gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 256 // k_width_bits]
    )


@gluon.constexpr_function
def _copy_layout(num_warps, head_dim, elem_bits):
    # per-thread loads for the cp.async producer: 16 bytes a thread, a row's threads side by side
    vec = 128 // elem_bits
    cols = min(32, head_dim // vec)
    return gl.BlockedLayout([1, vec], [32 // cols, cols], [num_warps, 1], [1, 0])


# ---------------------------------------------------------------------------------------------------
# The tile range, loads, products, the online softmax
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
def _cp_async_tile(
    dst,
    base,
    row0,
    col0,
    nrows,
    ncols,
    stride_row,
    CHUNK: gl.constexpr,
    layout: gl.constexpr,
    COL_GRAIN: gl.constexpr = 1,
):
    """Per-thread asynchronous copies of the (ROWS, COLS) tile at (row0, col0) of a row-major matrix into
    ``dst``, CHUNK rows at a time (few live addresses per thread); rows at or past ``nrows`` and columns at or
    past ``ncols`` rounded up to COL_GRAIN are zero-filled. A COL_GRAIN of at least 16 bytes keeps the copies
    16 bytes wide when the columns are the contiguous axis (the caller guarantees the rounded-up columns are
    allocated and finite)."""
    ROWS: gl.constexpr = dst.shape[0]
    COLS: gl.constexpr = dst.shape[1]
    ncols = (ncols + COL_GRAIN - 1) // COL_GRAIN * COL_GRAIN
    cols = col0 + gl.arange(0, COLS, gl.SliceLayout(0, layout))
    for r in gl.static_range(0, ROWS, CHUNK):
        rows = row0 + r + gl.arange(0, CHUNK, gl.SliceLayout(1, layout))
        ptrs = base + gl.expand_dims(rows.to(gl.int64) * stride_row, 1) + gl.expand_dims(cols, 0)
        mask = gl.expand_dims(rows < nrows, 1) & gl.expand_dims(cols < ncols, 0)
        async_copy.async_copy_global_to_shared(dst.slice(r, CHUNK), ptrs, mask=mask)


@gluon.jit
def _tma_tile(desc, b, h, row, bar, dst, pred=True, col=0):
    """One TMA load of the tile at (row, col) of one (batch, head)'s matrix; what lies past its end arrives
    as zeros."""
    mbarrier.expect(bar, desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(desc, [b, h, row, col], bar, dst.reshape(desc.block_type.shape), pred=pred)


@gluon.jit
def _tma_v(desc, b, h_kv, j, bar, dst, V_T: gl.constexpr, pred=True):
    """V's tile j: rows j·BLOCK_N… of ``[N, d]``, or (V_T, FP8) columns j·BLOCK_N… of ``[d, N]``."""
    if V_T:
        _tma_tile(desc, b, h_kv, 0, bar, dst, pred, j * dst.shape[1])
    else:
        _tma_tile(desc, b, h_kv, j * dst.shape[0], bar, dst, pred)


@gluon.jit
def _v_operand(v_tile, V_T: gl.constexpr):
    """V's tile as the B operand of P V, ``[BLOCK_N, d]`` (a transposed view of ``[d, BLOCK_N]`` for V_T: FP8's
    V comes keys-contiguous because FP8 WGMMA reads its B operand K-major only)."""
    if V_T:
        return v_tile.permute((1, 0))
    else:
        return v_tile


@gluon.jit
def _issue_scores(q_tile, k_tile, s_layout: gl.constexpr):
    """S = Q Kᵀ on the tensor cores, asynchronously (a fresh accumulator: use_acc=False)."""
    shape: gl.constexpr = [q_tile.shape[0], k_tile.shape[0]]
    return warpgroup_mma(
        q_tile, k_tile.permute((1, 0)), gl.zeros(shape, gl.float32, s_layout), use_acc=False, is_async=True
    )


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
def _softmax_step(s, m_i, l_i, scale, P_SHIFT: gl.constexpr, ROW_SUM: gl.constexpr = True):
    """One tile of the online softmax in the log2 domain: (P, new row max, new row sum, rescale factor).

    ``scale`` holds each row's factor from raw scores to the log2 domain (sm_scale · log2 e, times the
    descales for FP8). The row max is taken on the raw scores and scaled after (the factors are positive),
    so that each exponent is one fused multiply-add. P comes out times 2^P_SHIFT (FP8's P scale, folded into
    the exponent; 0 for 16 bits), and so does the row sum. A row that has seen only masked keys keeps
    m = -inf; its exponentials are taken against 0 so that it gives P = 0 and a factor of 0, not NaN."""
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * scale)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(s * gl.expand_dims(scale, 1) - gl.expand_dims(m_use - P_SHIFT, 1))
    if ROW_SUM:
        l_new = l_i * alpha + gl.sum(p, axis=1)
    else:  # (FP8: the tensor cores take the row sums, of the P they multiply)
        l_new = l_i
    return p, m_new, l_new, alpha


@gluon.jit
def _p_operand(p, like):
    """P as the loop carries it, ``like``'s type and layout: the A operand of P V (16-bit), or fp32 in the
    accumulator's layout (FP8: a no-op; ``_p_fp8`` converts it as its product is issued)."""
    return gl.convert_layout(p.to(like.dtype), like.type.layout)


@gluon.jit
def _p_fp8(p, layout: gl.constexpr):
    """fp32 P (wgmma accumulator layout) as the e4m3 A operand (``layout``) of P V with V in ``FP8Values``'
    key order: the column c = 16·a1 + 8·a0 + 2·t + b of every 32 becomes k = 16·a1 + 4·t + 2·a0 + b, which
    leaves every value in its thread (the layout conversion is asserted to move nothing), then 4 values per
    register, rounded to nearest even and saturated."""
    M: gl.constexpr = p.shape[0]
    N: gl.constexpr = p.shape[1]
    q = gl.reshape(p, [M, N // 32, 2, 2, 4, 2])  # (row, group, a1, a0, t, b)
    q = gl.permute(q, [0, 1, 2, 4, 3, 5])  # (row, group, a1, t, a0, b)
    q = gl.reshape(q, [M, N])
    q = gl.convert_layout(q, layout, assert_trivial=True)
    return gl.inline_asm_elementwise(_E4M3X4, "=r,r,r,r,r", [q], dtype=gl.float8e4nv, is_pure=True, pack=4)


@gluon.jit
def _issue_row_sums(p_op, ones_smem, l_i, alpha):
    """(ℓ rescaled by the tile's factor α, the tile's row sums of P): P · 1 of the operand P V multiplies, on
    the tensor cores, asynchronously, in a fresh accumulator like ``l_i``, for the caller to add to ℓ after
    the wait. The ones are an 8 × BLOCK_N e4m3 tile in shared memory and the accumulator has 8 columns, each
    a row's sum: ℓ sums the rounded P that multiplies V, and the softmax adds nothing per element
    (``fp8.emulate(..., row_sums="p8")`` is its reference; ``fa3.fp8_row_sums`` says where registers allow
    it). (ℓ is not carried in the MMA's accumulator across tiles: the FP8 tensor cores add into it with fewer
    bits than fp32, and over thousands of keys the running sum drifted.)"""
    layout: gl.constexpr = l_i.type.layout
    l_i = l_i * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, layout)), 1)
    sums = warpgroup_mma(
        p_op, ones_smem.permute((1, 0)), gl.zeros(l_i.shape, gl.float32, layout), use_acc=False, is_async=True
    )
    return l_i, sums


@gluon.jit
def _pv_a(p, p_layout: gl.constexpr, IS_FP8: gl.constexpr):
    """The A operand of P V from the P the loop carries (already the operand with 16 bits). FP8 carries P in
    fp32 to this point, where two ``cvt.rn.satfinite.e4m3x2`` pack each 4 values into one register: an e4m3
    tensor carried across the loop would live in byte-sized registers and be re-packed every tile."""
    if IS_FP8:
        return _p_fp8(p, p_layout)
    else:
        return p


@gluon.jit
def _tile_scale(ptr, j, n_tiles, stride_blk, BLOCK_N: gl.constexpr, KV_BLOCK: gl.constexpr, IS_FP8: gl.constexpr):
    """The descale factor of K/V tile j (its block of KV_BLOCK keys; stride 0 unless per block), 1 for j past
    the last tile; 1 without FP8."""
    if IS_FP8:
        return gl.load(ptr + (j * BLOCK_N // KV_BLOCK) * stride_blk, mask=j < n_tiles, other=1.0)
    else:
        return gl.to_tensor(1.0)
