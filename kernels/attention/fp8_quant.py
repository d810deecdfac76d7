"""The fused e4m3 quantiser of FP8 attention: one read of a 16-bit ``[B, H, N, d]`` tensor, one e4m3 write.

x ≈ x₈ · scale with scale = amax / 448 over a group (``fp8``'s granularities), and the division, the clamp to
±448 and the cast in one Triton kernel, the amax on the GPU: per block each program quantises a block of its
own (``_tiling``); per head and per tensor a first kernel folds the blocks' amax into the group's with an
atomic max (two reads of the input, one write). ``transpose`` and ``interleave`` write V as the FP8 WGMMA
reads it (keys contiguous; in the FA-3 kernel's key order). Nothing is read back: a non-finite input gives a
non-finite scale, and ``nonfinite`` counts such blocks on the device for a caller who asks
(``QuantizedFP8.check``, ``check_finite``). In the interpreter, whose fp32 → e4m3 conversion is wrong, the
values are rounded in fp32 and cast by torch. Tested in the interpreter (tests/kernels/test_fp8_quant.py),
compiled for sm_90 (no spills, 16-byte stores), and on an H200 (test_fp8.py and test_cuda_graphs.py there).
"""

from __future__ import annotations

import typing

import torch
import triton
import triton.language as tl

from kernels._runtime import INTERPRET, LaunchCache, device_guard

E4M3_MAX = 448.0
GRANULARITIES = ("none", "tensor", "head", "block")
_ROWS = 64  # rows per program of the head and tensor granularities (a block is one program)
WHOLE_ELEMENTS = 16384  # the biggest block a program holds whole (``_tiling``)


class QuantizedFP8(typing.NamedTuple):
    """An e4m3 tensor, its fp32 descales and the device-side count of row blocks that held NaN or Inf."""

    x8: torch.Tensor
    scale: torch.Tensor
    nonfinite: torch.Tensor  # int32, shape (1,)

    def check(self, name: str = "x") -> QuantizedFP8:
        """Raise ``ValueError`` if any block held NaN or Inf (reads the count back: one synchronisation)."""
        check_finite((self,), (name,))
        return self


def check_finite(parts: typing.Sequence[QuantizedFP8], names: typing.Sequence[str]) -> None:
    """Raise ``ValueError`` naming the first of ``parts`` that held NaN or Inf: their counts are read back
    together, one synchronisation for them all."""
    counts = torch.cat([part.nonfinite for part in parts]).tolist()
    for name, count in zip(names, counts, strict=True):
        if count:
            raise ValueError(f"cannot quantise {name}: it holds NaN or Inf values")


@triton.jit
def round_to_e4m3(x):
    """x (fp32, |x| ≤ 448) rounded to the nearest e4m3 value, ties to even, in fp32: the interpreter's cast,
    here and for FP8 attention's P (``fp8_kernels``). Normal range (|x| ≥ 2⁻⁶): 3 mantissa bits kept by
    integer rounding of the fp32 bits (a carry propagates into the exponent, as it should); subnormal range:
    multiples of 2⁻⁹, by the add-and-subtract of 2²³, whose fp32 rounding is round-to-nearest-even."""
    a = tl.abs(x)
    bits = a.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000
    normal = rounded.to(tl.float32, bitcast=True)
    small = ((a * 512.0 + 8388608.0) - 8388608.0) * 0.001953125
    r = tl.where(a >= 0.015625, normal, small)
    signed = (r.to(tl.uint32, bitcast=True) | (x.to(tl.uint32, bitcast=True) & 0x80000000)).to(tl.float32, bitcast=True)
    return tl.where(x == x, signed, x)  # the sign of x (-0 too), NaN kept


@triton.jit
def _abs_max(x):
    """max |x| of a tile in fp32, +Inf if it holds a NaN (max alone would skip it)."""
    a = tl.abs(x).to(tl.float32)
    return tl.max(tl.max(tl.where(a == a, a, float("inf")), axis=1), axis=0)


@triton.jit
def _block(
    X,
    off_bh,
    rows,
    stride_b,
    stride_h,
    stride_n,
    stride_d,
    heads,
    seqlen,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    COL0: tl.constexpr = 0,
):
    """The given rows of one (batch, head), columns COL0 … COL0 + BLOCK_D, in the input's dtype (a block
    held whole stays 16-bit in registers), zeros past the end and in the head-dim padding."""
    b = (off_bh // heads).to(tl.int64)
    h = (off_bh % heads).to(tl.int64)
    cols = COL0 + tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < seqlen) & (cols[None, :] < HEAD_DIM)
    ptrs = X + b * stride_b + h * stride_h + rows[:, None].to(tl.int64) * stride_n + cols[None, :] * stride_d
    return tl.load(ptrs, mask=mask, other=0.0), rows, cols, mask


@triton.jit
def _amax_kernel(
    X,  # (B, H, N, d) 16-bit, any strides
    AMAX,  # (groups,) int32: the bits of each group's amax, 0 to start with
    stride_b,
    stride_h,
    stride_n,
    stride_d,
    heads,
    seqlen,
    PER_HEAD: tl.constexpr,  # else one group for the whole tensor
    HEAD_DIM: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    off_bh = tl.program_id(1)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    x, rows, cols, mask = _block(
        X, off_bh, rows, stride_b, stride_h, stride_n, stride_d, heads, seqlen, HEAD_DIM, BLOCK_D
    )
    amax = _abs_max(x)
    # non-negative floats order like their bits (and +Inf, what a NaN counts as here, above them all)
    tl.atomic_max(AMAX + (off_bh if PER_HEAD else 0), amax.to(tl.int32, bitcast=True))


@triton.jit
def _chunk(
    X,
    off_bh,
    slots,
    stride_b,
    stride_h,
    stride_n,
    stride_d,
    heads,
    seqlen,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INTERLEAVE: tl.constexpr,
    COL0: tl.constexpr = 0,
):
    """The rows ``slots`` of a block (``_block``); with INTERLEAVE the keys those columns of the FA-3
    layout hold instead (``fa3.fp8_key_slots``' inverse, within each 16 keys, so within the block): the block
    reads its rows in that order and writes its columns in order, so the writes stay 16 bytes wide."""
    rows = slots
    if INTERLEAVE:
        w = slots % 32
        rows = slots - w + (w & 16) + ((w >> 1) & 1) * 8 + ((w >> 2) & 3) * 2 + (w & 1)
    return _block(X, off_bh, rows, stride_b, stride_h, stride_n, stride_d, heads, seqlen, HEAD_DIM, BLOCK_D, COL0)


@triton.jit
def _group_scale(local, SCALE, AMAX, off_bh, pid_n, GRANULARITY: tl.constexpr):
    """The descale of this program's group (``local``: its block's amax, per block), written once per group;
    a non-finite group's scale is non-finite, so are its outputs."""
    if GRANULARITY == 0:
        return 1.0
    if GRANULARITY == 3:
        amax = local
        group = off_bh * tl.num_programs(0) + pid_n
        first = pid_n >= 0
    else:
        group = off_bh if GRANULARITY == 2 else 0
        amax = tl.load(AMAX + group).to(tl.float32, bitcast=True)
        first = (pid_n == 0) & ((GRANULARITY == 2) | (off_bh == 0))  # one program per group writes
    finite = amax < float("inf")  # False for +Inf and NaN
    scale = tl.where(amax > 0.0, tl.math.div_rn(amax, 448.0), 1.0)  # IEEE division, as torch
    scale = tl.where(finite, scale, amax)
    tl.store(SCALE + group, scale, mask=first)
    return scale


@triton.jit
def _quantize_kernel(
    X,  # (B, H, N, d) 16-bit, any strides
    X8,  # e4m3 (B, H, N, d) contiguous, or (B, H, d, N') with TRANSPOSE; fp32 of the same shape with EMULATE
    SCALE,  # fp32: one per group, (B·H·blocks,) / (B·H,) / (1,)
    AMAX,  # int32 bits of each group's amax (head and tensor granularities)
    NONFINITE,  # (1,) int32: blocks holding NaN or Inf
    stride_b,
    stride_h,
    stride_n,
    stride_d,
    stride_ob,
    stride_oh,
    stride_orow,
    stride_ocol,  # of X8 as stored: (b, h, n, d), or (b, h, d, n) transposed
    heads,
    seqlen,
    width,  # INTERLEAVE: the keys rounded up to 32, every column of X8 (its padding written as zeros)
    GRANULARITY: tl.constexpr,  # 0 none, 1 tensor, 2 head, 3 block
    TRANSPOSE: tl.constexpr,
    INTERLEAVE: tl.constexpr,  # (with TRANSPOSE) keys in the FP8 FA-3 kernel's order (fa3.fp8_key_slots)
    HEAD_DIM: tl.constexpr,
    ROWS: tl.constexpr,  # rows of the block a program owns (one scale's, per block)
    CHUNK: tl.constexpr,  # rows it holds at a time (ROWS a multiple of it)
    BLOCK_D: tl.constexpr,
    COLS: tl.constexpr,  # columns it quantises at a time (BLOCK_D a multiple of it): transposed, all ROWS rows
    EMULATE: tl.constexpr,  # the interpreter: write the e4m3 values rounded exactly, in fp32
):
    pid_n = tl.program_id(0)
    off_bh = tl.program_id(1)
    start = pid_n * ROWS
    WHOLE: tl.constexpr = CHUNK == ROWS and COLS == BLOCK_D  # the program holds its whole block: one pass
    QROWS: tl.constexpr = ROWS if COLS < BLOCK_D else CHUNK  # rows per quantised chunk
    # Per block in chunks the amax comes first: a pass over the chunks, which the second pass reads again
    # from L2 (small chunks keep registers few and programs many a multiprocessor, for the memory's sake).
    local = 0.0
    if GRANULARITY == 3 and not WHOLE:
        for c in tl.static_range(0, ROWS, CHUNK):
            x, rows, cols, mask = _chunk(
                X,
                off_bh,
                start + c + tl.arange(0, CHUNK),
                stride_b,
                stride_h,
                stride_n,
                stride_d,
                heads,
                seqlen,
                HEAD_DIM,
                BLOCK_D,
                INTERLEAVE,
            )
            local = tl.maximum(local, _abs_max(x))
    if GRANULARITY != 3 or not WHOLE:
        scale = _group_scale(local, SCALE, AMAX, off_bh, pid_n, GRANULARITY)
    b = (off_bh // heads).to(tl.int64)
    h = (off_bh % heads).to(tl.int64)
    base = X8 + b * stride_ob + h * stride_oh
    for i in tl.static_range(0, (ROWS // QROWS) * (BLOCK_D // COLS)):
        c = (i // (BLOCK_D // COLS)) * QROWS
        slots = start + c + tl.arange(0, QROWS)
        x, rows, cols, mask = _chunk(
            X,
            off_bh,
            slots,
            stride_b,
            stride_h,
            stride_n,
            stride_d,
            heads,
            seqlen,
            HEAD_DIM,
            COLS,
            INTERLEAVE,
            (i % (BLOCK_D // COLS)) * COLS,
        )
        if GRANULARITY != 3 or WHOLE:
            local = tl.maximum(local, _abs_max(x))
        if GRANULARITY == 3 and WHOLE:
            scale = _group_scale(local, SCALE, AMAX, off_bh, pid_n, GRANULARITY)
        # NaN stays NaN through the clamp (a select on x instead kept a second copy of the tile live)
        y = tl.clamp(tl.math.div_rn(x.to(tl.float32), scale), -448.0, 448.0, propagate_nan=tl.PropagateNan.ALL)
        if EMULATE:
            y = round_to_e4m3(y)
        else:
            y = y.to(tl.float8e4nv)
        if TRANSPOSE:  # (d, n) tile, n contiguous: coalesced stores of V's transposed rows
            ptrs = base + cols[:, None].to(tl.int64) * stride_orow + slots[None, :] * stride_ocol
            if INTERLEAVE:  # every column up to the width: past the keys, the zeros the masked loads gave
                tl.store(ptrs, tl.trans(y), mask=(cols[:, None] < HEAD_DIM) & (slots[None, :] < width))
            else:
                tl.store(ptrs, tl.trans(y), mask=tl.trans(mask))
        else:
            ptrs = base + rows[:, None].to(tl.int64) * stride_orow + cols[None, :] * stride_ocol
            tl.store(ptrs, y, mask=mask)
    tl.atomic_add(NONFINITE, 1, mask=(local < float("inf")) == 0)  # NaN or Inf in this block


# launches after the first of each kind skip Triton's argument binding (kernels._runtime.LaunchCache), three a
# call of fp8.attention; num_stages is Triton's default for these kernels, which pipeline nothing
_AMAX = LaunchCache(_amax_kernel)
_QUANTIZE = LaunchCache(_quantize_kernel)
_NUM_STAGES = 3


def _tiling(rows: int, block_d: int, transpose: bool) -> tuple[int, int, int]:
    """(rows a program holds at a time, columns it quantises at a time, warps).

    A block of up to ``WHOLE_ELEMENTS`` elements is held whole (one pass, 32 elements a thread: 8 warps for
    64 × 128, 16 for 128 × 128), row-major or transposed. Kept in the input's 16-bit dtype, that takes at
    most about 64 registers a thread on sm_90 for Q's, K's and V's blocks at d = 128 (fp32 copies of the
    tile had taken twice that). On an H200 (harness timing, a probe outside the pipeline, d = 128, 4, 8 and
    16 warps tried) this was faster for all three than the two-pass walk below, and 32 elements a thread
    the fastest for each.

    Bigger blocks: row-major, two passes over half a block at a time (an amax pass, then the quantising
    one, which reads the block again from L1/L2), at most 16 warps; transposed, the amax pass in chunks of
    about 4096 elements, then the quantising pass over column strips of all the block's rows (each strip's
    transposed stores are whole rows of keys, 16 bytes a thread), 16 elements a thread. Compiled by
    tests/kernels/test_fp8_quant.py: no spills, 16-byte stores."""
    if rows * block_d <= WHOLE_ELEMENTS:
        return rows, block_d, max(4, min(16, rows * block_d // 1024))
    if transpose:
        chunk = min(rows, max(16, 4096 // block_d))
        cols = max(16, min(block_d, chunk * block_d // rows))  # the strip: as many elements as a chunk
    else:
        chunk = min(rows, max(16, rows // 2), max(16, 8192 // block_d))
        cols = block_d
    return chunk, cols, max(4, min(16, chunk * block_d // 512))


def quantize(
    x: torch.Tensor,
    granularity: str = "block",
    block: int | None = None,
    *,
    transpose: bool = False,
    interleave: bool = False,
) -> QuantizedFP8:
    """Quantise ``x`` ``[B, H, N, d]`` (float16, bfloat16 or float32, any strides) to e4m3 on its device.

    ``scale`` as ``fp8.quantize``: shape () (``"tensor"`` and ``"none"``), (B, H) (``"head"``) or
    (B, H, ⌈N / block⌉) (``"block"``: ``block`` rows per scale, a power of two from 16 to 256). ``x8``:
    contiguous ``[B, H, N, d]``, or with ``transpose`` the ``[B, H, d, N]`` view of a ``[B, H, d, N']`` tensor
    (keys contiguous, rows 16-byte aligned). ``interleave`` (with ``transpose``): the layout of V for the
    FP8 FA-3 kernel instead (``fa3.FP8Values``): ``x8`` is the whole ``[B, H, d, N']`` tensor, N' = N rounded up
    to 32 with zeros, key n in column ``fa3.fp8_key_slots(N')[n]``. Returns ``QuantizedFP8(x8, scale,
    nonfinite)``; nothing is read back (see the module docstring for non-finite inputs). Raises for bad
    arguments, naming them.
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError(f"x must be a [batch, heads, seq, head_dim] tensor, got {getattr(x, 'shape', type(x))}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"x must be a float16, bfloat16 or float32 tensor to quantise, got {x.dtype}")
    if granularity == "block":
        if isinstance(block, bool) or not isinstance(block, int) or block < 16 or block > 256 or block & (block - 1):
            raise ValueError(
                f"granularity 'block' needs a block size that is a power of two from 16 to 256, got {block!r}"
            )
    if interleave and not transpose:
        raise ValueError("interleave=True is a layout of the transposed tensor: it needs transpose=True")
    b, h, n, d = x.shape
    rows = block if granularity == "block" else _ROWS
    nblk = -(-n // rows)  # (not triton.cdiv: a constexpr function, microseconds a call from Python)
    device = x.device
    store_dtype = torch.float32 if INTERPRET else torch.float8_e4m3fn
    if transpose:
        grain = 32 if interleave else 16
        n_pad = -(-n // grain) * grain
        # the interleaved layout's padding is part of it, zeros: written by the kernel where its blocks reach
        x8 = (torch.zeros if interleave and nblk * rows < n_pad else torch.empty)(
            (b, h, d, n_pad), device=device, dtype=store_dtype
        )
    else:
        x8 = torch.empty((b, h, n, d), device=device, dtype=store_dtype)
    groups = {"none": 1, "tensor": 1, "head": b * h, "block": b * h * nblk}[granularity]
    # the kernel writes every group's scale (not "none"'s, 1): no fill needed when it runs
    scale = (torch.empty if x.numel() and granularity != "none" else torch.ones)(
        groups, device=device, dtype=torch.float32
    )
    nonfinite = torch.zeros(1, device=device, dtype=torch.int32)
    if x.numel():
        block_d = max(16, 1 << (d - 1).bit_length())  # the next power of two
        grid = (nblk, b * h, 1)
        chunk, cols, warps = _tiling(rows, block_d, transpose)
        amax = nonfinite  # (not read by the block and "none" granularities)
        with device_guard(x):
            if granularity in ("tensor", "head"):
                amax = torch.zeros(groups, device=device, dtype=torch.int32)
                # (whole 64-row tiles, few atomics per group; it only reads: 32 elements a thread)
                amax_warps = max(4, min(16, rows * block_d // 1024))
                constexprs = dict(PER_HEAD=granularity == "head", HEAD_DIM=d, ROWS=rows, BLOCK_D=block_d)
                _AMAX.launch(grid, (x, amax, *x.stride(), h, n), constexprs, amax_warps, _NUM_STAGES)
            constexprs = dict(
                GRANULARITY=GRANULARITIES.index(granularity),
                TRANSPOSE=transpose,
                INTERLEAVE=interleave,
                HEAD_DIM=d,
                ROWS=rows,
                CHUNK=chunk,
                BLOCK_D=block_d,
                COLS=cols,
                EMULATE=INTERPRET,
            )
            args = (x, x8, scale, amax, nonfinite, *x.stride(), *x8.stride(), h, n, x8.shape[-1])
            _QUANTIZE.launch(grid, args, constexprs, warps, _NUM_STAGES)
    if INTERPRET:  # exactly representable values: torch's cast is exact on them
        x8 = x8.to(torch.float8_e4m3fn)
    if transpose and not interleave:
        x8 = x8[..., :n]
    shape = {"none": (), "tensor": (), "head": (b, h), "block": (b, h, nblk)}[granularity]
    return QuantizedFP8(x8, scale.reshape(shape), nonfinite)
