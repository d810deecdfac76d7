"""FP8 attention forward in the FlashAttention-3 manner: Q, K, V in float8 e4m3 with fp32 descale factors.

Both products run on e4m3 operands with fp32 accumulation: S = Q₈ K₈ᵀ times the tiles' Q and K descales,
then P V with P multiplied by ``P_SCALE`` = 256 before its cast to e4m3 (keeping P's small entries out of
e4m3's subnormals) and O times V's descale. Scales are per tensor, per head or per block of the kernel's
tiles (FlashAttention-3's choice), optionally after incoherent processing (``rotate``: Q and K times one
random orthogonal matrix). On Hopper, for head dims 64, 128 and 256, the FA-3 kernel runs it
(``kernels.attention.fa3``); elsewhere (Ada, other head dims, the interpreter) the portable Triton kernel
of ``fp8_kernels.py``. ``attention`` quantises with the fused quantiser (``fp8_quant``) and reads nothing
back unless asked (``check_finite``), so it can be captured in a CUDA graph; so does ``forward_quantized``.

Handles: any lengths, Nq ≠ Nk, causal (bottom-right) or not, grouped-query heads, head dims 1…256, any
strides. Forward only. Tested in the interpreter (tests/kernels/test_fp8.py, test_fp8_quant.py) and on an
H200 (the GPU-marked tests: both kernels, bf16, d up to 256, CUDA-graph capture).
"""

from __future__ import annotations

import math
import os

import torch
import triton

from kernels._runtime import INTERPRET, check_device, check_flag, compute_capability, device_guard, softmax_scale
from kernels.attention import fa3, fp8_quant
from kernels.attention.common import check_shapes, check_tensors
from kernels.attention.fa2 import FA2Config
from kernels.attention.fp8_kernels import _fp8_fwd_kernel
from kernels.attention.reference import P_SCALE, attention_scores, grouped_values, round_p

__all__ = [
    "E4M3_MAX",
    "P_SCALE",
    "GRANULARITIES",
    "FP8Config",
    "quantize",
    "dequantize",
    "hadamard",
    "rotation",
    "default_config",
    "config_in_effect",
    "require_fp8_tensor_cores",
    "MIN_CAPABILITY",
    "forward_quantized",
    "quantize_qkv",
    "QUANTIZERS",
    "attention",
    "emulate",
]

FP8 = torch.float8_e4m3fn
E4M3_MAX = 448.0
# P ∈ [0, 1] is multiplied by P_SCALE (reference.P_SCALE, 256) before the cast to e4m3: a power of two
# (exact), and 256·1 stays below 448
GRANULARITIES = ("tensor", "head", "block")
# "none": no scaling at all (x cast to e4m3 directly, saturating at ±448): the control of the experiments
QUANTIZERS = ("none",) + GRANULARITIES
OUT_DTYPES = (torch.bfloat16, torch.float16)
_LOG2E = 1.4426950408889634

FP8Config = FA2Config  # the same four launch parameters: BLOCK_M, BLOCK_N, num_warps, num_stages


# ---------------------------------------------------------------------------------------------------
# Quantisation and incoherent processing (torch)
# ---------------------------------------------------------------------------------------------------


def _check_granularity(granularity: str, allowed: tuple[str, ...] = QUANTIZERS) -> None:
    if granularity not in allowed:
        raise ValueError(f"granularity must be one of {allowed}, got {granularity!r}")


def quantize(
    x: torch.Tensor, granularity: str = "block", block: int | None = None, *, check_finite: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``x`` ``[B, H, N, d]`` to e4m3: returns ``(x8, scale)`` with x ≈ x8.float() · scale.

    ``scale`` is float32: shape () for ``"tensor"``, (B, H) for ``"head"``, (B, H, ⌈N / block⌉) for
    ``"block"`` (``block`` rows of the sequence axis per scale; required there, ignored otherwise).
    ``"none"`` is the unscaled control: scale 1 (shape ()), x cast to e4m3 directly, saturating at ±448.
    scale = amax / 448 over the group, 1 for an all-zero group; values are clamped to ±448 after dividing
    (saturating). A group holding NaN or Inf gets a scale of +Inf (as in the fused quantiser, ``fp8_quant``):
    nothing is read back unless ``check_finite``, which raises ``ValueError`` for such values instead (one
    host synchronisation on a GPU).
    """
    _check_granularity(granularity)
    check_finite = check_flag("check_finite", check_finite)
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError(f"x must be a [batch, heads, seq, head_dim] tensor, got {getattr(x, 'shape', type(x))}")
    if not x.is_floating_point() or x.dtype == FP8:
        raise TypeError(f"x must be a float16, bfloat16 or float32 tensor to quantise, got {x.dtype}")
    b, h, n, d = x.shape
    xf = x.float()
    if granularity == "none":
        if check_finite and not bool(torch.isfinite(xf).all()):
            raise ValueError("cannot quantise a tensor with NaN or Inf values")
        return xf.clamp(-E4M3_MAX, E4M3_MAX).to(FP8), xf.new_ones(())
    if granularity == "tensor":
        amax = xf.abs().amax() if xf.numel() else xf.new_zeros(())
    elif granularity == "head":
        amax = xf.abs().amax(dim=(2, 3)) if n * d else xf.new_zeros((b, h))
    else:
        if block is None or int(block) < 1:
            raise ValueError(f"granularity 'block' needs a positive block size, got {block!r}")
        block = int(block)
        nblk = triton.cdiv(n, block)
        padded = torch.nn.functional.pad(xf, (0, 0, 0, nblk * block - n))
        amax = padded.reshape(b, h, nblk, block * d).abs().amax(dim=3) if d else xf.new_zeros((b, h, nblk))
    if check_finite and not bool(torch.isfinite(amax).all()):
        raise ValueError("cannot quantise a tensor with NaN or Inf values")
    amax = torch.where(torch.isnan(amax), float("inf"), amax)  # a NaN counts as +Inf, as in fp8_quant
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))  # +Inf where the group is not finite
    x8 = (xf / _expanded_scale(scale, x.shape, block)).clamp_(-E4M3_MAX, E4M3_MAX).to(FP8)
    return x8, scale


def _expanded_scale(scale: torch.Tensor, shape: torch.Size, block: int | None) -> torch.Tensor:
    """A scale of any granularity as a (B, H, N, 1) float32 tensor of one factor per row."""
    b, h, n, _ = shape
    if scale.dim() == 0:
        return scale.float().reshape(1, 1, 1, 1).expand(b, h, n, 1)
    if scale.dim() == 2:
        return scale.float()[:, :, None, None].expand(b, h, n, 1)
    return scale.float().repeat_interleave(block, dim=2)[:, :, :n, None]


def dequantize(x8: torch.Tensor, scale: torch.Tensor, block: int | None = None) -> torch.Tensor:
    """``x8.float() · scale`` in float32, for a scale of any granularity (``block``: rows per block scale)."""
    if scale.dim() == 3 and block is None:
        raise ValueError("a per-block scale needs its block size")
    _check_scale("scale", scale, x8.shape, block)
    return x8.float() * _expanded_scale(scale, x8.shape, block)


def hadamard(n: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """Sylvester's Hadamard matrix of order ``n`` (a power of two): entries ±1, H Hᵀ = n I."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"Sylvester's Hadamard matrix exists for powers of two only, got {n}")
    h = torch.ones((1, 1), device=device, dtype=dtype)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    return h


def rotation(d: int, seed: int = 0, device=None, dtype=torch.float32) -> torch.Tensor:
    """A random orthogonal ``d × d`` matrix for incoherent processing (drawn on the CPU from ``seed``).

    Power-of-two d: diag(s) · H_d / √d with s random signs (FlashAttention-3's choice: multiplying by it
    costs O(d log d) with a fast transform; here it is a plain matmul). Other d: the Q factor of a Gaussian
    matrix's QR factorisation, signs fixed so that it is Haar-distributed.
    """
    if d < 1:
        raise ValueError(f"head dim must be positive, got {d}")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    if d & (d - 1) == 0:
        signs = torch.randint(0, 2, (d,), generator=gen, dtype=torch.float64) * 2 - 1
        m = signs[:, None] * hadamard(d, dtype=torch.float64) / math.sqrt(d)
    else:
        qr_q, qr_r = torch.linalg.qr(torch.randn((d, d), generator=gen, dtype=torch.float64))
        m = qr_q * torch.sign(torch.diagonal(qr_r))[None, :]
    return m.to(device=device, dtype=dtype)


# ---------------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------------

CONFIG_ENV = "KERNELS_FP8_CONFIG"
MIN_CAPABILITY = (8, 9)  # Ada and Hopper have FP8 tensor cores; Ampere has none


def default_config(head_dim: int) -> FP8Config:
    """The tiles used when none is pinned (``config=`` or ``KERNELS_FP8_CONFIG``).

    Interpreter: 32×16, short on the CPU while crossing several tiles and scale blocks. GPU, head dim ≤ 128:
    64×128 tiles, 4 warps (one warpgroup), 3 stages: the best or within 4% of the best of ten tile shapes
    on an H200 at d = 128, N = 4096 and 16384, causal and not, per-tensor and per-block scales, with V
    sequence-contiguous (a one-off probe; 128×256 was up to 3% faster at N = 16384 without a mask but
    cannot take per-128-row scale blocks). Head dim 256: 128×64 with 8 warps, not swept (checked for
    correctness on the H200).
    """
    if INTERPRET:
        return FP8Config(32, 16, 4, 1)
    if head_dim <= 128:
        return FP8Config(64, 128, 4, 3)
    return FP8Config(128, 64, 8, 2)


def config_in_effect(head_dim: int, config: FP8Config | None = None) -> FP8Config:
    """``config`` if given, else ``KERNELS_FP8_CONFIG`` (``FA2Config`` form), else ``default_config``."""
    if config is not None:
        return config
    pinned = os.environ.get(CONFIG_ENV, "").strip()
    return FP8Config.parse(pinned) if pinned else default_config(head_dim)


# ---------------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------------


def _check_scale(name: str, scale, shape, block: int | None, values: bool = False) -> None:
    """One descale tensor against its operand's ``[B, H, N, d]`` shape: float32, and (``values``) finite
    and positive, which reads the scales back (a host synchronisation on a GPU)."""
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"{name} must be a float32 torch.Tensor, got {type(scale).__name__}")
    if scale.dtype != torch.float32:
        raise TypeError(f"{name} must have dtype torch.float32, got {scale.dtype}")
    b, h, n, _ = shape
    if scale.dim() == 3:
        if block is None or block < 1:
            raise ValueError(f"{name} is per block: its block size must be a positive int, got {block!r}")
        expected = (b, h, triton.cdiv(n, block))
    else:
        expected = {0: (), 2: (b, h)}.get(scale.dim())
    if tuple(scale.shape) != expected:
        raise ValueError(
            f"{name} has shape {tuple(scale.shape)}; expected () per tensor, {(b, h)} per head or "
            f"(B, H, ⌈N / block⌉) = {(b, h, '…')} per block, here {expected}"
        )
    if values and scale.numel() and not bool(((scale > 0) & torch.isfinite(scale)).all()):
        raise ValueError(f"{name} must be positive and finite everywhere")


def _check_fp8_inputs(q8, k8, v8) -> None:
    for name, t in (("q8", q8), ("k8", k8), ("v8", v8)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != FP8:
            raise TypeError(f"{name} must have dtype torch.float8_e4m3fn, got {t.dtype} (see quantize)")
        if t.dim() != 4:
            raise ValueError(f"{name} must be [batch, heads, seq, head_dim], got shape {tuple(t.shape)}")
    check_device(q8, k8, v8, names=("q8", "k8", "v8"))
    check_shapes(q8, k8, v8, ("q8", "k8", "v8"), dense=True)
    _check_fp8_device(q8.device)


def _check_fp8_device(device: torch.device) -> None:
    if device.type == "cuda":
        require_fp8_tensor_cores(compute_capability(device), str(device))


def _check_p_scale(p_scale) -> None:
    ok = isinstance(p_scale, (int, float)) and not isinstance(p_scale, bool) and 1 <= p_scale <= P_SCALE
    if not ok or math.log2(p_scale) != int(math.log2(p_scale)):
        raise ValueError(f"p_scale must be a power of two from 1 to {P_SCALE:g}, got {p_scale!r}")


def require_fp8_tensor_cores(capability: tuple[int, int], device: str) -> None:
    """Raise ``TypeError`` unless ``capability`` (major, minor) has FP8 tensor cores (≥ 8.9)."""
    if tuple(capability) < MIN_CAPABILITY:
        major, minor = capability
        raise TypeError(
            f"FP8 attention needs FP8 tensor cores (compute capability ≥ 8.9: Ada, Hopper or newer); "
            f"{device} has {major}.{minor}"
        )


KERNELS = ("auto", "fa3", "triton")


def kernel_for(device: torch.device, head_dim: int, kernel: str = "auto") -> str:
    """Which kernel runs: ``"fa3"`` (Hopper, head dims of ``fa3.HEAD_DIMS``) or ``"triton"`` for ``"auto"``;
    a named one as asked (its own checks refuse what it cannot run)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel != "auto":
        return kernel
    hopper = device.type == "cuda" and not INTERPRET and compute_capability(device)[0] == 9
    return "fa3" if hopper and head_dim in fa3.HEAD_DIMS else "triton"


def blocks(kernel: str, head_dim: int, config=None) -> tuple[int, int]:
    """(Q rows, K/V rows) per block scale for ``kernel``'s tiles: what ``quantize_qkv`` gives per-block scales
    for and what ``forward_quantized`` assumes by default."""
    if kernel == "fa3":
        cfg = fa3.config_in_effect(head_dim, config if isinstance(config, fa3.FA3Config) else None, fp8=True)
        return fa3.ROWS_PER_CONSUMER, cfg.block_n
    cfg = config_in_effect(head_dim, config)
    return cfg.block_m, cfg.block_n


_blocks_of = blocks  # for quantize_qkv, whose argument of that name hides the function


def forward_quantized(
    q8: torch.Tensor,
    k8: torch.Tensor,
    v8: torch.Tensor,
    q_scale: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    *,
    q_block: int | None = None,
    kv_block: int | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    config=None,
    check_scale_values: bool = False,
    p_scale: float = P_SCALE,
    kernel: str = "auto",
    schedule=None,
) -> torch.Tensor:
    """Attention of e4m3 inputs: ``softmax((q8·q_scale)(k8·k_scale)ᵀ · sm_scale) (v8·v_scale)``.

    Args:
        q8: ``[B, H, Nq, d]``; k8, v8: ``[B, H_kv, Nk, d]``, H_kv dividing H; all torch.float8_e4m3fn.
        q_scale, k_scale, v_scale: float32 descale factors, each of shape () (per tensor), (B, H) or
            (B, H_kv) (per head), or (B, H, ⌈N / block⌉) (per block of the sequence axis); positive and
            finite. k_scale and v_scale may differ in granularity.
        q_block, kv_block: rows per block of a per-block Q / K-V scale; default the kernel's (``blocks``).
            Must be multiples of its tiles, so that every tile has one scale per operand.
        out_dtype: torch.bfloat16 or torch.float16.
        config: pins the tiles: an ``FP8Config`` (the Triton kernel; else ``KERNELS_FP8_CONFIG``) or an
            ``fa3.FA3Config`` (the FA-3 kernel; else ``KERNELS_FA3_FP8_CONFIG``).
        check_scale_values: refuse scales that are not positive and finite, reading them back (one host
            synchronisation per scale on a GPU). Off by default, so that the call never waits for the GPU:
            the scales ``quantize`` and ``quantize_qkv`` make are positive, and finite where the inputs are
            (which their ``check_finite`` checks where the scales are made); turn it on for scales made
            elsewhere.
        p_scale: P ∈ [0, 1] is multiplied by this before its cast to e4m3 and divided out at the end: a
            power of two from 1 (no scaling: P's small entries fall into e4m3's subnormals, the smallest
            2⁻⁹) to 256 (the default: the smallest representable P becomes 2⁻¹⁷); P · p_scale ≤ 448.
        kernel: ``"auto"`` (FA-3 on Hopper where it handles the head dim, else Triton), ``"fa3"`` or
            ``"triton"``; schedule: the FA-3 kernel's, None for its FP8 default (``fa3.FP8_SCHEDULE``), or a
            ``fa3.Schedule`` or name of ``fa3.SCHEDULES`` (the ablation's: FA-3's full schedule, ``"fa3"``,
            and each technique switched off from it).

    Speed: FP8 wgmma needs its B operand K-major, so for P·V both kernels want V with the sequence axis
    contiguous. The FA-3 kernel reads V in a layout of its own, ``fa3.FP8Values`` (``v8`` may be one:
    ``quantize_qkv(..., fa3_layout=True)`` or ``fa3.fp8_values``); a ``[B, H_kv, Nk, d]`` tensor is copied
    into it first. The Triton kernel wants ``v8`` as the ``[B, H_kv, Nk, d]`` view of a ``[B, H_kv, d, Nk]``
    tensor (``quantize_qkv`` makes it so); otherwise it transposes each tile in shared memory.

    Returns: ``[B, H, Nq, d]`` in ``out_dtype``. Nothing is read back to the host unless
    ``check_scale_values`` (the call can be captured in a CUDA graph). Raises ``TypeError``/``ValueError`` for
    wrong dtypes, shapes, scales, block sizes, kernels or devices, and ``TypeError`` on a GPU without FP8
    tensor cores.
    """
    causal = check_flag("causal", causal)
    fa3_values = v8 if isinstance(v8, fa3.FP8Values) else None
    if fa3_values is not None:  # checked as the [B, H_kv, Nk, d] view it stands for (values not read)
        v8 = fa3_values.data[..., : fa3_values.seqlen].transpose(-1, -2)
    _check_fp8_inputs(q8, k8, v8)
    _check_p_scale(p_scale)
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be torch.bfloat16 or torch.float16, got {out_dtype}")
    d = q8.shape[3]
    which = "fa3" if isinstance(config, fa3.FA3Config) else kernel_for(q8.device, d, kernel)
    qb, kvb = blocks(which, d, config)
    q_block = qb if q_block is None else int(q_block)
    kv_block = kvb if kv_block is None else int(kv_block)
    check = check_flag("check_scale_values", check_scale_values)
    for name, scale, operand, blk in (
        ("q_scale", q_scale, q8, q_block),
        ("k_scale", k_scale, k8, kv_block),
        ("v_scale", v_scale, v8, kv_block),
    ):
        _check_scale(name, scale, operand.shape, blk, check)
        if scale.device != q8.device:
            raise ValueError(f"{name} is on {scale.device} but q8 is on {q8.device}")
    if q_scale.dim() == 3 and q_block % qb:
        raise ValueError(f"q_block={q_block} must be a multiple of the kernel's {qb} query rows per tile")
    if (k_scale.dim() == 3 or v_scale.dim() == 3) and kv_block % kvb:
        raise ValueError(f"kv_block={kv_block} must be a multiple of the kernel's {kvb} keys per tile")
    _check_schedule(schedule, which)
    if fa3_values is not None and which != "fa3":
        raise ValueError(f"v8 is fa3.FP8Values, the FA-3 kernel's layout; this call runs {which}: pass V as a tensor")
    return _forward(
        q8,
        k8,
        fa3_values or v8,
        q_scale,
        k_scale,
        v_scale,
        causal,
        sm_scale,
        q_block,
        kv_block,
        out_dtype,
        config,
        p_scale,
        which,
        schedule,
    )


def _check_schedule(schedule, which: str) -> None:
    if which != "fa3" and schedule is not None and fa3.schedule_of(schedule) != fa3.SCHEDULES["fa3"]:
        raise ValueError(
            f"schedule={schedule!r} switches a technique of the FA-3 kernel: it needs the FA-3 kernel "
            f"(Hopper, head dims {fa3.HEAD_DIMS}); this call runs {which}"
        )


def _forward(
    q8,
    k8,
    v8,
    q_scale,
    k_scale,
    v_scale,
    causal: bool,
    sm_scale,
    q_block: int,
    kv_block: int,
    out_dtype: torch.dtype,
    config,
    p_scale: float,
    which: str,
    schedule,
) -> torch.Tensor:
    """``forward_quantized`` on checked arguments (``attention`` comes here straight from its quantiser, whose
    outputs need no checks): the kernel ``which`` (``v8``: ``fa3.FP8Values`` for FA-3)."""
    b, h, seqlen_q, d = q8.shape
    seqlen_k = k8.shape[2]
    sm_scale = softmax_scale(d, sm_scale)
    if which == "fa3":
        return fa3.forward_fp8(
            q8,
            k8,
            v8,
            q_scale,
            k_scale,
            v_scale,
            causal,
            sm_scale,
            q_block=q_block,
            kv_block=kv_block,
            out_dtype=out_dtype,
            config=config if isinstance(config, fa3.FA3Config) else None,
            schedule=schedule,
            p_scale=p_scale,
        )[0]
    cfg = config_in_effect(d, config)
    out = torch.empty((b, h, seqlen_q, d), device=q8.device, dtype=out_dtype)
    if out.numel() == 0 or seqlen_k == 0:  # nothing to compute, or no keys: every row sees nothing
        return out.zero_()
    block_d = max(32, triton.next_power_of_2(d))
    grid = (triton.cdiv(seqlen_q, cfg.block_m), b * h)
    with device_guard(q8):
        _fp8_fwd_kernel[grid](
            q8,
            k8,
            v8,
            out,
            q_scale,
            k_scale,
            v_scale,
            *q8.stride(),
            *k8.stride(),
            *v8.stride(),
            *out.stride(),
            *fa3.scale_strides(q_scale),
            *fa3.scale_strides(k_scale),
            *fa3.scale_strides(v_scale),
            q_block,
            kv_block,
            h,
            h // k8.shape[1],
            seqlen_q,
            seqlen_k,
            float(sm_scale),
            HEAD_DIM=d,
            BLOCK_D=block_d,
            IS_CAUSAL=bool(causal),
            EVEN_N=seqlen_k % cfg.block_n == 0,
            EVEN_D=d == block_d,
            V_SCALE_PER_TILE=v_scale.dim() == 3,
            EMULATE_P_CAST=INTERPRET,
            P_SCALE=p_scale,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
    return out


# ---------------------------------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------------------------------


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    granularity: str = "block",
    rotate: bool = False,
    *,
    seed: int = 0,
    config=None,
    p_scale: float = P_SCALE,
    kernel: str = "auto",
    schedule=None,
    check_finite: bool = False,
) -> torch.Tensor:
    """FP8 attention of bfloat16/float16 inputs: quantise Q, K, V to e4m3, then ``forward_quantized``.

    Args:
        q: ``[B, H, Nq, d]``; k, v: ``[B, H_kv, Nk, d]`` with H_kv dividing H; float16 or bfloat16, one dtype.
        causal: mask keys after the query, aligned to the bottom-right corner when Nq ≠ Nk.
        sm_scale: score scale, default ``1/sqrt(d)``.
        granularity: ``"tensor"``, ``"head"`` or ``"block"`` (per kernel tile, FlashAttention-3's choice);
            ``"none"`` casts without scaling (the experiments' control).
        rotate: incoherent processing: Q and K multiplied by ``rotation(d, seed)`` before quantising.
        seed: the rotation's seed; config, p_scale, kernel, schedule: as in ``forward_quantized``.
        check_finite: raise ``ValueError`` if q, k or v hold NaN or Inf: the fused quantiser counts such
            blocks on the device, and this reads the three counts back (one host synchronisation). Without it
            nothing is read back (the call can be captured in a CUDA graph), and non-finite inputs give
            non-finite outputs.

    Returns: ``[B, H, Nq, d]`` in the input dtype. Forward only: not differentiable.
    """
    causal = check_flag("causal", causal)
    rotate = check_flag("rotate", rotate)
    check_finite = check_flag("check_finite", check_finite)
    _check_granularity(granularity)
    check_tensors(
        q,
        k,
        v,
        4,
        "[batch, heads, seq, head_dim]",
        dense=True,
        dtypes=OUT_DTYPES,
        dtype_note="FP8 attention takes float16 or bfloat16 inputs",
    )
    _check_p_scale(p_scale)
    _check_fp8_device(q.device)
    which = "fa3" if isinstance(config, fa3.FA3Config) else kernel_for(q.device, q.shape[3], kernel)
    _check_schedule(schedule, which)
    qb, kvb = blocks(which, q.shape[3], config)
    q8, k8, v8, qs, ks, vs = quantize_qkv(
        q,
        k,
        v,
        granularity,
        blocks=(qb, kvb),
        rotate=rotate,
        seed=seed,
        check_finite=check_finite,
        fa3_layout=which == "fa3",
    )
    # (the quantiser's outputs are consistent by construction: no second round of checks)
    return _forward(q8, k8, v8, qs, ks, vs, causal, sm_scale, qb, kvb, q.dtype, config, p_scale, which, schedule)


_ROTATIONS: dict[tuple, torch.Tensor] = {}


def _rotation_on(d: int, seed: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``rotation(d, seed)`` on ``device`` in ``dtype``, made once per (d, seed, device, dtype): later calls
    copy nothing to the GPU, so they can be captured in a CUDA graph."""
    key = (d, seed, str(device), dtype)
    if key not in _ROTATIONS:
        _ROTATIONS[key] = rotation(d, seed, device=device, dtype=dtype)
    return _ROTATIONS[key]


def quantize_qkv(
    q,
    k,
    v,
    granularity: str,
    config=None,
    *,
    blocks: tuple[int, int] | None = None,
    rotate: bool = False,
    seed: int = 0,
    check_finite: bool = False,
    fa3_layout: bool = False,
):
    """Q, K, V quantised for ``forward_quantized`` by the fused quantiser (``fp8_quant``, no host
    synchronisation): ``(q8, k8, v8, q_scale, k_scale, v_scale)``, V laid out sequence-contiguous (``v8`` is
    the ``[B, H_kv, Nk, d]`` view of a ``[B, H_kv, d, Nk']`` tensor), or with ``fa3_layout`` written straight
    into the FA-3 kernel's layout (``v8`` a ``fa3.FP8Values``).

    The per-block scales' rows are ``blocks`` (Q rows, K/V rows), else ``config``'s tiles (an ``FP8Config``
    or an ``fa3.FA3Config``), else the Triton kernel's defaults. ``rotate``: incoherent processing, Q and K
    multiplied by ``rotation(d, seed)`` first (one matrix product each, in their dtype with fp32
    accumulation). ``check_finite``: raise ``ValueError`` for NaN or Inf inputs (reads the device-side counts
    back together: one synchronisation); otherwise nothing is read back, and they give non-finite scales, so
    non-finite outputs."""
    check_finite = check_flag("check_finite", check_finite)
    d = q.shape[-1]
    qb, kvb = blocks or _blocks_of("fa3" if isinstance(config, fa3.FA3Config) else "triton", d, config)
    if rotate:
        m = _rotation_on(d, seed, q.device, q.dtype if q.dtype in OUT_DTYPES else torch.float32)
        q, k = q @ m, k @ m
    # (the block rows matter to the "block" granularity only; the others ignore them)
    parts = [
        fp8_quant.quantize(q, granularity, qb),
        fp8_quant.quantize(k, granularity, kvb),
        fp8_quant.quantize(v, granularity, kvb, transpose=True, interleave=bool(fa3_layout)),
    ]
    if check_finite:
        fp8_quant.check_finite(parts, ("q", "k", "v"))
    (q8, qs, _), (k8, ks, _), (vt8, vs, _) = parts
    if fa3_layout:
        return q8, k8, fa3.FP8Values(vt8, v.shape[2]), qs, ks, vs
    return q8, k8, vt8.transpose(-1, -2), qs, ks, vs


# ---------------------------------------------------------------------------------------------------
# Emulation (the tests' same-arithmetic reference)
# ---------------------------------------------------------------------------------------------------


def emulate(
    q8,
    k8,
    v8,
    q_scale,
    k_scale,
    v_scale,
    causal=False,
    sm_scale=None,
    *,
    q_block=None,
    kv_block=None,
    block_n=16,
    p_scale=P_SCALE,
    row_sums="p",
) -> torch.Tensor:
    """The kernel's arithmetic in float64 torch: dequantised Q, K, V; the online softmax over ``block_n``-key
    tiles in order, with P · p_scale rounded to e4m3 (torch's cast) at each tile's running max; ℓ from the
    unrounded P (``row_sums="p"``: the Triton kernel), or from the rounded P that multiplies V (``"p8"``: the
    FA-3 kernel where its tensor cores take the row sums, ``fa3.fp8_row_sums``). Differs from the kernel by
    fp32-vs-float64 rounding, which now and then moves an element of P across an e4m3 rounding boundary (a
    change of one e4m3 step, 2⁻³ relative, in that element).
    Returns float64 ``[B, H, Nq, d]``."""
    if row_sums not in ("p", "p8"):
        raise ValueError(f"row_sums must be 'p' or 'p8', got {row_sums!r}")
    b, h, nq, d = q8.shape
    nk = k8.shape[2]
    sm_scale = softmax_scale(d, sm_scale)
    qd = dequantize(q8, q_scale, q_block).double()
    kd = dequantize(k8, k_scale, kv_block).double()
    vd = dequantize(v8, v_scale, kv_block).double()
    # the reference's scores (K repeated over grouped heads, the causal mask), in log2 units as the kernel's
    s = attention_scores(qd, kd, causal, sm_scale, None, torch.float64).reshape(b, h, nq, nk) * _LOG2E
    vd = grouped_values(vd, h, torch.float64).reshape(b, h, nk, d)
    m = torch.full((b, h, nq, 1), float("-inf"), dtype=torch.float64, device=q8.device)
    ell = torch.zeros((b, h, nq, 1), dtype=torch.float64, device=q8.device)
    acc = torch.zeros((b, h, nq, d), dtype=torch.float64, device=q8.device)
    for start in range(0, nk, block_n):
        st = s[..., start : start + block_n]
        m_new = torch.maximum(m, st.amax(dim=-1, keepdim=True))
        m_use = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp2(st - m_use)
        alpha = torch.exp2(m - m_use)
        p8 = round_p(p, p_scale)
        ell = ell * alpha + (p8 if row_sums == "p8" else p).sum(dim=-1, keepdim=True)
        acc = acc * alpha + p8 @ vd[..., start : start + block_n, :]
        m = m_new
    return torch.where(ell > 0, acc / torch.where(ell > 0, ell, torch.ones_like(ell)), torch.zeros_like(acc))
