"""The W4A16 / W8A16 weight formats: int4 group-wise and int8 per-channel, their quantisers and packing.

int4 (``quantize`` → ``W4Weight``): one scale, and for the asymmetric format one zero point, per
``group_size`` consecutive inputs of an output row of ``W [N, K]``. Codes are unsigned 4-bit ``q``.
Asymmetric: ``w ≈ (q − z) · s`` with ``q, z ∈ [0, 15]``. Symmetric: the code is the signed value plus 8
(``q − 8 ∈ [−8, 7]``, the quantiser uses ±7), so ``w ≈ (q − 8) · s``.

Packed layout (``W4Weight.packed``, int32 ``[N, K // 8]``, row-major), in blocks of ``PACK_BLOCK`` = 128
inputs: within the block starting at input ``k0`` (16 words per row), nibble i (bits ``4i … 4i + 3``) of
word j holds input ``k0 + 16i + j``. When K is not a multiple of 128 the last block, of t = 32, 64 or 96
inputs (K is a multiple of the group size, ≥ 32), has t/8 words per row and nibble i of its word j holds
input ``k0 + i·t/8 + j``; the width alone fixes the layout, so ``unpack_codes`` returns the natural order.
Why: nibble i of a ``[BLOCK_N, 16]`` word tile is then a contiguous K range of 16 inputs, which the kernel
multiplies with a 16-column slice of x without reshaping unpacked nibbles. Scales (and zero points) are
stored N-contiguous, and for 16-bit weights as one int32 per (group, output) holding the scale and
``2^e + z`` in the scale's dtype (``W4Weight.scale_zero``; ``scales``/``zeros`` are views of it): one
4-byte load per group, which Triton's pipeliner issues asynchronously like the words.

int8 (``quantize_w8`` → ``W8Weight``): one symmetric scale per output channel.

``dequantize`` gives the weight a kernel multiplies by; on a GPU it is one Triton kernel
(``unpack_to_memory``), the unfused baseline at memory speed. Handles float16, bfloat16 and float32
weights, K a multiple of the group size (32, 64 or 128). Does not handle: act-order (GPTQ's permuted
groups), activation quantisation. Tested in tests/kernels/test_w4a16.py (layout, round trips, degenerate
groups, bad inputs) in the interpreter on the CPU.
"""

from __future__ import annotations

import dataclasses

import torch
import triton

from kernels._runtime import INTERPRET, LaunchCache, compute_capability, device_guard
from kernels.w4a16.w4a16_kernels import _w4_unpack_kernel

GROUP_SIZES = (32, 64, 128)
PACK_BLOCK = 128  # inputs per packing block of the int4 format (module docstring)
WEIGHT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_UNPACK = LaunchCache(_w4_unpack_kernel)  # later launches skip Triton's argument binding


@dataclasses.dataclass(frozen=True, eq=False)
class W4Weight:
    """An int4 group-wise quantised ``[N, K]`` weight (see the module docstring for the packing).

    packed: int32 ``[N, K // 8]`` in the blocked order of ``pack_block`` inputs (``unpack_codes`` gives the
    natural order back); scales: ``[N, K // group_size]`` (the weight's dtype for float16 and bfloat16
    weights, float32 for float32 ones), stored N-contiguous (a transposed view of a ``[K // group_size, N]``
    tensor, so that a tile's scales are one coalesced load); zeros: uint8 ``[N, K // group_size]`` in
    [0, 15], stored like the scales, or None when symmetric; shape: the original ``(N, K)``; dtype: the
    original weight dtype; pack_block: the packing block (128); scale_zero: for 16-bit scales, int32
    ``[K // group_size, N]`` holding each group's scale (bits 0–15) and ``2^e + z`` in the scale's dtype
    (bits 16–31: ``0x6400 | z`` for fp16, ``0x4300 | z`` for bf16, z = 8 when symmetric), so that the kernel
    reads both with one 4-byte load (which the pipeliner can issue as cp.async); ``scales`` and ``zeros``
    are then views into it; None for float32 scales. plans: the launch plans ``matmul`` made for this weight
    (``kernels.w4a16.plans``), by the kinds of call it served; a copy made with ``dataclasses.replace`` starts
    with none.
    """

    packed: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    group_size: int
    symmetric: bool
    shape: tuple[int, int]
    dtype: torch.dtype
    pack_block: int = 128
    scale_zero: torch.Tensor | None = None
    plans: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    def nbytes(self) -> int:
        """Bytes the kernel reads for the weight: codes, scales and zero points (the int32 ``scale_zero``
        words where there are, of which ``scales`` and ``zeros`` are views)."""
        if self.scale_zero is not None:
            return self.packed.numel() * 4 + self.scale_zero.numel() * 4
        parts = (self.packed, self.scales, self.zeros)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)


@dataclasses.dataclass(frozen=True, eq=False)
class W8Weight:
    """An int8 ``[N, K]`` weight with one scale per output channel: ``w ≈ qweight · scales[:, None]``.

    qweight: int8 ``[N, K]`` in [−127, 127]; scales: ``[N]`` (float16 for float16 weights, float32 otherwise);
    plans: ``matmul_w8``'s launch plans for this weight, as ``W4Weight.plans``.
    """

    qweight: torch.Tensor
    scales: torch.Tensor
    shape: tuple[int, int]
    dtype: torch.dtype
    plans: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    def nbytes(self) -> int:
        return self.qweight.numel() + self.scales.numel() * self.scales.element_size()


def _check_weight(w: torch.Tensor) -> None:
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {type(w).__name__}")
    if w.dim() != 2:
        raise ValueError(f"weight must be 2-D [out_features, in_features], got shape {tuple(w.shape)}")
    if w.dtype not in WEIGHT_DTYPES:
        raise TypeError(f"weight dtype {w.dtype} is not supported: use one of {list(WEIGHT_DTYPES)}")
    if not bool(torch.isfinite(w).all()):
        raise ValueError("weight has NaN or Inf entries: they cannot be quantised")


def _scale_dtype(dtype: torch.dtype) -> torch.dtype:
    """int4 scales: the weight's own 16-bit dtype (so that a kernel can dequantise in it exactly), else fp32."""
    return dtype if dtype in (torch.float16, torch.bfloat16) else torch.float32


def _w8_scale_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float16 if dtype == torch.float16 else torch.float32


def _safe_scale(scale: torch.Tensor, dtype: torch.dtype, round_up: bool = False) -> torch.Tensor:
    """Round to the stored dtype; an all-zero group (or one too small for the dtype) gets scale 1 or tiny.

    round_up: never below ``scale`` (the next representable value where rounding went down), so that a
    range divided into 15 steps of the stored scale still fits the 16 codes.
    """
    stored = scale.to(dtype)
    if round_up:
        low = stored.to(scale.dtype) < scale
        stored = torch.where(low, torch.nextafter(stored, torch.full_like(stored, float("inf"))), stored)
    tiny = torch.finfo(dtype).tiny
    stored = torch.where(stored == 0, torch.ones_like(stored), stored)
    return stored.clamp_min(tiny)


def quantize(w: torch.Tensor, group_size: int = 128, symmetric: bool = False) -> W4Weight:
    """Quantise ``w [N, K]`` to int4, one scale (and zero point) per ``group_size`` inputs of a row.

    Asymmetric (default): per group, the range ``[min(w, 0), max(w, 0)]`` (0 included, so that it is exact)
    is mapped onto the codes 0 … 15: ``s = (max − min) / 15``, ``z = round(−min / s)``,
    ``q = clamp(round(w / s) + z, 0, 15)``. Symmetric: ``s = max|w| / 7``, ``q = clamp(round(w / s), −7, 7)``
    stored as ``q + 8``. Codes are computed with the scale as stored (rounded to its dtype; upwards for the
    asymmetric format, so that the range still fits 15 steps), so the
    kernel's ``(q − z) · s`` is the rounding of ``w`` to the nearest grid point up to that rounding.

    Raises ``TypeError`` for a non-tensor or an unsupported dtype, ``ValueError`` for a weight that is not
    2-D, has non-finite entries, or whose in_features is not a multiple of the group size, or for a
    group size other than 32, 64 or 128.
    """
    _check_weight(w)
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {group_size}")
    n, k = w.shape
    if k % group_size != 0:
        raise ValueError(f"in_features {k} is not a multiple of the group size {group_size}")
    groups = w.detach().to(torch.float32).reshape(n, k // group_size, group_size)
    sdtype = _scale_dtype(w.dtype)
    # the scales from each group's range in float64: in float32 the span of a group with entries near
    # ±3.4e38 (finite float32 and bfloat16 values) overflows to an infinite scale, and 0 · inf = NaN
    if symmetric:
        scales = _safe_scale(groups.abs().amax(dim=-1).double() / 7.0, sdtype)
        q = torch.round(groups / scales.float()[..., None]).clamp(-7, 7) + 8
        z = torch.full_like(scales, 8.0, dtype=torch.float32)
        zeros = None
    else:
        lo = groups.amin(dim=-1).clamp_max(0.0).double()
        hi = groups.amax(dim=-1).clamp_min(0.0).double()
        scales = _safe_scale((hi - lo) / 15.0, sdtype, round_up=True)
        z = torch.round(-lo / scales.double()).clamp(0, 15).float()
        q = (torch.round(groups / scales.float()[..., None]) + z[..., None]).clamp(0, 15)
        zeros = z.to(torch.uint8)
    _check_grid(q, z, scales, w.dtype)
    codes = q.to(torch.int32).reshape(n, k)
    packed = pack_codes(codes)
    if sdtype == torch.float32:
        # scales and zero points N-contiguous: a [K // group, N] tensor, kept as its [N, K // group] view
        scales = scales.t().contiguous().t()
        zeros = zeros.t().contiguous().t() if zeros is not None else None
        return W4Weight(packed, scales, zeros, group_size, bool(symmetric), (n, k), w.dtype, PACK_BLOCK)
    # 16-bit scales: one int32 per (group, output), N-contiguous: bits 0-15 the scale, bits 16-31 the float
    # 2^e + z of the same dtype (0x6400 | z for fp16, 0x4300 | z for bf16; z = 8 when symmetric), so that
    # its byte 2 is z itself; scales and zeros are views into it
    z16 = zeros.to(torch.int32) if zeros is not None else torch.full_like(scales, 8, dtype=torch.int32)
    magic = 0x6400 if sdtype == torch.float16 else 0x4300
    bits = scales.view(torch.int16).to(torch.int32) & 0xFFFF
    sz = (bits | ((z16 | magic) << 16)).t().contiguous()  # [K // group, N]
    scales = sz.view(torch.int16)[:, 0::2].view(sdtype).t()
    zeros = sz.view(torch.uint8)[:, 2::4].t() if not symmetric else None
    return W4Weight(packed, scales, zeros, group_size, bool(symmetric), (n, k), w.dtype, PACK_BLOCK, sz)


def _check_grid(q: torch.Tensor, z: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> None:
    """Every dequantised value ``(q − z) · s`` must be finite in ``dtype`` (the kernels compute it in x's
    dtype, ``dequantize`` returns it in the weight's): with entries at the edge of the dtype's range the
    grid point above the largest entry (scales round up) can overflow. Checked per group from the codes'
    extremes, in float64."""
    s = scales.double()
    extreme = torch.maximum(((q.amax(dim=-1) - z).double() * s).abs(), ((q.amin(dim=-1) - z).double() * s).abs())
    limit = torch.finfo(dtype).max
    worst = float(extreme.max()) if extreme.numel() else 0.0
    if not worst <= limit:
        raise ValueError(
            f"weight has entries too close to the largest {dtype} ({limit:.4g}): its int4 grid reaches "
            f"{worst:.4g}, which overflows {dtype}; scale the weight down (by 2, say) before quantising"
        )


def block_split(k: int) -> tuple[int, int]:
    """(inputs in full ``PACK_BLOCK`` blocks, words per row of the shorter last block)."""
    main = k // PACK_BLOCK * PACK_BLOCK
    return main, (k - main) // 8


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """int32 ``[N, K // 8]`` blocked packing of 4-bit codes ``[N, K]`` (K a multiple of 32; module docstring).

    Within a full block of 128 inputs starting at ``k0`` (16 words per row), nibble i (bits 4i … 4i + 3) of
    word j holds input ``k0 + 16i + j``; the last block, of ``t`` = 32, 64 or 96 inputs when K is not a
    multiple of 128, has ``t / 8`` words and nibble i of its word j holds input ``k0 + i·t/8 + j``.
    """
    n, k = codes.shape
    if k % 32:
        raise ValueError(f"in_features {k} is not a multiple of 32")
    main, tail = block_split(k)
    codes = codes.to(torch.int64)
    blocks = codes[:, :main].reshape(n, main // PACK_BLOCK, 8, 16).transpose(2, 3)  # [n, block, j, i]
    parts = [blocks.reshape(n, main // 8, 8)]
    if tail:
        parts.append(codes[:, main:].reshape(n, 8, tail).transpose(1, 2))  # [n, j, i]
    nibbles = torch.cat(parts, dim=1)
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=codes.device)
    # bit 31 may be set, which int32 holds as a negative number
    packed = (nibbles << shifts).sum(dim=-1)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return packed.contiguous()


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """The 4-bit codes of an int32 ``[N, K // 8]`` packing (``pack_codes``), as int32 ``[N, K]`` in [0, 15],
    in natural input order (the block layout is undone: K follows from the width alone)."""
    n, words = packed.shape
    main, tail = block_split(8 * words)
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    nibbles = (packed[..., None] >> shifts) & 0xF  # [n, word, i]
    parts = [nibbles[:, : main // 8].reshape(n, main // PACK_BLOCK, 16, 8).transpose(2, 3).reshape(n, main)]
    if tail:
        parts.append(nibbles[:, main // 8 :].transpose(1, 2).reshape(n, 8 * tail))
    return torch.cat(parts, dim=1)


def dequantize(weight: W4Weight, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``[N, K]`` ``(q − z) · s`` in ``dtype`` (default: the original weight's), computed in float32
    (float64 when asked for float64: exact). On a GPU, in the scales' own 16-bit dtype, one Triton kernel
    (``unpack_to_memory``: the same bits, at memory speed), so that the unfused baseline
    (dequantise-to-memory, then a GEMM) is what a serving stack would run."""
    if not isinstance(weight, W4Weight):
        raise TypeError(f"expected a W4Weight from quantize(), got {type(weight).__name__}")
    dtype = weight.dtype if dtype is None else dtype
    if weight.packed.is_cuda and not INTERPRET and weight.scale_zero is not None and weight.scales.dtype == dtype:
        return unpack_to_memory(weight)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    n, k = weight.shape
    g = weight.group_size
    codes = unpack_codes(weight.packed).to(work).reshape(n, k // g, g)
    zeros = 8.0 if weight.symmetric else weight.zeros.to(work)[..., None]
    return ((codes - zeros) * weight.scales.to(work)[..., None]).reshape(n, k).to(dtype)


def unpack_to_memory(weight: W4Weight) -> torch.Tensor:
    """``[N, K]`` ``(q − z) · s`` in the scales' 16-bit dtype, written by one Triton kernel (what ``dequantize``
    runs on a GPU; callable on the CPU through the interpreter for tests): the bits of ``dequantize``."""
    if weight.scale_zero is None:
        raise ValueError("unpack_to_memory needs 16-bit scales (a float16 or bfloat16 weight)")
    n, k = weight.shape
    out = torch.empty((n, k), device=weight.packed.device, dtype=weight.scales.dtype)
    k_main, tail_words = block_split(k)
    block_n = 64
    sz = weight.scale_zero
    use_asm = not INTERPRET and compute_capability(weight.packed.device) >= (9, 0)
    grid = (triton.cdiv(n, block_n), triton.cdiv(k, PACK_BLOCK), 1)
    with device_guard(weight.packed):
        _UNPACK.launch(
            grid,
            (weight.packed, sz, out, n, k_main, *weight.packed.stride(), *sz.stride(), out.stride(0)),
            dict(
                GROUP=weight.group_size,
                TAIL_WORDS=tail_words,
                MAGIC=0x6400 if out.dtype == torch.float16 else 0x4300,
                USE_ASM=use_asm,
                BLOCK_N=block_n,
            ),
            4,
            1,
        )
    return out


def quantize_w8(w: torch.Tensor) -> W8Weight:
    """Quantise ``w [N, K]`` to int8 with one symmetric scale per output row: ``s = max|w| / 127``."""
    _check_weight(w)
    wf = w.detach().to(torch.float32)
    scales = _safe_scale(wf.abs().amax(dim=1) / 127.0, _w8_scale_dtype(w.dtype))
    q = torch.round(wf / scales.float()[:, None]).clamp(-127, 127).to(torch.int8)
    return W8Weight(q.contiguous(), scales.contiguous(), tuple(w.shape), w.dtype)


def dequantize_w8(weight: W8Weight, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``[N, K]`` ``q · s`` in ``dtype`` (default: the original weight's)."""
    if not isinstance(weight, W8Weight):
        raise TypeError(f"expected a W8Weight from quantize_w8(), got {type(weight).__name__}")
    dtype = weight.dtype if dtype is None else dtype
    work = torch.float64 if dtype == torch.float64 else torch.float32
    return (weight.qweight.to(work) * weight.scales.to(work)[:, None]).to(dtype)
