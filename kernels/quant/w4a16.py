"""W4A16 and W8A16 linear layers in Triton: weights quantised offline, dequantised in registers.

What it is: ``y = x @ dequant(W)ᵀ (+ bias)`` for an ``nn.Linear``-style weight ``W [N, K]`` (out_features ×
in_features) and 16-bit activations ``x [..., K]``. The weight is stored either as int4, group-wise along K
(``quantize``: one scale, and for the asymmetric format one zero point, per ``group_size`` consecutive
inputs of an output row), or as int8 with one scale per output channel (``quantize_w8``). The kernel loads
the packed integers, unpacks them with shifts and masks, subtracts the zero point, multiplies by the scale
and feeds the result to ``tl.dot`` with an fp32 accumulator: the 16-bit weight only ever exists as a
register tile, never in memory. That is the point of the format: a decode step (M of a few tokens) is
bound by reading the weights, and int4 reads ¼ of the fp16 bytes (plus the scales and zero points: 4 bytes
per group, 1/32 of a byte per weight at group 128).

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

Dequantisation (tensor-core kernel): when the scales have x's dtype (fp16 weights with fp16 x, bf16 with
bf16), in that dtype, without an int-to-float conversion: ``MAGIC | q`` is the bits of ``2^e + q`` (1024 + q
in fp16, 128 + q in bf16), minus the stored ``2^e + z`` is ``q − z`` exactly. Two ways on from there:
``q − z`` times ``s`` (the single rounding that ``dequantize(weight, x.dtype)`` makes: the same bits), fed
to the MMA (the GEMM, M > 64); or, with ``scale_after`` (the default for M ≤ 64), ``q − z`` itself (exact
in 16 bits) fed to the MMA, each group's product summed in fp32 and then multiplied by the group's scale:
one multiply per output and group instead of one per weight, and the weight never rounded to 16 bits.
Compiled for sm_90, both go through PTX on pairs of values (``_w4_dequant_sz``): per two weights one
shift, one ``lop3``, one ``sub.bf16x2`` (and one ``mul.bf16x2``), against about twice as many SASS
instructions for the plain-Triton form (which the interpreter runs, and which gives the same bits).
Otherwise (other scale dtypes) in fp32 and rounded once to x's dtype; fp32 activations keep an exact IEEE
(not TF32) mode. ``dequantize`` itself, on a GPU, is one Triton kernel (``unpack_to_memory``) with the
same helper: the unfused baseline at memory speed.

Kernels. Tensor cores (``_w4a16_kernel``): grid (M tiles, N tiles, K slices). ``swap_ab`` computes
``outᵀ = W · xᵀ`` so that the dequantised weight is the MMA's A operand, the one Hopper's wgmma takes from
registers (and x is the N side, ≥ 16 wide: a decode step's rows pad to wgmma m64n16k16 instead of a 64-row
tile of x). A CUDA-core GEMV kernel (no tl.dot; an and, an add and an FMA per weight and row of x) was
the decode path until this kernel with the PTX pairs beat it at every M ≤ 4 on the H200 (at M = 1 16.4
against 16.8 µs of CUDA-graph time on 14336 × 4096 and 54 against 64 µs on 28672 × 8192; three times faster
at M = 4), and was removed. Split-K in one launch and deterministic: each K slice stores its fp32 partial sum to a
cached ``[split, M, N]`` workspace and increments its output tile's counter (atomic, acq_rel); the last
slice to arrive adds the partial sums in the fixed order 0, 1, …, adds the bias, stores the output and puts
the counter back to 0 (the counters are zeroed once, when the workspace is allocated, per device and
stream). Without split-K, bias and cast are in the epilogue. int8 per-channel weights (``quantize_w8``) use
a separate, plain tiled kernel (split-K there still uses a second, reduce kernel).

Host side of ``matmul`` (what a decode step pays per call, about 27 µs on the H200's host against 14 µs for
``F.linear``): attribute checks, a cached ``choose_config`` and launch plan, one ``torch.empty`` (the
output), one kernel launch through ``kernels._runtime.LaunchCache`` (after the first launch of a kind, the
compiled kernel's launcher directly, without Triton's per-call binding of 34 arguments: 44 µs before); no
device guard unless x is on another device than the current one, no memset, no copy of a contiguous 2-D x.

Handles: any M (including 0) and leading dimensions, any N (masked tails), K a multiple of the group size
(int4) or any K (int8), float16 and bfloat16 activations on the GPU, float32 activations as an exact
testing mode. Does not handle: activation quantisation, act-order (GPTQ's permuted groups), a backward pass.

Tested: in Triton's interpreter on CPU (float16, float32; odd shapes, tails, every split and operand order,
both scale placements, the int4 and int8 kernels, split-K counters reused across shapes: tests/kernels/test_w4a16.py;
Triton 3.6's interpreter computes bfloat16 wrongly, so the bf16 paths are checked only on a GPU), compiled
for sm_90 on the CPU (every default path: wgmma, the PTX pairs, no layout conversion in the K loop, no local
memory), and on an H200 (the whole file, bf16 included; the PTX and plain-Triton forms bit for bit).
Compiled for sm_90 (bf16, group 128; a one-off count of the SASS between the K loop's label and its
backward branch, from nvdisasm): the decode config (16 × 128 × 128, 4 warps,
4 stages, swapped, scale after) has 426 SASS instructions in its K loop for 128 weights a thread (3.3 a
weight; 609 in the plain-Triton form), 126 registers; the GEMM config (128 × 256 × 128, 8 warps, 3 stages)
460 for 128 weights a thread (723 plain), 238 registers, no spills.

Measured on an H200, shipped run (reports/reference/h200/ops.csv, bf16, group 128, asymmetric; every point
passed the float64 gate), on 4096 → 14336, 14336 → 4096 and 8192 → 28672 layers: M = 1 1.57–1.75×
``F.linear`` (1.2–1.7 TB/s on the packed bytes, 38–43% of the copy figure), 0.84–0.92× PyTorch's int4
kernel; M = 4 1.56–1.80×; M = 16 1.44–1.71× ``F.linear`` and 2.5–3.8× PyTorch's int4 kernel; M = 64
0.85–0.93×; M = 4096 0.60–0.64× cuBLAS, where dequantising to memory and then ``F.linear`` (1.09–1.14×
cuBLAS's time) is faster than this fused kernel. A read-only Triton kernel streaming the same packed words
(a one-off probe, not shipped) took 40 µs on the largest layer under the same flush (2.9 TB/s, 74% of the copy
figure), this kernel 74 µs: bound by issue and latency, not by the bytes.

Layers, top to bottom: the ``@triton.jit`` kernels and helpers; the weight formats and quantisers;
configuration (dataclass, tables by M, heuristic); the launchers; the public functions ``matmul`` and
``matmul_w8``.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from kernels._runtime import (
    INTERPRET,
    LaunchCache,
    check_bf16,
    check_device,
    compute_capability,
    device_guard,
    multiprocessor_count,
)

__all__ = [
    "W4Weight",
    "W8Weight",
    "W4A16Config",
    "quantize",
    "dequantize",
    "unpack_to_memory",
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
def _w4_dequant(words, shift, s, z, SYMMETRIC: tl.constexpr, dtype):
    """``(q − z) · s`` of nibble ``shift // 4`` of every word in fp32, rounded once to ``dtype`` (DEQ 1:
    scales of another dtype than x's; DEQ 2, ``dtype`` fp32: the exact fp32 mode). With 16-bit scales in
    x's dtype the kernel uses ``_w4_dequant_sz`` instead."""
    qf = ((words >> shift) & 0xF).to(tl.float32)
    if SYMMETRIC:
        w = (qf - 8.0) * s.to(tl.float32)
    else:
        w = (qf - z.to(tl.float32)) * s.to(tl.float32)
    return w.to(dtype)


def _pairs_ptx(kind: str, magic: int, scale: bool) -> str:
    """PTX for nibble i of two words at once (``_w4_dequant_sz``): $0 the ``kind`` (f16x2 or bf16x2) result,
    $1 $2 the two words, $3 $4 their scale_zero words, $5 the ``prmt`` selector of nibbles 0–3 or 4–7, $7
    the shift within them ($6 and $8 are the second copies that pack=2 passes)."""
    body = (
        "{ .reg .b32 p, t, z, s; prmt.b32 p, $1, $2, $5; shr.u32 t, p, $7; "
        f"lop3.b32 t, t, 0x000F000F, {magic:#010x}, 0xEA; prmt.b32 z, $3, $4, 0x7632; "
    )
    if scale:
        return body + f"prmt.b32 s, $3, $4, 0x5410; sub.rn.{kind} t, t, z; mul.rn.{kind} $0, t, s; }}"
    return body + f"sub.rn.{kind} $0, t, z; }}"


_PAIRS_IO = tl.constexpr("=r,r,r,r,r,r,r,r,r")
_PAIRS_F16 = tl.constexpr(_pairs_ptx("f16x2", 0x64006400, False))
_PAIRS_F16_SCALE = tl.constexpr(_pairs_ptx("f16x2", 0x64006400, True))
_PAIRS_BF16 = tl.constexpr(_pairs_ptx("bf16x2", 0x43004300, False))
_PAIRS_BF16_SCALE = tl.constexpr(_pairs_ptx("bf16x2", 0x43004300, True))


@triton.jit
def _w4_dequant_sz(words, sz, i: tl.constexpr, MAGIC: tl.constexpr, SCALE: tl.constexpr, USE_ASM: tl.constexpr):
    """Nibble i of every word from the int32 ``scale_zero`` words ``sz`` (broadcast to the words' shape), in
    fp16 (MAGIC 0x6400) or bf16 (0x4300): ``(q − z) · s`` with SCALE (DEQ 0: the same bits as
    ``_w4_dequant``), ``q − z`` (exact) without (DEQ 3, the scale applied to the product's fp32 sum).

    USE_ASM (compiled for sm_90): PTX on two words at a time, so that each instruction serves two weights
    (an ``f16x2``/``bf16x2`` register): one ``prmt`` puts 16 bits of each word side by side (nibbles 0–3 or
    4–7; shared by four nibbles), then per pair a shift, one ``lop3`` (mask and 2^e exponent bits), one
    ``sub`` of the pair of ``2^e + z`` and with SCALE one ``mul`` by the pair of scales (those pairs are one
    ``prmt`` of the two ``sz`` words, shared by the eight nibbles). Plain Triton otherwise (the interpreter).
    """
    if USE_ASM:
        if i < 4:
            sel = tl.full(words.shape, 0x5410, tl.int32)
        else:
            sel = tl.full(words.shape, 0x7632, tl.int32)
        args = [words, sz, sel, tl.full(words.shape, 4 * (i % 4), tl.int32)]
        if MAGIC == 0x6400:
            if SCALE:
                w = tl.inline_asm_elementwise(_PAIRS_F16_SCALE, _PAIRS_IO, args, tl.float16, is_pure=True, pack=2)
            else:
                w = tl.inline_asm_elementwise(_PAIRS_F16, _PAIRS_IO, args, tl.float16, is_pure=True, pack=2)
        elif SCALE:
            w = tl.inline_asm_elementwise(_PAIRS_BF16_SCALE, _PAIRS_IO, args, tl.bfloat16, is_pure=True, pack=2)
        else:
            w = tl.inline_asm_elementwise(_PAIRS_BF16, _PAIRS_IO, args, tl.bfloat16, is_pure=True, pack=2)
    else:
        if MAGIC == 0x6400:
            dtype = tl.float16
        else:
            dtype = tl.bfloat16
        z = (sz >> 16).to(tl.int16).to(dtype, bitcast=True)
        q = ((words >> (4 * i)) & 0xF) | MAGIC
        w = q.to(tl.int16).to(dtype, bitcast=True) - z
        if SCALE:
            w = w * sz.to(tl.int16).to(dtype, bitcast=True)
    return w


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
    Out,  # (M, N) in X's dtype, contiguous
    Part,  # SPLIT: (split_k, M, N) float32 partial sums (a cached workspace), else unused
    Cnt,  # SPLIT: int32 arrival counters, one per output tile, 0 between launches, else unused
    M,
    N,
    k_main,  # K rounded down to a multiple of 128: the full packing blocks
    blocks_per_split,  # 128-input blocks per K slice, a multiple of BLOCK_K // 128
    split_k,  # K slices (grid axis 2)
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wc,
    stride_sn,
    stride_sg,
    stride_zn,
    stride_zg,
    stride_bias,  # Bias's stride (any, 0 for an expanded bias)
    GROUP: tl.constexpr,
    SYMMETRIC: tl.constexpr,
    TAIL_WORDS: tl.constexpr,  # (K − k_main) / 8: 0, 4, 8 or 12
    SPLIT: tl.constexpr,  # split_k > 1: partial sums, reduced by the last program of each tile
    DEQ: tl.constexpr,  # 0, 3: scale_zero words, scale before / after the product; 1, 2: _w4_dequant
    MAGIC: tl.constexpr,  # 0x6400 (fp16) or 0x4300 (bf16), for DEQ 0 and 3
    SWAP_AB: tl.constexpr,  # compute outᵀ = W · xᵀ (the weight as the MMA's A operand) instead of x · Wᵀ
    USE_ASM: tl.constexpr,  # DEQ 0 through PTX on pairs of weights (_w4_dequant_sz); compiled for sm_90 only
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
    if not SYMMETRIC and (DEQ == 1 or DEQ == 2):
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
            if DEQ == 3:
                # q − z exact in 16 bits, its product with x summed per group in fp32, then times the scale
                for gi in tl.static_range(128 // GROUP):
                    sz = tl.load(s_ptrs + (kb // GROUP + gi) * stride_sg, mask=nb_mask, other=0)
                    s = sz.to(tl.int16).to(dtype, bitcast=True).to(tl.float32)
                    for ii in tl.static_range(GROUP // 16):
                        i = gi * (GROUP // 16) + ii
                        x = tl.load(x_ptrs + (kb + 16 * i) * stride_xk, mask=xb_mask, other=0.0)
                        if SWAP_AB:
                            w = _w4_dequant_sz(words, sz[:, None], i, MAGIC, False, USE_ASM)
                        else:
                            w = _w4_dequant_sz(words, sz[None, :], i, MAGIC, False, USE_ASM)
                        if ii == 0:
                            part = _w4_mma(tl.zeros(acc.shape, tl.float32), w, x, SWAP_AB, DEQ)
                        else:
                            part = _w4_mma(part, w, x, SWAP_AB, DEQ)
                    if SWAP_AB:
                        acc += part * s[:, None]
                    else:
                        acc += part * s[None, :]
            for i in tl.static_range(8 if DEQ != 3 else 0):
                if (16 * i) % GROUP == 0:  # a new group starts with this slice: its scale and zero point
                    g = kb // GROUP + (16 * i) // GROUP
                    if DEQ == 0:  # S is the int32 scale_zero: scale bits low, 2^e + z bits high
                        sz = tl.load(s_ptrs + g * stride_sg, mask=nb_mask, other=0)
                    else:
                        s = tl.load(s_ptrs + g * stride_sg, mask=nb_mask, other=0.0)
                        z = s  # unused when SYMMETRIC
                        if not SYMMETRIC:
                            z = tl.load(z_ptrs + g * stride_zg, mask=nb_mask, other=0)
                if DEQ == 0:
                    if SWAP_AB:
                        w = _w4_dequant_sz(words, sz[:, None], i, MAGIC, True, USE_ASM)
                    else:
                        w = _w4_dequant_sz(words, sz[None, :], i, MAGIC, True, USE_ASM)
                elif SWAP_AB:
                    w = _w4_dequant(words, 4 * i, s[:, None], z[:, None], SYMMETRIC, dtype)
                else:
                    w = _w4_dequant(words, 4 * i, s[None, :], z[None, :], SYMMETRIC, dtype)
                x = tl.load(x_ptrs + (kb + 16 * i) * stride_xk, mask=xb_mask, other=0.0)
                acc = _w4_mma(acc, w, x, SWAP_AB, DEQ)
    if TAIL_WORDS > 0:
        if pid_k == split_k - 1:
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
                if DEQ == 0 or DEQ == 3:  # the scale before the product here (per element: the group varies)
                    sz = tl.load(S + sn * stride_sn + g * stride_sg, mask=t_mask, other=0)
                    w = _w4_dequant_sz(words, sz, i, MAGIC, True, USE_ASM)
                else:
                    s = tl.load(S + sn * stride_sn + g * stride_sg, mask=t_mask, other=0.0)
                    z = s
                    if not SYMMETRIC:
                        z = tl.load(Z + sn * stride_zn + g * stride_zg, mask=t_mask, other=0)
                    w = _w4_dequant(words, 4 * i, s, z, SYMMETRIC, dtype)
                x = tl.load(x_ptrs + (k_main + i * TAIL_WORDS) * stride_xk, mask=tx_mask, other=0.0)
                acc = _w4_mma(acc, w, x, SWAP_AB, DEQ)
    tile = pid_m * tl.num_programs(1) + pid_n
    _w4_epilogue(acc, Bias, stride_bias, Out, Part, Cnt, tile, pid_k, split_k, offs_m, offs_n, M, N, SPLIT, SWAP_AB)


@triton.jit
def _w4_finish(acc, Bias, stride_bias, Out, rows, cols, mask, N):
    if Bias is not None:
        b = tl.load(Bias + cols * stride_bias, mask=cols < N, other=0.0).to(tl.float32)
        acc += b
    tl.store(Out + rows * N + cols, acc.to(Out.dtype.element_ty), mask=mask)


@triton.jit
def _w4_epilogue(acc, Bias, stride_bias, Out, Part, Cnt, tile, pid_k, split_k, offs_m, offs_n, M, N,
                 SPLIT: tl.constexpr, TRANS: tl.constexpr):  # fmt: skip
    """Bias, cast and store of a ``[BLOCK_M, BLOCK_N]`` tile (``[BLOCK_N, BLOCK_M]`` when TRANS) of the
    contiguous ``Out [M, N]``. With SPLIT: one launch, deterministic. Each K slice stores its fp32 partial
    sum to ``Part[pid_k]`` and adds 1 to the tile's counter (acq_rel, after a CTA barrier so that every
    thread's stores precede the release); the program that sees ``split_k − 1`` (the last to arrive) sums
    slices 0, 1, …, split_k − 1 in that fixed order (loads bypass L1), adds the bias, stores, and puts the
    counter back to 0 so that the cached counter buffer serves the next launch without a memset."""
    if TRANS:
        rows = offs_m[None, :]
        cols = offs_n[:, None]
    else:
        rows = offs_m[:, None]
        cols = offs_n[None, :]
    mask = (rows < M) & (cols < N)
    if SPLIT:
        part = Part + rows * N + cols
        tl.store(part + pid_k * M * N, acc, mask=mask)
        tl.debug_barrier()
        count = tl.atomic_add(Cnt + tile, 1, sem="acq_rel", scope="gpu")
        if count == split_k - 1:
            total = tl.load(part, mask=mask, other=0.0, cache_modifier=".cg")
            for sl in range(1, split_k):
                total += tl.load(part + sl * M * N, mask=mask, other=0.0, cache_modifier=".cg")
            _w4_finish(total, Bias, stride_bias, Out, rows, cols, mask, N)
            tl.store(Cnt + tile, 0)
    else:
        _w4_finish(acc, Bias, stride_bias, Out, rows, cols, mask, N)


@triton.jit
def _w4_unpack_kernel(
    W,  # (N, K // 8) int32, the blocked packing
    SZ,  # (K // GROUP, N) int32 scale_zero words
    Out,  # (N, K) in the scales' 16-bit dtype
    N,
    k_main,
    stride_wn,
    stride_wc,
    stride_sg,
    stride_sn,
    stride_on,
    GROUP: tl.constexpr,
    TAIL_WORDS: tl.constexpr,
    MAGIC: tl.constexpr,
    USE_ASM: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Dequantise to memory (the unfused path ``dequantize`` takes on a GPU): program (N tile, 128-input
    block) writes ``(q − z) · s`` of its ``[BLOCK_N, 128]`` tile with the matmul kernel's helper, the same
    single rounding as the float32 reference."""
    pid_n = tl.program_id(0)
    kb = tl.program_id(1) * 128
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, 16)
    n_mask = offs_n[:, None] < N
    w_ptrs = W + offs_n[:, None] * stride_wn + offs_c[None, :] * stride_wc
    o_ptrs = Out + offs_n[:, None] * stride_on + offs_c[None, :]
    if kb < k_main:
        words = tl.load(w_ptrs + (kb // 8) * stride_wc, mask=n_mask, other=0)
        for i in tl.static_range(8):
            sz = tl.load(SZ + ((kb + 16 * i) // GROUP) * stride_sg + offs_n * stride_sn, mask=offs_n < N, other=0)
            w = _w4_dequant_sz(words, sz[:, None], i, MAGIC, True, USE_ASM)
            tl.store(o_ptrs + kb + 16 * i, w, mask=n_mask)
    elif TAIL_WORDS > 0:  # the shorter last block: nibble i of word c is input k_main + i·TAIL_WORDS + c
        c_ok = n_mask & (offs_c[None, :] < TAIL_WORDS)
        tail = tl.load(w_ptrs + (k_main // 8) * stride_wc, mask=c_ok, other=0)
        for i in tl.static_range(8):
            cols = k_main + i * TAIL_WORDS + offs_c[None, :]
            sz_t = tl.load(SZ + (cols // GROUP) * stride_sg + offs_n[:, None] * stride_sn, mask=c_ok, other=0)
            tl.store(o_ptrs + k_main + i * TAIL_WORDS, _w4_dequant_sz(tail, sz_t, i, MAGIC, True, USE_ASM), mask=c_ok)


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
    stride_bias,
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
            acc += tl.load(Bias + offs_n * stride_bias, mask=n_mask, other=0.0).to(tl.float32)[None, :]
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
    stride_bias,
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
        acc += tl.load(Bias + offs_n * stride_bias, mask=n_mask, other=0.0).to(tl.float32)[None, :]
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
    k_main, tail_words = _block_split(k)
    block_n = 64
    sz = weight.scale_zero
    use_asm = not INTERPRET and compute_capability(weight.packed.device) >= (9, 0)
    grid = (triton.cdiv(n, block_n), triton.cdiv(k, PACK_BLOCK), 1)
    with device_guard(weight.packed):
        _UNPACK.launch(
            grid,
            (weight.packed, sz, out, n, k_main, *weight.packed.stride(), *sz.stride(), out.stride(0)),
            dict(GROUP=weight.group_size, TAIL_WORDS=tail_words, MAGIC=0x6400 if out.dtype == torch.float16 else 0x4300,
                 USE_ASM=use_asm, BLOCK_N=block_n),
            4, 1,
        )  # fmt: skip
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


# ---------------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class W4A16Config:
    """One launch: tile sizes, the number of K slices (1: no split-K), warps and pipeline depth.

    swap_ab (int4 tensor-core path only): compute ``outᵀ = W · xᵀ``, the dequantised weight being the MMA's
    first operand (the one Hopper's wgmma, and mma.sync, take from registers) and the rows of x its N
    dimension. For int4, block_k is a multiple of 128
    (whole packing blocks per loop step). scale_after (int4 tensor-core path, 16-bit x with 16-bit scales):
    the MMA multiplies ``q − z`` (exact in 16 bits) and each group's fp32 sum is then multiplied by its
    scale, instead of multiplying every weight by it. asm: where the GPU allows (sm_90), dequantise with
    PTX on pairs of 16-bit values (``_w4_dequant_sz``); False keeps the plain-Triton form (the same bits).
    """

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    swap_ab: bool = False
    scale_after: bool = False
    asm: bool = True


_H100_SMS = 132  # H100/H200 SXM; the device's own count is used when there is one

# The GPU defaults for int4, by M: (largest M, block_m, block_n, block_k, num_warps, num_stages, swap_ab,
# waves, scale_after). waves > 0: split K so that the grid has about waves × SMs programs (each slice keeps
# at least two 128-input blocks); 0: no split. Chosen from an H200 sweep (choose_config's docstring).
W4_GPU_TABLE: tuple[tuple[int, int, int, int, int, int, bool, int, bool], ...] = (
    (16, 16, 128, 128, 4, 4, True, 4, True),
    (64, 64, 128, 128, 4, 4, True, 2, True),
    (256, 128, 256, 128, 8, 3, True, 1, False),
    (2**62, 128, 256, 128, 8, 3, True, 0, False),
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
    """The launch for an ``[m, k] @ [k, n]`` product: deterministic, so tests can pin what runs (cached).

    On a GPU, the row of ``W4_GPU_TABLE`` (``W8_GPU_TABLE`` for ``bits=8``) for the smallest M bound
    ≥ m, with the split count worked out from the grid. The int4 rows come from H200 sweeps (bf16, group
    128, 14336 × 4096, 28672 × 8192 and 4096 × 14336; two one-off sweeps of 462 timed points, not shipped):
    - M ≤ 16 (decode, bound by reading the weights): the swapped tensor-core kernel with the scale after
      the product (``scale_after``), 128 output channels × 128 inputs per step, 4 warps, 4 stages, split-K
      to about 4 programs per SM; x's ≤ 16 rows are the 16-wide N side of wgmma m64n16k16. It beat the
      former CUDA-core GEMV kernel at every M ≤ 4 (module docstring), and 64- or 256-wide N tiles, 2 warps
      (mma.sync), 3 or 6 stages and other splits by up to 15%.
    - 16 < M ≤ 64: the same with 64-row tiles of x, 2 waves.
    - M > 64: 256 output channels × 128 rows of x per tile, swapped (wgmma m64n128k16 with the dequantised
      weight as the register operand, xᵀ from shared memory: the weight tile is never written to shared
      memory), 8 warps, 3 stages; the scale before the product (a second accumulator per group would
      need another 128 registers per thread). Up to M = 256 K is split to about one program per SM (the
      shipped run before this had M = 256 on 4096 outputs in 32 programs: 0.21× F.linear).
    In the interpreter: small tiles, so that the CPU run stays short while still crossing several tiles.
    """
    return _choose_config(m, n, k, sm_count, interpret, bits)


@functools.lru_cache(maxsize=4096)
def _choose_config(m: int, n: int, k: int, sm_count: int, interpret: bool, bits: int) -> W4A16Config:
    if interpret:
        block_k = 128 if bits == 4 else 32
        if m <= SMALL_M:
            split = max(1, min(4, k // block_k))
            return W4A16Config(16, 32, block_k, split, 4, 1, bits == 4, bits == 4)
        return W4A16Config(32, 32, block_k, 1, 4, 1)
    if bits == 4:
        _, bm, bn, bk, nw, ns, swap, waves, after = next(row for row in W4_GPU_TABLE if m <= row[0])
    else:
        _, bm, bn, bk, nw, ns, swap, waves = next(row for row in W8_GPU_TABLE if m <= row[0])
        after = False
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    split = _split_for(tiles, k // bk, waves, 2 if bits == 4 and bk == 128 else 1, sm_count)
    return W4A16Config(bm, bn, bk, split, nw, ns, swap, after)


# ---------------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------------


def _check_activations(x: torch.Tensor, shape: tuple[int, int], bias: torch.Tensor | None, tensors, names) -> None:
    """Pure attribute checks on the common path; ``check_device`` (which builds messages) only when the
    tensors are not all on x's CUDA device."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in ACTIVATION_DTYPES:
        raise TypeError(f"x dtype {x.dtype} is not supported: use one of {list(ACTIVATION_DTYPES)}")
    if x.ndim < 1:
        raise ValueError("x must have at least one dimension, [..., in_features]")
    n, k = shape
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} input features, the weight expects {k}")
    if x.dtype == torch.bfloat16:  # the interpreter's tl.dot is wrong in bf16; old GPUs have no bf16 MMA
        check_bf16(x.dtype, x.device, "x")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
        if bias.shape != (n,):
            raise ValueError(f"bias must have shape ({n},), got {tuple(bias.shape)}")
        if not bias.is_floating_point():
            raise TypeError(f"bias must be floating point, got {bias.dtype}")
        tensors, names = (*tensors, bias), (*names, "bias")
    device = x.device
    if device.type == "cuda" and not INTERPRET and all(t.device == device for t in tensors):
        return
    check_device(x, *tensors, names=("x", *names))


def _check_config(cfg: W4A16Config, bits: int) -> None:
    for name in ("block_m", "block_n", "block_k"):  # tl.dot: power-of-two tiles of at least 16
        value = getattr(cfg, name)
        if value < 16 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two ≥ 16, got {value} in {cfg}")
    if bits == 4 and cfg.block_k % PACK_BLOCK:
        raise ValueError(f"block_k must be a multiple of the packing block {PACK_BLOCK} for int4, got {cfg}")
    if cfg.scale_after and bits != 4:
        raise ValueError(f"scale_after belongs to the int4 kernel, got {cfg} for int{bits}")
    if cfg.split_k < 1 or cfg.num_warps < 1 or cfg.num_stages < 1:
        raise ValueError(f"split_k, num_warps and num_stages must be ≥ 1, got {cfg}")


def _empty_product(x, bias, m, n, k, lead):
    """The output when there is nothing to multiply (M, N or K zero)."""
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    if k == 0 and m and n:
        out.zero_()
        if bias is not None:
            out += bias.to(out.dtype)
    return out.reshape(*lead, n)


def _prepare(x, bias, n, k):
    """(x as [M, K], output [M, N], leading dims), or the finished output when there is nothing to multiply."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if m == 0 or n == 0 or k == 0:
        return None, _empty_product(x, bias, m, n, k, lead), lead
    return x2, torch.empty((m, n), device=x.device, dtype=x.dtype), lead


def _bias_stride(bias: torch.Tensor | None) -> int:
    """The bias's element stride (0 for an expanded one; 0 when there is none, unused then)."""
    return 0 if bias is None else bias.stride(0)


def _reduce(target, bias, out, split):
    m, n = out.shape
    block_m, block_n = 16, 64
    _REDUCE.launch(
        (triton.cdiv(m, block_m), triton.cdiv(n, block_n), 1),
        (target, bias, out, m, n, *target.stride(), *out.stride(), _bias_stride(bias)),
        dict(SPLIT_K=split, BLOCK_M=block_m, BLOCK_N=block_n), 4, 1,
    )  # fmt: skip


# Split-K workspaces, per (device, stream): fp32 partial sums and int32 arrival counters. The counters are
# zeroed once, when allocated, and every launch leaves them at 0 (the last program of each tile resets its
# counter), so a launch needs no memset. Per stream, because two launches that run at the same time must
# not share counters. Buffers that were outgrown are kept (in _RETIRED), so that a CUDA graph captured
# with them never points at freed memory. Not safe: one stream used from several host threads at once.
_WORKSPACES: dict[tuple[str, int, int], tuple[torch.Tensor, torch.Tensor]] = {}
_RETIRED: list[tuple[torch.Tensor, torch.Tensor]] = []


def _workspace(device: torch.device, partials: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    if device.type == "cuda":
        key = ("cuda", device.index, torch._C._cuda_getCurrentRawStream(device.index))
    else:
        key = (device.type, -1, 0)
    ws = _WORKSPACES.get(key)
    if ws is not None and ws[0].numel() >= partials and ws[1].numel() >= tiles:
        return ws
    if ws is not None:
        _RETIRED.append(ws)
        partials, tiles = max(partials, 2 * ws[0].numel()), max(tiles, 2 * ws[1].numel())
    ws = (
        torch.empty(max(partials, 1 << 16), device=device, dtype=torch.float32),
        torch.zeros(max(tiles, 1 << 12), device=device, dtype=torch.int32),
    )
    _WORKSPACES[key] = ws
    return ws


@functools.lru_cache(maxsize=4096)
def _plan_w4(cfg: W4A16Config, m: int, n: int, k: int) -> tuple[tuple[int, int, int], int, int, int, int]:
    """(grid, split, blocks per split, k_main, tail words) of an int4 launch; slices are whole loop steps of
    block_k inputs (the kernels mask the blocks of a last, partial step) and none is empty."""
    _check_config(cfg, 4)
    k_main, tail_words = _block_split(k)
    per_step = cfg.block_k // PACK_BLOCK
    blocks = k_main // PACK_BLOCK
    steps = triton.cdiv(blocks, per_step)
    blocks_per_split = triton.cdiv(steps, min(cfg.split_k, max(steps, 1))) * per_step
    split = max(1, triton.cdiv(blocks, blocks_per_split)) if blocks else 1
    grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n), split)
    return grid, split, blocks_per_split, k_main, tail_words


# launches after the first of each kind skip Triton's argument binding (kernels._runtime.LaunchCache)
_TENSOR_CORES = LaunchCache(_w4a16_kernel)
_W8 = LaunchCache(_w8a16_matmul_kernel)
_REDUCE = LaunchCache(_splitk_reduce_kernel)
_UNPACK = LaunchCache(_w4_unpack_kernel)


def _launch_w4(x, weight: W4Weight, bias, config: W4A16Config | None) -> torch.Tensor:
    """One kernel launch and one ``torch.empty`` (the output) per call; the split-K workspace is cached."""
    n, k = weight.shape
    x2 = x if x.ndim == 2 else x.reshape(-1, k)
    m = x2.shape[0]
    if m == 0 or n == 0 or k == 0:
        return _empty_product(x, bias, m, n, k, x.shape[:-1])
    device = x.device
    cfg = config or _choose_config(m, n, k, multiprocessor_count(device, _H100_SMS), INTERPRET, 4)
    grid, split, blocks_per_split, k_main, tail_words = _plan_w4(cfg, m, n, k)
    out = torch.empty((m, n), device=device, dtype=x.dtype)
    if split > 1:
        part, cnt = _workspace(device, split * m * n, grid[0] * grid[1] * grid[2] // split)
    else:
        part = cnt = None
    sz = weight.scale_zero
    if x.dtype == torch.float32:
        deq = 2
    elif sz is not None and weight.scales.dtype == x.dtype:
        deq = 3 if cfg.scale_after else 0
    else:
        deq = 1
    # PTX on pairs of 16-bit values (sub/mul .bf16x2 need sm_90); the plain-Triton form gives the same bits
    use_asm = cfg.asm and deq in (0, 3) and not INTERPRET and compute_capability(device) >= (9, 0)
    if deq in (0, 3):  # the combined int32 words, [K // group, N]
        s, z = sz, None
        stride_sg, stride_sn = sz.stride()
        stride_zn = stride_zg = 0
    else:
        s, z = weight.scales, weight.zeros
        stride_sn, stride_sg = s.stride()
        stride_zn, stride_zg = z.stride() if z is not None else (0, 0)
    _TENSOR_CORES.launch(
        grid,
        (x2, weight.packed, s, z, bias, out, part, cnt, m, n, k_main, blocks_per_split, split,
         *x2.stride(), *weight.packed.stride(), stride_sn, stride_sg, stride_zn, stride_zg, _bias_stride(bias)),
        dict(GROUP=weight.group_size, SYMMETRIC=weight.symmetric, TAIL_WORDS=tail_words, SPLIT=split > 1, DEQ=deq,
             MAGIC=0x6400 if x.dtype == torch.float16 else 0x4300, SWAP_AB=cfg.swap_ab, USE_ASM=use_asm,
             BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k),
        cfg.num_warps, cfg.num_stages,
    )  # fmt: skip
    return out if x.ndim == 2 else out.reshape(*x.shape[:-1], n)


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
    _W8.launch(
        grid,
        (x2, w, scales, bias if split == 1 else None, target, m, n, k_per_split, k,
         x2.stride(0), x2.stride(1), w.stride(0), w.stride(1), scales.stride(0), _bias_stride(bias),
         stride_os, target.stride(-2), target.stride(-1)),
        dict(SPLIT_K=split, IS_FP32=x.dtype == torch.float32,
             BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k),
        cfg.num_warps, cfg.num_stages,
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
        config: pin a launch (``choose_config`` otherwise); ``split_k > 1`` splits K, ``scale_after`` places
            the scale after the product.

    Returns: ``[..., N]`` in x's dtype. Tensor-core path with the scale before the product (the GEMM,
    M > 64): the dequantised weight is rounded to x's dtype before the product (fp32 accumulation), as
    ``x @ dequantize(weight, x.dtype).T`` would. With the scale after it (``config.scale_after``, the default
    for M ≤ 64): the weight is not rounded to 16 bits; ``(q − z)·x``
    is exact in fp32, summed per group in fp32 and scaled by the group's scale (no more error than the
    former).
    Split-K is deterministic (fixed summation order) and runs in one launch.
    Raises ``TypeError``/``ValueError`` for unsupported dtypes, devices or shapes.
    """
    if not isinstance(weight, W4Weight):
        raise TypeError(f"weight must be a W4Weight from quantize(), got {type(weight).__name__}")
    if weight.zeros is not None:
        tensors, names = (weight.packed, weight.scales, weight.zeros), ("packed", "scales", "zeros")
    else:
        tensors, names = (weight.packed, weight.scales), ("packed", "scales")
    _check_activations(x, weight.shape, bias, tensors, names)
    with device_guard(x):
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
    with device_guard(x):
        return _launch_w8(x, weight, bias, config)
