"""What several attention ops share: the input checks, and the Triton tiles of the FA-2 forward loop.

Checks (host): ``check_tensors`` and ``check_shapes`` (fa2, fa3, fp8), ``check_dense`` (fa2, fa1, decode),
``check_grad_shapes`` (the backward passes of fa2 and fa1), ``check_head_dim`` (fa2's launch configurations).
Tiles (``@triton.jit``): ``key_tile_bounds``, ``load_kv_tile`` and ``mask_scores`` (the FA-2 kernels and FP8's
Triton kernel, decoding); ``tile_scores``, ``softmax_step`` and ``accumulate_pv``, one K/V tile of the online
softmax (the FA-2 forward's loop ``attn_fwd_inner`` and decoding's, ``decode_kernels.decode_inner``, which
walks a paged or a contiguous cache). What one op alone uses stays in its own modules.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._runtime import check_bf16, check_device

__all__ = [
    "MAX_HEAD_DIM",
    "SUPPORTED_DTYPES",
    "check_tensors",
    "check_shapes",
    "check_head_dim",
    "check_dense",
    "check_grad_shapes",
    "load_kv_tile",
    "mask_scores",
    "key_tile_bounds",
    "tile_scores",
    "softmax_step",
    "accumulate_pv",
    "attn_fwd_inner",
]

MAX_HEAD_DIM = 256
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ---------------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------------


def check_tensors(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ndim: int,
    layout: str,
    dense: bool = False,
    dtypes: tuple = SUPPORTED_DTYPES,
    dtype_note: str = "supported: float16, bfloat16, float32",
) -> None:
    """Q, K and V as tensors of ``ndim`` dims (``layout`` names them in the messages) of one of ``dtypes``,
    one dtype and one device, of shapes ``check_shapes`` accepts (heads on dim 1, head_dim last). The
    callers whose products are in the inputs' dtype add ``check_bf16``."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != ndim:
            raise ValueError(f"{name} must be {layout}, got shape {tuple(t.shape)}")
        if t.dtype not in dtypes:
            raise TypeError(f"{name} has dtype {t.dtype}; {dtype_note}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    check_device(q, k, v, names=("q", "k", "v"))
    check_shapes(q, k, v, dense=dense)


def check_shapes(q, k, v, names: tuple[str, str, str] = ("q", "k", "v"), dense: bool = False) -> None:
    """The shape rules every attention kernel here shares (heads on dim 1, head_dim last): K and V alike,
    K/V heads dividing the query heads, a supported head_dim; ``dense``: ``[batch, heads, seq, head_dim]``
    with K/V matching Q in batch and head_dim. ``names`` are the tensors' names in the messages."""
    nq, nk, nv = names
    h = q.shape[1]
    if k.shape != v.shape:
        raise ValueError(f"{nk} and {nv} must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if dense and (k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]):
        raise ValueError(f"{nk}/{nv} shape {tuple(k.shape)} does not match {nq} {tuple(q.shape)} in batch or head_dim")
    if (k.shape[1] == 0 and h != 0) or (k.shape[1] and h % k.shape[1]):
        raise ValueError(
            f"{nk}/{nv} have {k.shape[1]} heads, which must divide {nq}'s {h} (grouped-query / multi-query attention)"
        )
    check_head_dim(q.shape[-1])


def check_head_dim(head_dim: int) -> None:
    """A head dim the Triton kernels handle: 1 to ``MAX_HEAD_DIM`` (padded inside them to a power of two)."""
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim {head_dim} is not supported: this kernel handles 1 to {MAX_HEAD_DIM}")


def check_dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Dense ``[batch, heads, seq, head_dim]`` inputs: float16, float32, or bfloat16 on a GPU that has it."""
    check_tensors(q, k, v, 4, "[batch, heads, seq, head_dim]", dense=True)
    check_bf16(q.dtype, q.device, "q")


def check_grad_shapes(do, out, lse, q_shape, lse_shape, q: torch.Tensor | None = None) -> None:
    """A backward pass's side inputs: tensors of the forward's shapes (``do`` and ``out`` like q, ``lse`` of
    ``lse_shape``) on q's device; ``out`` in q's dtype (its rows are read in it), ``lse`` float32."""
    for name, t in (("grad_out", do), ("out", out), ("lse", lse)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if q is not None and t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    if q is not None and out.dtype != q.dtype:
        raise TypeError(f"out must have q's dtype {q.dtype} (the forward's output), got {out.dtype}")
    if lse.dtype != torch.float32:
        raise TypeError(f"lse must be float32 (the forward's logsumexp), got {lse.dtype}")
    if not do.is_floating_point():
        raise TypeError(f"grad_out must be floating point, got {do.dtype}")
    if do.shape != q_shape:
        raise ValueError(f"grad_out has shape {tuple(do.shape)}, expected {tuple(q_shape)}")
    if out.shape != q_shape:
        raise ValueError(f"out has shape {tuple(out.shape)}, expected {tuple(q_shape)}")
    if lse.shape != lse_shape:
        raise ValueError(f"lse has shape {tuple(lse.shape)}, expected {tuple(lse_shape)}")


# ---------------------------------------------------------------------------------------------------
# Triton tiles
# ---------------------------------------------------------------------------------------------------


@triton.jit
def load_kv_tile(ptrs, cols, offs_d, seqlen_k, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr, EVEN_D: tl.constexpr):
    """One (BLOCK_N, BLOCK_D) tile of K or V: rows past ``seqlen_k`` (masked tiles only) and head-dim
    padding columns read as 0."""
    if MASKED:
        mask = cols[:, None] < seqlen_k
        if not EVEN_D:
            mask = mask & (offs_d[None, :] < HEAD_DIM)
        tile = tl.load(ptrs, mask=mask, other=0.0)
    elif EVEN_D:
        tile = tl.load(ptrs)
    else:
        tile = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    return tile


@triton.jit
def mask_scores(qk, cols, offs_m, seqlen_k, diag, IS_CAUSAL: tl.constexpr):
    """Scores of keys past ``seqlen_k`` and, if causal, right of the bottom-right-aligned diagonal → -inf."""
    keep = cols[None, :] < seqlen_k
    if IS_CAUSAL:
        keep = keep & (cols[None, :] <= offs_m[:, None] + diag)
    return tl.where(keep, qk, float("-inf"))


@triton.jit
def key_tile_bounds(
    start_m,
    seqlen_q,
    seqlen_k,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    EVEN_N: tl.constexpr,
):
    """Key range of the query block at ``start_m``: ``(diag, full_hi, hi)``.

    Keys in [0, full_hi) are visible to every row of the block (the unmasked fast loop); [full_hi, hi)
    are tiles that cross the causal diagonal or the sequence end (masked); keys from hi on are hidden.
    ``diag`` = seqlen_k − seqlen_q aligns the causal mask to the bottom-right corner (0 when not causal).
    """
    if IS_CAUSAL:
        diag = seqlen_k - seqlen_q
        first_partial = tl.maximum(start_m + diag + 1, 0)  # keys below this are visible to every row
        full_hi = (first_partial // BLOCK_N) * BLOCK_N
        hi = tl.maximum(tl.minimum(seqlen_k, start_m + BLOCK_M + diag), full_hi)
    else:
        diag = 0
        if EVEN_N:
            full_hi = seqlen_k
        else:
            full_hi = (seqlen_k // BLOCK_N) * BLOCK_N
        hi = seqlen_k
    return diag, full_hi, hi


@triton.jit
def tile_scores(q, k, IS_FP32: tl.constexpr):
    """S = Q Kᵀ of one tile, fp32 (the scale is applied with the softmax's exponent)."""
    if IS_FP32:
        # the fp32 mode exists to be exact; Triton's default for an fp32 dot is TF32
        qk = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        qk = tl.dot(q, tl.trans(k))
    return qk


@triton.jit
def softmax_step(acc, l_i, m_i, qk, qk_scale, MASKED: tl.constexpr, EAGER_RESCALE: tl.constexpr):
    """One tile of scores into the online softmax: ``(p, acc, l_new, m_new)``, P̃ = exp2(S·scale − m_new) and
    the output so far rescaled to the new row max (lazy: by e^{m_old − m_new}; eager: un-normalised with the
    old ℓ as well, ``attn_fwd_inner`` says why)."""
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    if MASKED:
        # a row that has seen no visible key still has m = -inf; exp2(-inf - -inf) would be NaN
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    p = tl.math.exp2(qk * qk_scale - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_new = l_i * alpha + tl.sum(p, 1)
    if EAGER_RESCALE:
        acc = acc * (l_i * alpha)[:, None]  # un-normalise with the old ℓ (and the new max)
    else:
        acc = acc * alpha[:, None]
    return p, acc, l_new, m_new


@triton.jit
def accumulate_pv(acc, p, v, l_new, MASKED: tl.constexpr, IS_FP32: tl.constexpr, EAGER_RESCALE: tl.constexpr):
    """acc += P̃ V (P̃ cast to V's dtype for the tensor cores); eager rescaling then divides by the new ℓ."""
    if IS_FP32:
        acc = tl.dot(p, v, acc, input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v, acc)
    if EAGER_RESCALE:
        if MASKED:  # a row that has seen no visible key yet has ℓ = 0 and acc = 0: keep it 0
            acc = acc / tl.where(l_new > 0.0, l_new, 1.0)[:, None]
        else:  # every row sees a key of an unmasked tile: ℓ ≥ 1
            acc = acc / l_new[:, None]
    return acc


@triton.jit
def attn_fwd_inner(
    acc,  # (BLOCK_M, BLOCK_D) fp32 output so far: unnormalised (lazy), or divided by l_i (eager)
    l_i,  # (BLOCK_M,) fp32, running row sum of exp2
    m_i,  # (BLOCK_M,) fp32, running row max in the scaled log2 domain
    q,  # (BLOCK_M, BLOCK_D) input dtype, pre-loaded
    k_ptrs,  # (BLOCK_N, BLOCK_D) pointers to the first K tile of this batch·head
    v_ptrs,  # (BLOCK_N, BLOCK_D) pointers to the first V tile
    stride_kn,
    stride_vn,
    offs_m,
    offs_n,
    offs_d,
    lo,
    hi,
    seqlen_k,
    diag,  # seqlen_k - seqlen_q: bottom-right causal alignment
    qk_scale,  # sm_scale * log2(e)
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    EVEN_D: tl.constexpr,
    IS_FP32: tl.constexpr,
    EAGER_RESCALE: tl.constexpr = False,
):
    """Stream the K/V tiles [lo, hi) through the online softmax of one Q tile.

    Lazy rescaling (default): ``acc`` stays unnormalised and the caller divides by ℓ once, at the end.
    ``EAGER_RESCALE``: ``acc`` is kept normalised after every tile, as FlashAttention-1 does
    (O ← diag(ℓ_new)⁻¹ (diag(ℓ_old) e^{m_old - m_new} O + P̃ V)): an extra BLOCK_M×BLOCK_D multiply and a
    division per tile, for the rescaling ablation.
    """
    k_ptrs += lo * stride_kn
    v_ptrs += lo * stride_vn
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        k = load_kv_tile(k_ptrs, cols, offs_d, seqlen_k, HEAD_DIM, MASKED, EVEN_D)
        qk = tile_scores(q, k, IS_FP32)
        if MASKED:
            qk = mask_scores(qk, cols, offs_m, seqlen_k, diag, IS_CAUSAL)
        p, acc, l_new, m_new = softmax_step(acc, l_i, m_i, qk, qk_scale, MASKED, EAGER_RESCALE)
        v = load_kv_tile(v_ptrs, cols, offs_d, seqlen_k, HEAD_DIM, MASKED, EVEN_D)
        acc = accumulate_pv(acc, p, v, l_new, MASKED, IS_FP32, EAGER_RESCALE)
        l_i = l_new
        m_i = m_new
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    return acc, l_i, m_i
