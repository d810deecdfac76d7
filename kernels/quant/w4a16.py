"""W4A16 and W8A16 linear layers in Triton: weights quantised offline, dequantised in registers.

What it is: ``y = x @ dequant(W)ᵀ (+ bias)`` for an ``nn.Linear``-style weight ``W [N, K]``
(out_features × in_features) and 16-bit activations ``x [..., K]``. The weight is stored either as int4,
group-wise along K (``quantize``: one scale, and for the asymmetric format one zero point, per ``group_size``
consecutive inputs of an output row), or as int8 with one scale per output channel (``quantize_w8``). The
kernel loads the packed integers, unpacks them with shifts and masks, subtracts the zero point, multiplies by
the scale and feeds the result to ``tl.dot`` with an fp32 accumulator: the 16-bit weight only ever exists
as a register tile, never in memory. That is the point of the format: a decode step (M of a few tokens)
is bound by reading the weights, and int4 reads ¼ of the fp16 bytes (plus the scales and zero points:
4 bytes per group, 1/32 of a byte per weight at group 128).

Packed int4 layout (``W4Weight.packed``, int32 ``[N, K // 8]``, row-major), in blocks of ``PACK_BLOCK`` =
128 inputs: within the block starting at input ``k0`` (16 words per row), nibble i (bits ``4i … 4i + 3``) of
word j holds input ``k0 + 16i + j``. When K is not a multiple of 128 the last block, of t = 32, 64 or 96
inputs (K is a multiple of the group size, ≥ 32), has t/8 words per row and nibble i of its word j holds
input ``k0 + i·t/8 + j``; the width alone fixes the layout, so ``unpack_codes`` returns the natural order.
Codes are unsigned 4-bit ``q``. Asymmetric: ``w ≈ (q − z) · s`` with ``q, z ∈ [0, 15]``. Symmetric: the code
is the signed value plus 8 (``q − 8 ∈ [−8, 7]``, the quantiser uses ±7), so ``w ≈ (q − 8) · s``. Why: nibble
i of a ``[BLOCK_N, 16]`` word tile is the contiguous K range ``k0 + 16i … k0 + 16i + 15`` of those rows,
so the kernel runs 8 products of K = 16 per block against 16-column slices of x loaded straight from memory:
no reshape of unpacked nibbles (the previous natural-order packing needed a ``[K/8, 8, N] → [K, N]``
reshape, which compiled to layout conversions through shared memory). Scales (and zero points) are stored
N-contiguous, and for 16-bit weights as one int32 per (group, output) holding the scale and ``2^e + z`` in
the scale's dtype (``W4Weight.scale_zero``; ``scales``/``zeros`` are views of it): one 4-byte load per
group that Triton's pipeliner issues as cp.async like the words (2-byte scale loads stayed synchronous).

Dequantisation: when the scales have x's dtype (fp16 weights with fp16 x, bf16 with bf16), in that dtype,
without an int-to-float conversion: ``MAGIC | q`` is the bits of ``2^e + q`` (1024 + q in fp16, 128 + q in
bf16), minus the stored ``2^e + z`` is ``q − z`` exactly, times ``s`` is the single rounding that
``dequantize(weight, x.dtype)`` makes: the same bits. Otherwise in fp32 and rounded once to x's dtype; fp32
activations keep an exact IEEE (not TF32) mode.

Kernel shape: grid (M tiles, N tiles, K slices). ``swap_ab`` computes ``outᵀ = W · xᵀ`` so that the
dequantised weight is the MMA's A operand, the one Hopper's wgmma takes from registers (and x is the
N side, ≥ 16 wide: a decode step's 1…16 rows pad to wgmma m64n16k16 instead of a 64-row tile of x). With
split-K, each program writes its fp32 partial sum to a ``[SPLIT_K, M, N]`` buffer and a second small kernel
adds the slices in a fixed order, adds the bias and casts: deterministic, no atomics. Without, bias and cast
are fused into the epilogue. int8 per-channel weights (``quantize_w8``) use a separate, plain tiled kernel.

Handles: any M (including 0) and leading dimensions, any N (masked tails), K a multiple of the group size
(int4) or any K (int8), float16 and bfloat16 activations on the GPU, float32 activations as an exact
testing mode. Does not handle: activation quantisation, act-order (GPTQ's permuted groups), a backward pass.

Tested: in Triton's interpreter on CPU (float16, float32; odd shapes, tails, every split and operand order:
tests/kernels/test_w4a16.py; Triton 3.6's interpreter computes bfloat16 wrongly, so the bf16 paths are
checked only on a GPU). Compiled (not run) for sm_90 with Triton 3.6 at N = 14336, K = 4096, bf16, group 128
(ptxas -v, SASS loops inspected): the default decode config (M ≤ 16: 16 × 64 × 256, split 3, 4 warps,
4 stages, swapped) builds to ``wgmma m64n16k16`` with the weight from registers, 58 KiB of shared memory,
53 registers, no spills, and no layout conversion inside the K loop (words, x slices and scale words all
arrive by cp.async); the default GEMM config (M > 64: 128 × 256 × 128, 8 warps, 3 stages, swapped) builds to
``wgmma m64n128k16`` with the weight from registers, 130 KiB, 236 registers, no spills. Measured on an
H200 before this layout (natural-order packing, fp32 dequantisation): 84 µs at M = 1 for 14336 × 4096
(≈ 10 % of copy bandwidth) and 2.31 ms at M = 4096 (4× slower than cuBLAS). The new kernels have not been
run on a GPU yet: the configurations (``W4_GPU_TABLE``) are reasoned, not tuned.

Layers, top to bottom: the ``@triton.jit`` kernels and helpers; the weight formats and quantisers;
configuration (dataclass, tables by M, heuristic); the launchers; the public functions ``matmul`` and
``matmul_w8``.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
import triton
import triton.language as tl

from kernels._runtime import INTERPRET, check_device, multiprocessor_count

__all__ = [
    "W4Weight",
    "W8Weight",
    "W4A16Config",
    "quantize",
    "dequantize",
    "pack_codes",
    "unpack_codes",
    "quantize_w8",
    "dequantize_w8",
    "matmul",
    "matmul_w8",
    "choose_config",
    "GROUP_SIZES",
    "SMALL_M",
]

GROUP_SIZES = (32, 64, 128)
SMALL_M = 16  # at most this many rows of x take the split-K path
PACK_BLOCK = 128  # inputs per packing block of the int4 format (module docstring)
WEIGHT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ACTIVATION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ---------------------------------------------------------------------------------------------------
# Triton kernels
# ---------------------------------------------------------------------------------------------------


@triton.jit
def _w4_dequant(words, shift, s, z, MAGIC: tl.constexpr, SYMMETRIC: tl.constexpr, DEQ: tl.constexpr, dtype):
    """``(q − z) · s`` of nibble ``shift // 4`` of every word, in the operand dtype ``dtype``.

    DEQ 0 (the scales are in ``dtype``, fp16 or bf16): the code is made a 16-bit float without a conversion
    instruction, ``MAGIC | q`` being the bits of ``2^e + q`` (1024 + q in fp16, 128 + q in bf16; both exact),
    so ``(MAGIC | q) − (MAGIC | z)`` is ``q − z`` exactly and the product with ``s`` is the one rounding
    that ``dequantize(weight, dtype)`` makes. DEQ 1: in fp32, then rounded to ``dtype`` (other scale
    dtypes: the same single rounding). DEQ 2: fp32 (the exact fp32 mode).
    """
    q = (words >> shift) & 0xF
    if DEQ == 0:  # z is already 2^e + z in dtype (from scale_zero)
        qf = (q | MAGIC).to(tl.int16).to(dtype, bitcast=True)
        return (qf - z) * s
    else:
        qf = q.to(tl.float32)
        if SYMMETRIC:
            w = (qf - 8.0) * s.to(tl.float32)
        else:
            w = (qf - z.to(tl.float32)) * s.to(tl.float32)
        return w.to(dtype)


@triton.jit
def _w4_mma(acc, w, x, SWAP_AB: tl.constexpr, DEQ: tl.constexpr):
    if SWAP_AB:
        a = w
        b = x
    else:
        a = x
        b = w
    if DEQ == 2:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _w4a16_kernel(
    X,  # (M, K) activations
    W,  # (N, K // 8) int32, the blocked packing (module docstring)
    S,  # (N, K // GROUP) scales (any strides; quantize() stores them N-contiguous)
    Z,  # (N, K // GROUP) uint8 zero points, or None (symmetric: the zero is 8)
    Bias,  # (N,) or None
    Out,  # SPLIT_K == 1: (M, N) in X's dtype; else (SPLIT_K, M, N) float32 partial sums
    M,
    N,
    K,
    k_main,  # K rounded down to a multiple of 128: the full packing blocks
    blocks_per_split,  # 128-input blocks per K slice, a multiple of BLOCK_K // 128
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wc,
    stride_sn,
    stride_sg,
    stride_zn,
    stride_zg,
    stride_os,
    stride_om,
    stride_on,
    GROUP: tl.constexpr,
    SYMMETRIC: tl.constexpr,
    TAIL_WORDS: tl.constexpr,  # (K − k_main) / 8: 0, 4, 8 or 12
    SPLIT_K: tl.constexpr,
    DEQ: tl.constexpr,  # see _w4_dequant
    MAGIC: tl.constexpr,  # 0x6400 (fp16) or 0x4300 (bf16), for DEQ 0
    SWAP_AB: tl.constexpr,  # compute outᵀ = W · xᵀ (the weight as the MMA's A operand) instead of x · Wᵀ
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,  # a multiple of 128: packing blocks per loop step
):
    """One (M, N) tile over one K slice. Per 128-input block a program loads one ``[BLOCK_N, 16]`` word tile
    and runs 8 products of K = 16: nibble i of the words is inputs ``k0 + 16i … k0 + 16i + 15`` (no reshape),
    multiplied with the matching 16 columns of x, loaded straight from memory."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, 16)
    m_mask = offs_m < M
    n_mask = offs_n < N
    if DEQ == 2:
        dtype = tl.float32
    else:
        dtype = X.dtype.element_ty
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        # words (BLOCK_N, 16), x slices (16, BLOCK_M)
        w_ptrs = W + offs_n[:, None] * stride_wn + offs_c[None, :] * stride_wc
        w_mask = n_mask[:, None]
        x_ptrs = X + offs_m[None, :] * stride_xm + offs_c[:, None] * stride_xk
        x_mask = m_mask[None, :]
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        # words (16, BLOCK_N), x slices (BLOCK_M, 16)
        w_ptrs = W + offs_n[None, :] * stride_wn + offs_c[:, None] * stride_wc
        w_mask = n_mask[None, :]
        x_ptrs = X + offs_m[:, None] * stride_xm + offs_c[None, :] * stride_xk
        x_mask = m_mask[:, None]
    s_ptrs = S + offs_n * stride_sn
    z_ptrs = s_ptrs  # unused when SYMMETRIC or DEQ == 0 (Z is None)
    if not SYMMETRIC and DEQ != 0:
        z_ptrs = Z + offs_n * stride_zn
    k_start = pid_k * blocks_per_split * 128
    k_stop = tl.minimum(k_main, k_start + blocks_per_split * 128)
    for k0 in range(k_start, k_stop, BLOCK_K):
        for b in tl.static_range(BLOCK_K // 128):
            kb = k0 + b * 128
            if BLOCK_K > 128:  # the last step of a slice may be partial: its missing blocks read as zeros
                b_ok = kb < k_stop
                wb_mask = w_mask & b_ok
                xb_mask = x_mask & b_ok
                nb_mask = n_mask & b_ok
            else:
                wb_mask = w_mask
                xb_mask = x_mask
                nb_mask = n_mask
            words = tl.load(w_ptrs + (kb // 8) * stride_wc, mask=wb_mask, other=0)
            for i in tl.static_range(8):
                if (16 * i) % GROUP == 0:  # a new group starts with this slice: its scale and zero point
                    g = kb // GROUP + (16 * i) // GROUP
                    if DEQ == 0:  # S is the int32 scale_zero: scale bits low, 2^e + z bits high
                        sz = tl.load(s_ptrs + g * stride_sg, mask=nb_mask, other=0)
                        s = sz.to(tl.int16).to(dtype, bitcast=True)
                        z = (sz >> 16).to(tl.int16).to(dtype, bitcast=True)
                    else:
                        s = tl.load(s_ptrs + g * stride_sg, mask=nb_mask, other=0.0)
                        z = s  # unused when SYMMETRIC
                        if not SYMMETRIC:
                            z = tl.load(z_ptrs + g * stride_zg, mask=nb_mask, other=0)
                if SWAP_AB:
                    w = _w4_dequant(words, 4 * i, s[:, None], z[:, None], MAGIC, SYMMETRIC, DEQ, dtype)
                else:
                    w = _w4_dequant(words, 4 * i, s[None, :], z[None, :], MAGIC, SYMMETRIC, DEQ, dtype)
                x = tl.load(x_ptrs + (kb + 16 * i) * stride_xk, mask=xb_mask, other=0.0)
                acc = _w4_mma(acc, w, x, SWAP_AB, DEQ)
    if TAIL_WORDS > 0:
        if pid_k == SPLIT_K - 1:
            # the last, shorter block (K − k_main inputs, packed with TAIL_WORDS words per row): nibble i of
            # word c is input k_main + i·TAIL_WORDS + c; groups may change inside a slice (12-word tails)
            c_ok = offs_c < TAIL_WORDS
            if SWAP_AB:
                t_mask = w_mask & c_ok[None, :]
                tx_mask = x_mask & c_ok[:, None]
                col = offs_c[None, :]
                sn = offs_n[:, None]
            else:
                t_mask = w_mask & c_ok[:, None]
                tx_mask = x_mask & c_ok[None, :]
                col = offs_c[:, None]
                sn = offs_n[None, :]
            words = tl.load(w_ptrs + (k_main // 8) * stride_wc, mask=t_mask, other=0)
            for i in tl.static_range(8):
                g = (k_main + i * TAIL_WORDS + col) // GROUP
                if DEQ == 0:
                    sz = tl.load(S + sn * stride_sn + g * stride_sg, mask=t_mask, other=0)
                    s = sz.to(tl.int16).to(dtype, bitcast=True)
                    z = (sz >> 16).to(tl.int16).to(dtype, bitcast=True)
                else:
                    s = tl.load(S + sn * stride_sn + g * stride_sg, mask=t_mask, other=0.0)
                    z = s
                    if not SYMMETRIC:
                        z = tl.load(Z + sn * stride_zn + g * stride_zg, mask=t_mask, other=0)
                w = _w4_dequant(words, 4 * i, s, z, MAGIC, SYMMETRIC, DEQ, dtype)
                x = tl.load(x_ptrs + (k_main + i * TAIL_WORDS) * stride_xk, mask=tx_mask, other=0.0)
                acc = _w4_mma(acc, w, x, SWAP_AB, DEQ)
    out = Out + pid_k * stride_os if SPLIT_K > 1 else Out
    if SWAP_AB:
        if SPLIT_K == 1 and Bias is not None:
            acc += tl.load(Bias + offs_n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
        ptrs = out + offs_m[None, :] * stride_om + offs_n[:, None] * stride_on
        tl.store(ptrs, acc.to(out.dtype.element_ty), mask=m_mask[None, :] & n_mask[:, None])
    else:
        if SPLIT_K == 1 and Bias is not None:
            acc += tl.load(Bias + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        _store_rows(out, acc, offs_m, offs_n, m_mask, n_mask, stride_om, stride_on)


@triton.jit
def _int8_weight_tile(W, offs_n, offs_k, n_mask, k_mask, stride_wn, stride_wk):
    """The int8 codes of a tile ``[BLOCK_K, BLOCK_N]`` as fp32; the per-channel scale comes after the dot."""
    mask = k_mask[:, None] & n_mask[None, :]
    return tl.load(W + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk, mask=mask, other=0).to(tl.float32)


@triton.jit
def _store_rows(Out, acc, offs_m, offs_n, m_mask, n_mask, stride_om, stride_on):
    ptrs = Out + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(ptrs, acc.to(Out.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _w8a16_matmul_kernel(
    X,  # (M, K) activations
    W,  # (N, K) int8
    S,  # (N,) scales
    Bias,  # (N,) or None
    Out,  # SPLIT_K == 1: (M, N) in X's dtype; else (SPLIT_K, M, N) float32 partial sums
    M,
    N,
    k_per_split,  # a multiple of BLOCK_K
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_sn,
    stride_os,
    stride_om,
    stride_on,
    SPLIT_K: tl.constexpr,
    IS_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    k_start = pid_k * k_per_split
    k_stop = tl.minimum(K, k_start + k_per_split)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_stop, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < k_stop
        x = tl.load(
            X + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
            mask=m_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        w = _int8_weight_tile(W, offs_n, offs_k, n_mask, k_mask, stride_wn, stride_wk)
        # the weight is rounded to the activations' dtype, as a dequantise-then-GEMM would round it
        if IS_FP32:
            acc = tl.dot(x, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w.to(x.dtype), acc)
    # per output channel: the scale factors out of the sum over K (and out of the sum over slices)
    acc *= tl.load(S + offs_n * stride_sn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    if SPLIT_K == 1:
        if Bias is not None:
            acc += tl.load(Bias + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        _store_rows(Out, acc, offs_m, offs_n, m_mask, n_mask, stride_om, stride_on)
    else:
        _store_rows(Out + pid_k * stride_os, acc, offs_m, offs_n, m_mask, n_mask, stride_om, stride_on)


@triton.jit
def _splitk_reduce_kernel(
    Partial,  # (SPLIT_K, M, N) float32
    Bias,  # (N,) or None
    Out,  # (M, N)
    M,
    N,
    stride_ps,
    stride_pm,
    stride_pn,
    stride_om,
    stride_on,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Sum the K slices in a fixed order (slice 0 first): the same bits on every run."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    mask = m_mask[:, None] & n_mask[None, :]
    ptrs = Partial + offs_m[:, None] * stride_pm + offs_n[None, :] * stride_pn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ptrs + s * stride_ps, mask=mask, other=0.0)
    if Bias is not None:
        acc += tl.load(Bias + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    _store_rows(Out, acc, offs_m, offs_n, m_mask, n_mask, stride_om, stride_on)


# ---------------------------------------------------------------------------------------------------
# Weight formats and quantisers
# ---------------------------------------------------------------------------------------------------


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
    are then views into it; None for float32 scales.
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

    qweight: int8 ``[N, K]`` in [−127, 127]; scales: ``[N]`` (float16 for float16 weights, float32 otherwise).
    """

    qweight: torch.Tensor
    scales: torch.Tensor
    shape: tuple[int, int]
    dtype: torch.dtype

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
    if symmetric:
        scales = _safe_scale(groups.abs().amax(dim=-1) / 7.0, sdtype)
        q = torch.round(groups / scales.float()[..., None]).clamp(-7, 7) + 8
        zeros = None
    else:
        lo = groups.amin(dim=-1).clamp_max(0.0)
        hi = groups.amax(dim=-1).clamp_min(0.0)
        scales = _safe_scale((hi - lo) / 15.0, sdtype, round_up=True)
        z = torch.round(-lo / scales.float()).clamp(0, 15)
        q = (torch.round(groups / scales.float()[..., None]) + z[..., None]).clamp(0, 15)
        zeros = z.to(torch.uint8)
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


def _block_split(k: int) -> tuple[int, int]:
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
    main, tail = _block_split(k)
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
    main, tail = _block_split(8 * words)
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    nibbles = (packed[..., None] >> shifts) & 0xF  # [n, word, i]
    parts = [nibbles[:, : main // 8].reshape(n, main // PACK_BLOCK, 16, 8).transpose(2, 3).reshape(n, main)]
    if tail:
        parts.append(nibbles[:, main // 8 :].transpose(1, 2).reshape(n, 8 * tail))
    return torch.cat(parts, dim=1)


def dequantize(weight: W4Weight, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``[N, K]`` ``(q − z) · s`` in ``dtype`` (default: the original weight's), computed in float32
    (float64 when asked for float64: exact)."""
    if not isinstance(weight, W4Weight):
        raise TypeError(f"expected a W4Weight from quantize(), got {type(weight).__name__}")
    dtype = weight.dtype if dtype is None else dtype
    work = torch.float64 if dtype == torch.float64 else torch.float32
    n, k = weight.shape
    g = weight.group_size
    codes = unpack_codes(weight.packed).to(work).reshape(n, k // g, g)
    zeros = 8.0 if weight.symmetric else weight.zeros.to(work)[..., None]
    return ((codes - zeros) * weight.scales.to(work)[..., None]).reshape(n, k).to(dtype)


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


# ---------------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class W4A16Config:
    """One launch: tile sizes, the number of K slices (1: no split-K), warps and pipeline depth.

    swap_ab (int4 only): compute ``outᵀ = W · xᵀ``, the dequantised weight being the MMA's first operand
    (the one Hopper's wgmma, and mma.sync, take from registers) and the rows of x its N dimension.
    For int4, block_k is a multiple of 128 (whole packing blocks per loop step).
    """

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    swap_ab: bool = False


_H100_SMS = 132  # H100/H200 SXM; the device's own count is used when there is one

# The GPU defaults for int4, by M: (largest M, block_m, block_n, block_k, num_warps, num_stages, swap_ab,
# waves). waves > 0: split K so that the grid has about waves × SMs programs (each slice keeps at least
# two 128-input blocks); 0: no split. Reasoned, not yet measured (see choose_config): update from the probe.
W4_GPU_TABLE: tuple[tuple[int, int, int, int, int, int, bool, int], ...] = (
    (16, 16, 64, 256, 4, 4, True, 4),
    (64, 64, 128, 128, 4, 3, True, 2),
    (2**62, 128, 256, 128, 8, 3, True, 0),
)
W8_GPU_TABLE: tuple[tuple[int, int, int, int, int, int, bool, int], ...] = (
    (16, 16, 64, 128, 4, 4, False, 2),
    (2**62, 128, 128, 64, 8, 3, False, 0),
)


def _split_for(tiles: int, k_units: int, waves: int, min_units: int, sm_count: int) -> int:
    if waves <= 0:
        return 1
    return max(1, min(max(1, k_units // min_units), triton.cdiv(waves * sm_count, tiles)))


def choose_config(
    m: int, n: int, k: int, *, sm_count: int = _H100_SMS, interpret: bool = INTERPRET, bits: int = 4
) -> W4A16Config:
    """The launch for an ``[m, k] @ [k, n]`` product: deterministic, so tests can pin what runs.

    On a GPU, the row of ``W4_GPU_TABLE`` (``W8_GPU_TABLE`` for ``bits=8``) for the smallest M bound
    ≥ m, with the split count worked out from the grid. Reasoned for Hopper, not measured:
    - M ≤ 16 (decode, bound by reading the weights): swapped, the weight as the register A operand of
      wgmma m64n16k16 (x's ≤ 16 rows padded to the 16-wide N side), 64 output channels × 256 inputs
      per step (8 KiB of int4 words per stage, the x slices are a few KiB and L2-resident), 4 stages, and
      split-K to about 4 programs per SM, so that many loads are in flight on every SM.
    - 16 < M ≤ 64: the same swapped form with 64-row tiles of x, 2 waves.
    - M > 64: 256 output channels × 128 rows of x per tile, swapped (wgmma m64n128k16 with the dequantised
      weight as the register operand, xᵀ from shared memory: the weight tile is never written to shared
      memory), 8 warps, 3 stages.
    In the interpreter: small tiles, so that the CPU run stays short while still crossing several tiles.
    """
    if interpret:
        block_k = 128 if bits == 4 else 32
        if m <= SMALL_M:
            split = max(1, min(4, k // block_k))
            return W4A16Config(16, 32, block_k, split, 4, 1, bits == 4)
        return W4A16Config(32, 32, block_k, 1, 4, 1)
    table = W4_GPU_TABLE if bits == 4 else W8_GPU_TABLE
    max_m, bm, bn, bk, nw, ns, swap, waves = next(row for row in table if m <= row[0])
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    split = _split_for(tiles, k // bk, waves, 2 if bits == 4 and bk == 128 else 1, sm_count)
    return W4A16Config(bm, bn, bk, split, nw, ns, swap)


# ---------------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------------


def _check_activations(x: torch.Tensor, shape: tuple[int, int], bias: torch.Tensor | None, tensors, names) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in ACTIVATION_DTYPES:
        raise TypeError(f"x dtype {x.dtype} is not supported: use one of {list(ACTIVATION_DTYPES)}")
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension, [..., in_features]")
    n, k = shape
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} input features, the weight expects {k}")
    if bias is not None:
        if bias.shape != (n,):
            raise ValueError(f"bias must have shape ({n},), got {tuple(bias.shape)}")
        tensors, names = (*tensors, bias), (*names, "bias")
    check_device(x, *tensors, names=("x", *names))


def _check_config(cfg: W4A16Config, bits: int) -> None:
    # tl.dot needs power-of-two tiles of at least 16
    for name in ("block_m", "block_n", "block_k"):
        value = getattr(cfg, name)
        if value < 16 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two ≥ 16, got {value} in {cfg}")
    if bits == 4 and cfg.block_k % PACK_BLOCK:
        raise ValueError(f"block_k must be a multiple of the packing block {PACK_BLOCK} for int4, got {cfg}")
    if cfg.split_k < 1 or cfg.num_warps < 1 or cfg.num_stages < 1:
        raise ValueError(f"split_k, num_warps and num_stages must be ≥ 1, got {cfg}")


def _prepare(x, bias, n, k):
    """(x as [M, K], output [M, N], leading dims), or the finished output when there is nothing to multiply."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    if m == 0 or n == 0:
        return None, out.reshape(*lead, n), lead
    if k == 0:
        out.zero_()
        if bias is not None:
            out += bias.to(out.dtype)
        return None, out.reshape(*lead, n), lead
    return x2, out, lead


def _reduce(target, bias, out, split):
    m, n = out.shape
    block_m, block_n = 16, 64
    _splitk_reduce_kernel[(triton.cdiv(m, block_m), triton.cdiv(n, block_n))](
        target, bias, out, m, n, *target.stride(), *out.stride(),
        SPLIT_K=split, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=4,
    )  # fmt: skip


def _device_context(x):
    return torch.cuda.device(x.device) if x.device.type == "cuda" else contextlib.nullcontext()


def _launch_w4(x, weight: W4Weight, bias, config: W4A16Config | None) -> torch.Tensor:
    n, k = weight.shape
    x2, out, lead = _prepare(x, bias, n, k)
    if x2 is None:
        return out
    m = x2.shape[0]
    cfg = config or choose_config(m, n, k, sm_count=multiprocessor_count(x.device, _H100_SMS))
    _check_config(cfg, 4)
    k_main, tail_words = _block_split(k)
    # slices are whole loop steps of block_k inputs (the kernel masks the blocks of a last, partial step)
    per_step = cfg.block_k // PACK_BLOCK
    blocks = k_main // PACK_BLOCK
    steps = triton.cdiv(blocks, per_step)
    blocks_per_split = triton.cdiv(steps, min(cfg.split_k, max(steps, 1))) * per_step
    split = max(1, triton.cdiv(blocks, blocks_per_split)) if blocks else 1
    target = out if split == 1 else torch.empty((split, m, n), device=x.device, dtype=torch.float32)
    stride_os = target.stride(0) if split > 1 else 0
    if x.dtype == torch.float32:
        deq = 2
    elif weight.scale_zero is not None and weight.scales.dtype == x.dtype:
        deq = 0
    else:
        deq = 1
    magic = 0x6400 if x.dtype == torch.float16 else 0x4300
    if deq == 0:  # the combined int32 words, [K // group, N]
        s, z = weight.scale_zero.t(), None
    else:
        s, z = weight.scales, weight.zeros
    stride_zn, stride_zg = z.stride() if z is not None else (0, 0)
    block_m, block_n = cfg.block_m, cfg.block_n
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), split)
    with _device_context(x):
        _w4a16_kernel[grid](
            x2, weight.packed, s, z, bias if split == 1 else None, target, m, n, k, k_main, blocks_per_split,
            x2.stride(0), x2.stride(1), *weight.packed.stride(), *s.stride(), stride_zn, stride_zg,
            stride_os, target.stride(-2), target.stride(-1),
            GROUP=weight.group_size, SYMMETRIC=weight.symmetric, TAIL_WORDS=tail_words, SPLIT_K=split, DEQ=deq,
            MAGIC=magic, SWAP_AB=cfg.swap_ab, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=cfg.block_k,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
        if split > 1:
            _reduce(target, bias, out, split)
    return out.reshape(*lead, n)


def _launch_w8(x, weight: W8Weight, bias, config: W4A16Config | None) -> torch.Tensor:
    n, k = weight.shape
    x2, out, lead = _prepare(x, bias, n, k)
    if x2 is None:
        return out
    m = x2.shape[0]
    cfg = config or choose_config(m, n, k, sm_count=multiprocessor_count(x.device, _H100_SMS), bits=8)
    _check_config(cfg, 8)
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    split = triton.cdiv(k, k_per_split)  # no empty slice
    target = out if split == 1 else torch.empty((split, m, n), device=x.device, dtype=torch.float32)
    stride_os = target.stride(0) if split > 1 else 0
    w, scales = weight.qweight, weight.scales
    grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n), split)
    with _device_context(x):
        _w8a16_matmul_kernel[grid](
            x2, w, scales, bias if split == 1 else None, target, m, n, k_per_split, k,
            x2.stride(0), x2.stride(1), w.stride(0), w.stride(1), scales.stride(0),
            stride_os, target.stride(-2), target.stride(-1),
            SPLIT_K=split, IS_FP32=x.dtype == torch.float32,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
        if split > 1:
            _reduce(target, bias, out, split)
    return out.reshape(*lead, n)


# ---------------------------------------------------------------------------------------------------
# Public functions
# ---------------------------------------------------------------------------------------------------


def matmul(
    x: torch.Tensor, weight: W4Weight, bias: torch.Tensor | None = None, *, config: W4A16Config | None = None
) -> torch.Tensor:
    """``x @ dequantize(weight).T (+ bias)`` with the int4 weight dequantised in registers.

    Args:
        x: ``[..., K]`` float16 or bfloat16 (float32: exact IEEE mode, for tests); any leading dims, any M.
        weight: a ``W4Weight`` from ``quantize`` of an ``[N, K]`` weight, on x's device.
        bias: ``[N]`` or None; added in fp32 before the output is rounded.
        config: pin a launch (``choose_config`` otherwise); ``split_k > 1`` takes the split-K path.

    Returns: ``[..., N]`` in x's dtype. The dequantised weight is rounded to x's dtype before the product
    (fp32 accumulation), as ``x @ dequantize(weight, x.dtype).T`` would.
    Raises ``TypeError``/``ValueError`` for unsupported dtypes, devices or shapes.
    """
    if not isinstance(weight, W4Weight):
        raise TypeError(f"weight must be a W4Weight from quantize(), got {type(weight).__name__}")
    tensors = (weight.packed, weight.scales) + ((weight.zeros,) if weight.zeros is not None else ())
    _check_activations(x, weight.shape, bias, tensors, ("packed", "scales", "zeros")[: len(tensors)])
    return _launch_w4(x, weight, bias, config)


def matmul_w8(
    x: torch.Tensor, weight: W8Weight, bias: torch.Tensor | None = None, *, config: W4A16Config | None = None
) -> torch.Tensor:
    """``x @ dequantize_w8(weight).T (+ bias)``: the int8 per-channel twin of ``matmul`` (same kernel).

    The codes are exact in 16 bits, so the product is of the codes and the per-channel scale is applied
    to the fp32 sum; arguments and returns as ``matmul``.
    """
    if not isinstance(weight, W8Weight):
        raise TypeError(f"weight must be a W8Weight from quantize_w8(), got {type(weight).__name__}")
    _check_activations(x, weight.shape, bias, (weight.qweight, weight.scales), ("qweight", "scales"))
    return _launch_w8(x, weight, bias, config)
