"""W4A16 and W8A16 linear layers in Triton: weights quantised offline, dequantised in registers.

What it is: ``y = x @ dequant(W)ᵀ (+ bias)`` for an ``nn.Linear``-style weight ``W [N, K]``
(out_features × in_features) and 16-bit activations ``x [..., K]``. The weight is stored either as int4,
group-wise along K (``quantize``: one scale, and for the asymmetric format one zero point, per ``group_size``
consecutive inputs of an output row), or as int8 with one scale per output channel (``quantize_w8``). The
kernel loads the packed integers, unpacks them with shifts and masks, subtracts the zero point, multiplies by
the scale and feeds the result to ``tl.dot`` with an fp32 accumulator: the 16-bit weight only ever exists
as a register tile, never in memory. That is the point of the format: a decode step (M of a few tokens)
is bound by reading the weights, and int4 reads ¼ of the fp16 bytes (plus the scales: 2 bytes per group,
1/64 of a byte per weight at group 128 with fp16 scales and zero points).

Packed int4 layout (``W4Weight.packed``, int32 ``[N, K // 8]``, row-major): word ``j`` of row ``n`` holds
the eight consecutive inputs ``k = 8j … 8j + 7`` of output ``n``; input ``8j + i`` is in bits ``4i … 4i + 3``
(little nibble first) as an unsigned 4-bit code ``q``. Asymmetric: ``w ≈ (q − z) · s`` with ``q, z ∈ [0, 15]``.
Symmetric: the code is the signed value plus 8 (``q − 8 ∈ [−8, 7]``, and the quantiser uses ±7), so
``w ≈ (q − 8) · s``. Why this layout suits the kernel: a program's weight tile is BLOCK_N output rows ×
BLOCK_K inputs, and with K the contiguous dimension each row of the tile is BLOCK_K / 8 consecutive words
(a 16-byte-aligned run when BLOCK_K ≥ 32), the same K-major order as the activations' tile, so both
operands advance along K together and a group's scale is one element per row; the nibble of input k is
found from k alone (word ``k // 8``, shift ``4 · (k % 8)``), with no interleaving to undo, which keeps the
unpacking a shift and a mask per element. (Marlin-style kernels reorder nibbles and tiles offline for
tensor-core fragment layouts; that is a tuning step this groundwork does not take.)

Two paths, chosen by M (the number of rows of x after flattening the leading dimensions):

- M ≤ 16 (decode): one 16-row tile of x, the N × K weight split over output tiles *and* K slices
  (split-K), so that enough programs stream the weights to occupy every SM. Each program writes its fp32
  partial sum to a ``[SPLIT_K, M, N]`` buffer; a second small kernel adds the slices in a fixed order,
  adds the bias and casts: deterministic, no atomics.
- M > 16: a plain tiled GEMM, one program per output tile, bias and cast fused into its epilogue.

Handles: any M (including 0) and leading dimensions, N a multiple of 8 (any such, masked tails), K a multiple
of the group size (int4) or any K (int8), float16 and bfloat16 activations on the GPU, float32 activations
as an exact (IEEE, not TF32) testing mode. The int4 and int8 formats share one kernel (``BITS`` constexpr)
whose weight-tile loads are separate ``@triton.jit`` helpers. Does not handle: activation quantisation,
act-order (GPTQ's permuted groups), a backward pass.

Tested: in Triton's interpreter on CPU (float16, float32; odd shapes: tests/kernels/test_w4a16.py), and
compiled (not run) for sm_90 with Triton 3.6, where both paths build with tensor-core MMAs and no local
memory in the PTX (N = K = 4096, fp16; ptxas's register spills are not checked): the split-K path with
``mma.sync m16n8k16`` and 40 KiB of shared memory, the tiled path with ``wgmma m64n128k16`` and 72 KiB.
Loading each int32 word once and unpacking it in registers (rather than one gathered load per nibble) is
what keeps those figures down: the per-nibble version compiled to 124 KiB and 128 KiB, the pipeline
staging the 8×-redundant int32 tile. Not run on a
GPU yet; the tile configurations below are reasoned, not tuned.

Layers, top to bottom: the ``@triton.jit`` kernels and helpers; the weight formats and quantisers;
configuration (dataclass, heuristic); the launcher; the public functions ``matmul`` and ``matmul_w8``.
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
WEIGHT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ACTIVATION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ---------------------------------------------------------------------------------------------------
# Triton kernels
# ---------------------------------------------------------------------------------------------------


@triton.jit
def _int4_weight_tile(
    W,  # (N, K // 8) int32, eight 4-bit codes per word along K
    S,  # (N, K // GROUP) scales
    Z,  # (N, K // GROUP) uint8 zero points, or None (symmetric: the zero is 8)
    k0,  # first input of the tile, a multiple of 8
    k_stop,  # a multiple of 8
    offs_n,
    n_mask,
    stride_wn,
    stride_wk,
    stride_sn,
    stride_sg,
    stride_zn,
    stride_zg,
    GROUP: tl.constexpr,
    SYMMETRIC: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """The dequantised weight tile ``[BLOCK_K, BLOCK_N]`` in fp32 (transposed: ready for ``x @ w``).

    Loads are per word, ``[BLOCK_K // 8, BLOCK_N]``: each int32 is read once (not once per nibble) and a
    word's eight inputs always share a group (GROUP is a multiple of 8), so the scale and zero point are
    read per word too; the eight nibbles are then split out along a new middle axis and folded into K.
    """
    offs_w = k0 // 8 + tl.arange(0, BLOCK_K // 8)
    mask = (offs_w < k_stop // 8)[:, None] & n_mask[None, :]
    words = tl.load(W + offs_n[None, :] * stride_wn + offs_w[:, None] * stride_wk, mask=mask, other=0)
    g = (offs_w * 8 // GROUP)[:, None]
    s = tl.load(S + offs_n[None, :] * stride_sn + g * stride_sg, mask=mask, other=0.0).to(tl.float32)
    shifts = tl.arange(0, 8) * 4
    q = ((words[:, None, :] >> shifts[None, :, None]) & 0xF).to(tl.float32)  # (BLOCK_K // 8, 8, BLOCK_N)
    if SYMMETRIC:
        w = (q - 8.0) * s[:, None, :]
    else:
        z = tl.load(Z + offs_n[None, :] * stride_zn + g * stride_zg, mask=mask, other=0).to(tl.float32)
        w = (q - z[:, None, :]) * s[:, None, :]
    # row 8j + i of the tile is nibble i of word j: the packing's order, so a plain reshape
    return tl.reshape(w, (BLOCK_K, w.shape[2]))


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
def _wxa16_matmul_kernel(
    X,  # (M, K) activations
    W,  # BITS=4: (N, K // 8) int32 packed codes; BITS=8: (N, K) int8
    S,  # BITS=4: (N, K // GROUP) scales; BITS=8: (N,) scales
    Z,  # BITS=4 asymmetric: (N, K // GROUP) uint8 zero points; else None
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
    stride_sg,
    stride_zn,
    stride_zg,
    stride_os,
    stride_om,
    stride_on,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    SYMMETRIC: tl.constexpr,
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
        # masked inputs of x are 0, so whatever the masked weight lanes hold contributes nothing
        if BITS == 4:
            w = _int4_weight_tile(
                W, S, Z, k0, k_stop, offs_n, n_mask,
                stride_wn, stride_wk, stride_sn, stride_sg, stride_zn, stride_zg, GROUP, SYMMETRIC, BLOCK_K,
            )  # fmt: skip
        else:
            w = _int8_weight_tile(W, offs_n, offs_k, n_mask, k_mask, stride_wn, stride_wk)
        # the weight is rounded to the activations' dtype, as a dequantise-then-GEMM would round it
        if IS_FP32:
            acc = tl.dot(x, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w.to(x.dtype), acc)
    if BITS == 8:
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

    packed: int32 ``[N, K // 8]``; scales: ``[N, K // group_size]`` (float16 for float16 weights, float32
    otherwise: bfloat16's range does not fit float16); zeros: uint8 ``[N, K // group_size]`` in [0, 15],
    or None when symmetric; shape: the original ``(N, K)``; dtype: the original weight dtype.
    """

    packed: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    group_size: int
    symmetric: bool
    shape: tuple[int, int]
    dtype: torch.dtype

    def nbytes(self) -> int:
        """Bytes the kernel reads for the weight: codes, scales and zero points."""
        parts = (self.packed, self.scales, self.zeros)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)


@dataclasses.dataclass(frozen=True, eq=False)
class W8Weight:
    """An int8 ``[N, K]`` weight with one scale per output channel: ``w ≈ qweight · scales[:, None]``.

    qweight: int8 ``[N, K]`` in [−127, 127]; scales: ``[N]`` (dtype as ``W4Weight.scales``).
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
    return torch.float16 if dtype == torch.float16 else torch.float32


def _safe_scale(scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round to the stored dtype; an all-zero group (or one too small for the dtype) gets scale 1 or tiny."""
    scale = scale.to(dtype)
    tiny = torch.finfo(dtype).tiny
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return scale.clamp_min(tiny)


def quantize(w: torch.Tensor, group_size: int = 128, symmetric: bool = False) -> W4Weight:
    """Quantise ``w [N, K]`` to int4, one scale (and zero point) per ``group_size`` inputs of a row.

    Asymmetric (default): per group, the range ``[min(w, 0), max(w, 0)]`` (0 included, so that it is exact)
    is mapped onto the codes 0 … 15: ``s = (max − min) / 15``, ``z = round(−min / s)``,
    ``q = clamp(round(w / s) + z, 0, 15)``. Symmetric: ``s = max|w| / 7``, ``q = clamp(round(w / s), −7, 7)``
    stored as ``q + 8``. Codes are computed with the scale as stored (rounded to its dtype), so the
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
        scales = _safe_scale((hi - lo) / 15.0, sdtype)
        z = torch.round(-lo / scales.float()).clamp(0, 15)
        q = (torch.round(groups / scales.float()[..., None]) + z[..., None]).clamp(0, 15)
        zeros = z.to(torch.uint8)
    codes = q.to(torch.int32).reshape(n, k // 8, 8)
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=w.device)
    # nibble i of a word is input 8j + i; bit 31 may be set, which int32 holds as a negative number
    packed = (codes << shifts).sum(dim=-1, dtype=torch.int64)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return W4Weight(packed.contiguous(), scales.contiguous(), zeros, group_size, bool(symmetric), (n, k), w.dtype)


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """The 4-bit codes of an int32 ``[N, K // 8]`` packing, as int32 ``[N, K]`` in [0, 15]."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    codes = (packed[..., None] >> shifts) & 0xF
    return codes.reshape(*packed.shape[:-1], packed.shape[-1] * 8)


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
    scales = _safe_scale(wf.abs().amax(dim=1) / 127.0, _scale_dtype(w.dtype))
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
    """One launch: tile sizes, the number of K slices (1: no split-K), warps and pipeline depth."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int


_H100_SMS = 132  # H100/H200 SXM; the device's own count is used when there is one


def choose_config(m: int, n: int, k: int, *, sm_count: int = _H100_SMS, interpret: bool = INTERPRET) -> W4A16Config:
    """The launch for an ``[m, k] @ [k, n]`` product: deterministic, so tests can pin what runs.

    Untuned (no GPU run yet); the reasoning for Hopper:
    - M ≤ 16: a 16-row tile (mma.sync m16n8k16; wgmma's 64-row minimum would waste ¾ of it), 64 output
      columns × 128 inputs per step (4 warps; per stage 4 KiB of int4 words and 4 KiB of fp16 x), and
      split-K up to about two programs per SM, each slice at least 4 K-steps long so that its partial sum
      (M × 64 floats) costs little next to the weights it streams.
    - M > 16: 128 × 128 output tiles, 64 inputs per step, 8 warps (two warpgroups on wgmma), 3 stages:
      the usual fp16 GEMM tile on Hopper, with the dequantisation adding ALU work, not shared memory.
    In the interpreter: small tiles, so that the CPU run stays short while still crossing several tiles.
    """
    if interpret:
        block_k = 32
        if m <= SMALL_M:
            split = max(1, min(4, k // (2 * block_k)))
            return W4A16Config(16, 32, block_k, split, 4, 1)
        return W4A16Config(32, 32, block_k, 1, 4, 1)
    if m <= SMALL_M:
        block_n, block_k = 64, 128
        tiles = triton.cdiv(n, block_n)
        max_split = max(1, k // (4 * block_k))
        split = max(1, min(max_split, triton.cdiv(2 * sm_count, tiles)))
        return W4A16Config(16, block_n, block_k, split, 4, 4)
    return W4A16Config(128, 128, 64, 1, 8, 3)


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


def _check_config(cfg: W4A16Config) -> None:
    # tl.dot needs power-of-two tiles of at least 16; a word (8 inputs) must not straddle a K tile
    for name in ("block_m", "block_n", "block_k"):
        value = getattr(cfg, name)
        if value < 16 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two ≥ 16, got {value} in {cfg}")
    if cfg.split_k < 1 or cfg.num_warps < 1 or cfg.num_stages < 1:
        raise ValueError(f"split_k, num_warps and num_stages must be ≥ 1, got {cfg}")


def _launch(x, bits, w, scales, zeros, bias, shape, group, symmetric, config: W4A16Config | None) -> torch.Tensor:
    n, k = shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    if m == 0 or n == 0:
        return out.reshape(*lead, n)
    if k == 0:
        out.zero_()
        if bias is not None:
            out += bias.to(out.dtype)
        return out.reshape(*lead, n)
    cfg = config or choose_config(m, n, k, sm_count=multiprocessor_count(x.device, _H100_SMS))
    _check_config(cfg)
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    split = triton.cdiv(k, k_per_split)  # no empty slice
    target = out if split == 1 else torch.empty((split, m, n), device=x.device, dtype=torch.float32)
    stride_os = target.stride(0) if split > 1 else 0
    stride_sg = scales.stride(1) if scales.dim() == 2 else 0
    stride_zn, stride_zg = zeros.stride() if zeros is not None else (0, 0)
    grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n), split)
    with torch.cuda.device(x.device) if x.device.type == "cuda" else contextlib.nullcontext():
        _wxa16_matmul_kernel[grid](
            x2, w, scales, zeros, bias if split == 1 else None, target, m, n, k_per_split, k,
            x2.stride(0), x2.stride(1), w.stride(0), w.stride(1), scales.stride(0), stride_sg, stride_zn, stride_zg,
            stride_os, target.stride(-2), target.stride(-1),
            BITS=bits, GROUP=group, SYMMETRIC=symmetric, SPLIT_K=split, IS_FP32=x.dtype == torch.float32,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
        if split > 1:
            block_m, block_n = 16, 64
            _splitk_reduce_kernel[(triton.cdiv(m, block_m), triton.cdiv(n, block_n))](
                target, bias, out, m, n, *target.stride(), *out.stride(),
                SPLIT_K=split, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=4,
            )  # fmt: skip
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
    return _launch(x, 4, weight.packed, weight.scales, weight.zeros, bias, weight.shape, weight.group_size,
                   weight.symmetric, config)  # fmt: skip


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
    return _launch(x, 8, weight.qweight, weight.scales, None, bias, weight.shape, 1, True, config)
