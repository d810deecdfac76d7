"""FlashAttention-1 as published (Dao et al. 2022, Algorithms 1 and 4), in Triton.

The paper's loop order, kept on purpose so that the FA-1 → FA-2 gap and the FA-1 IO model
(``analysis.core.models.fa1_forward_bytes``) can be measured: one program per batch·head; the outer loop runs
over blocks of Bc keys/values, the inner loop over every block of Br query rows, whose O_i, ℓ_i and m_i are
read from HBM, updated, normalised and written back at every outer step (the traffic FA-2 removes by swapping
the loops). Deliberate deviations: Br and Bc are launch parameters, not the paper's formulas of the on-chip
memory size (Triton decides the layout; the audit's IO model uses the formulas), scores use exp2, ℓ and m stay
fp32, and causal masking skips key blocks above the diagonal (bottom-right aligned, as ``fa2``); no dropout.
The backward is the paper's Algorithm 4 (dQ read-modified-written in HBM at every inner step), P recomputed
from the saved logsumexp.

Handles: any lengths, Nq ≠ Nk, head dims 1…256, float16 and bfloat16 on a GPU, float32, any strides. Tested
in the interpreter (tests/kernels/test_fa1.py) and on an H200 (the pipeline's ``ours-fa1`` rows, each checked
against float64 before it is timed).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels._runtime import INTERPRET, check_flag, check_int, device_guard, softmax_scale
from kernels.attention.common import check_dense, check_grad_shapes

__all__ = ["attention", "forward", "backward", "DEFAULT_BLOCKS"]

DEFAULT_BLOCKS = (16, 16) if INTERPRET else (64, 64)


# ---------------------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------------------


@triton.jit
def _fa1_fwd_kernel(
    Q,  # (B, H, Nq, d)
    K,  # (B, H, Nk, d)
    V,  # (B, H, Nk, d)
    O,  # (B, H, Nq, d) contiguous, zero-initialised: read and written at every outer step  # noqa: E741
    L,  # (B, H, Nq) fp32 row sums ℓ, zero-initialised
    M,  # (B, H, Nq) fp32 row maxima m (log2 domain), initialised to -inf
    stride_qb,
    stride_qh,
    stride_qm,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_vd,
    num_heads,
    seqlen_q,
    seqlen_k,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    IS_FP32: tl.constexpr,
    BLOCK_R: tl.constexpr,  # Br, query rows per inner step
    BLOCK_C: tl.constexpr,  # Bc, keys per outer step
):
    off_bh = tl.program_id(0)
    off_b = (off_bh // num_heads).to(tl.int64)
    off_h = (off_bh % num_heads).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d[None, :] < HEAD_DIM
    qk_scale = sm_scale * 1.4426950408889634
    diag = seqlen_k - seqlen_q
    o_base = O + off_bh.to(tl.int64) * seqlen_q * HEAD_DIM
    stat_base = off_bh.to(tl.int64) * seqlen_q

    for start_c in range(0, seqlen_k, BLOCK_C):  # outer loop: K_j, V_j loaded once
        offs_c = start_c + tl.arange(0, BLOCK_C)
        kv_mask = (offs_c[:, None] < seqlen_k) & d_ok
        k = tl.load(
            K + off_b * stride_kb + off_h * stride_kh + offs_c[:, None] * stride_kn + offs_d[None, :] * stride_kd,
            mask=kv_mask,
            other=0.0,
        )
        v = tl.load(
            V + off_b * stride_vb + off_h * stride_vh + offs_c[:, None] * stride_vn + offs_d[None, :] * stride_vd,
            mask=kv_mask,
            other=0.0,
        )
        # under the causal mask, query rows before start_c - diag see none of these keys
        lo = 0
        if IS_CAUSAL:
            lo = (tl.maximum(start_c - diag, 0) // BLOCK_R) * BLOCK_R
        for start_r in range(lo, seqlen_q, BLOCK_R):  # inner loop: Q_i, O_i, ℓ_i, m_i from HBM
            offs_r = start_r + tl.arange(0, BLOCK_R)
            r_ok = offs_r < seqlen_q
            q_mask = r_ok[:, None] & d_ok
            q = tl.load(
                Q + off_b * stride_qb + off_h * stride_qh + offs_r[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=q_mask,
                other=0.0,
            )
            o_ptrs = o_base + offs_r[:, None] * HEAD_DIM + offs_d[None, :]
            o = tl.load(o_ptrs, mask=q_mask, other=0.0).to(tl.float32)
            l_i = tl.load(L + stat_base + offs_r, mask=r_ok, other=0.0)
            m_i = tl.load(M + stat_base + offs_r, mask=r_ok, other=float("-inf"))

            if IS_FP32:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            keep = r_ok[:, None] & (offs_c[None, :] < seqlen_k)
            if IS_CAUSAL:
                keep = keep & (offs_c[None, :] <= offs_r[:, None] + diag)
            s = tl.where(keep, s * qk_scale, float("-inf"))
            m_blk = tl.max(s, 1)  # m̃_ij
            m_blk_safe = tl.where(m_blk == float("-inf"), 0.0, m_blk)
            p = tl.math.exp2(s - m_blk_safe[:, None])  # P̃_ij
            l_blk = tl.sum(p, 1)  # ℓ̃_ij
            m_new = tl.maximum(m_i, m_blk)
            m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            a = tl.math.exp2(m_i - m_new_safe)  # weight of the old state
            # weight of the new block; zero for rows with no visible key in it
            b = tl.where(m_blk == float("-inf"), 0.0, tl.math.exp2(m_blk_safe - m_new_safe))
            l_new = a * l_i + b * l_blk
            if IS_FP32:
                pv = tl.dot(p, v, input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            # the paper's update: O_i ← diag(ℓ_new)⁻¹ (diag(ℓ_i) e^{m_i − m_new} O_i + e^{m̃ − m_new} P̃ V_j)
            l_div = tl.where(l_new > 0.0, l_new, 1.0)
            o = ((a * l_i)[:, None] * o + b[:, None] * pv) / l_div[:, None]
            tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=q_mask)
            tl.store(L + stat_base + offs_r, l_new, mask=r_ok)
            tl.store(M + stat_base + offs_r, m_new, mask=r_ok)


@triton.jit
def _fa1_bwd_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DQ,  # (B, H, Nq, d) fp32, zero-initialised: read, updated and written back at every step
    DK,
    DV,  # (B, H, Nk, d) contiguous
    stride_qb,
    stride_qh,
    stride_qm,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_dob,
    stride_doh,
    stride_dom,
    stride_dod,
    num_heads,
    seqlen_q,
    seqlen_k,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    IS_FP32: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Algorithm 4: outer loop over K/V blocks (dK_j, dV_j on chip), inner loop over query blocks, dQ_i
    read from HBM, updated and written back at every step (one program per batch·head, so no races)."""
    off_bh = tl.program_id(0)
    off_b = (off_bh // num_heads).to(tl.int64)
    off_h = (off_bh % num_heads).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d[None, :] < HEAD_DIM
    qk_scale = sm_scale * 1.4426950408889634
    diag = seqlen_k - seqlen_q
    stat_base = off_bh.to(tl.int64) * seqlen_q
    dq_base = DQ + off_bh.to(tl.int64) * seqlen_q * HEAD_DIM
    g_base = off_bh.to(tl.int64) * seqlen_k * HEAD_DIM
    for start_c in range(0, seqlen_k, BLOCK_C):
        offs_c = start_c + tl.arange(0, BLOCK_C)
        kv_mask = (offs_c[:, None] < seqlen_k) & d_ok
        k = tl.load(
            K + off_b * stride_kb + off_h * stride_kh + offs_c[:, None] * stride_kn + offs_d[None, :] * stride_kd,
            mask=kv_mask,
            other=0.0,
        )
        v = tl.load(
            V + off_b * stride_vb + off_h * stride_vh + offs_c[:, None] * stride_vn + offs_d[None, :] * stride_vd,
            mask=kv_mask,
            other=0.0,
        )
        dk = tl.zeros([BLOCK_C, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_C, BLOCK_D], dtype=tl.float32)
        lo = 0
        if IS_CAUSAL:
            lo = (tl.maximum(start_c - diag, 0) // BLOCK_R) * BLOCK_R
        for start_r in range(lo, seqlen_q, BLOCK_R):
            offs_r = start_r + tl.arange(0, BLOCK_R)
            r_ok = offs_r < seqlen_q
            q_mask = r_ok[:, None] & d_ok
            q = tl.load(
                Q + off_b * stride_qb + off_h * stride_qh + offs_r[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=q_mask,
                other=0.0,
            )
            do = tl.load(
                DO
                + off_b * stride_dob
                + off_h * stride_doh
                + offs_r[:, None] * stride_dom
                + offs_d[None, :] * stride_dod,
                mask=q_mask,
                other=0.0,
            )
            lse = tl.load(LSE + stat_base + offs_r, mask=r_ok, other=0.0) * 1.4426950408889634
            delta = tl.load(DELTA + stat_base + offs_r, mask=r_ok, other=0.0)
            if IS_FP32:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            keep = r_ok[:, None] & (offs_c[None, :] < seqlen_k)
            if IS_CAUSAL:
                keep = keep & (offs_c[None, :] <= offs_r[:, None] + diag)
            p = tl.where(keep, tl.math.exp2(s * qk_scale - lse[:, None]), 0.0)
            if IS_FP32:
                dv += tl.dot(tl.trans(p), do, input_precision="ieee")
                dp = tl.dot(do, tl.trans(v), input_precision="ieee")
            else:
                dv += tl.dot(tl.trans(p.to(do.dtype)), do)
                dp = tl.dot(do, tl.trans(v))
            ds = p * (dp - delta[:, None]) * sm_scale
            dq_ptrs = dq_base + offs_r[:, None] * HEAD_DIM + offs_d[None, :]
            dq = tl.load(dq_ptrs, mask=q_mask, other=0.0)
            if IS_FP32:
                dq += tl.dot(ds, k, input_precision="ieee")
                dk += tl.dot(tl.trans(ds), q, input_precision="ieee")
            else:
                dq += tl.dot(ds.to(k.dtype), k)
                dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
            tl.store(dq_ptrs, dq, mask=q_mask)
        g_ptrs = g_base + offs_c[:, None] * HEAD_DIM + offs_d[None, :]
        tl.store(DK + g_ptrs, dk.to(DK.dtype.element_ty), mask=kv_mask)
        tl.store(DV + g_ptrs, dv.to(DV.dtype.element_ty), mask=kv_mask)


# ---------------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------------


def _blocks(blocks) -> tuple[int, int]:
    """(Br, Bc): ``DEFAULT_BLOCKS`` or two powers of two >= 16."""
    if blocks is None:
        return DEFAULT_BLOCKS
    if not isinstance(blocks, (tuple, list)) or len(blocks) != 2:
        raise TypeError(f"blocks must be a pair (Br, Bc), got {blocks!r}")
    out = []
    for name, blk in zip(("Br", "Bc"), blocks, strict=True):
        blk = check_int(f"blocks {name}", blk)
        if blk < 16 or blk & (blk - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {blk}")
        out.append(blk)
    return out[0], out[1]


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    *,
    blocks: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run Algorithm 1. Returns ``(out [B, H, Nq, d], lse [B, H, Nq] float32)``.

    ``blocks`` = (Br, Bc), powers of two ≥ 16; default ``DEFAULT_BLOCKS``.
    """
    causal = check_flag("causal", causal)
    check_dense(q, k, v)
    if k.shape[1] != q.shape[1]:
        raise ValueError("FlashAttention-1 here needs as many K/V heads as query heads (no grouped-query)")
    b, h, seqlen_q, d = q.shape
    seqlen_k = k.shape[2]
    sm_scale = softmax_scale(d, sm_scale)
    block_r, block_c = _blocks(blocks)
    out = torch.zeros((b, h, seqlen_q, d), device=q.device, dtype=q.dtype)
    row_sum = torch.zeros((b, h, seqlen_q), device=q.device, dtype=torch.float32)
    row_max = torch.full((b, h, seqlen_q), float("-inf"), device=q.device, dtype=torch.float32)
    if out.numel() and seqlen_k:
        with device_guard(q):
            _fa1_fwd_kernel[(b * h,)](
                q,
                k,
                v,
                out,
                row_sum,
                row_max,
                *q.stride(),
                *k.stride(),
                *v.stride(),
                h,
                seqlen_q,
                seqlen_k,
                float(sm_scale),
                HEAD_DIM=d,
                BLOCK_D=max(16, triton.next_power_of_2(d)),
                IS_CAUSAL=bool(causal),
                IS_FP32=q.dtype == torch.float32,
                BLOCK_R=block_r,
                BLOCK_C=block_c,
            )
    seen = row_sum > 0
    lse = torch.where(seen, (row_max + torch.log2(torch.where(seen, row_sum, 1.0))) * math.log(2), -math.inf)
    return out, lse


def backward(do, q, k, v, out, lse, causal: bool = False, sm_scale: float | None = None, *, blocks=None):
    """Algorithm 4's gradients (dq, dk, dv); P recomputed from the saved logsumexp (the paper keeps ℓ and
    m, the same information). dQ is accumulated in fp32 in HBM, read and written at every step."""
    causal = check_flag("causal", causal)
    check_dense(q, k, v)
    if k.shape[1] != q.shape[1]:
        raise ValueError("FlashAttention-1 here needs as many K/V heads as query heads (no grouped-query)")
    b, h, seqlen_q, d = q.shape
    seqlen_k = k.shape[2]
    check_grad_shapes(do, out, lse, q.shape, (b, h, seqlen_q), q)
    sm_scale = softmax_scale(d, sm_scale)
    block_r, block_c = _blocks(blocks)
    dq = torch.zeros((b, h, seqlen_q, d), device=q.device, dtype=torch.float32)
    dk = torch.zeros((b, h, seqlen_k, d), device=q.device, dtype=q.dtype)
    dv = torch.zeros((b, h, seqlen_k, d), device=q.device, dtype=q.dtype)
    if q.numel() and k.numel():
        do = do.to(q.dtype)
        # Δ = rowsum(dO ∘ O) in fp32, summed in one order whatever the layouts of dO and O (a strided sum
        # reduces in another order, and dQ would differ in the last bit with the layout)
        delta = (do.float().contiguous() * out.float().contiguous()).sum(-1)
        with device_guard(q):
            _fa1_bwd_kernel[(b * h,)](
                q,
                k,
                v,
                do,
                lse.contiguous(),
                delta,
                dq,
                dk,
                dv,
                *q.stride(),
                *k.stride(),
                *v.stride(),
                *do.stride(),
                h,
                seqlen_q,
                seqlen_k,
                float(sm_scale),
                HEAD_DIM=d,
                BLOCK_D=max(16, triton.next_power_of_2(d)),
                IS_CAUSAL=bool(causal),
                IS_FP32=q.dtype == torch.float32,
                BLOCK_R=block_r,
                BLOCK_C=block_c,
            )
    return dq.to(q.dtype), dk, dv


class _FlashAttention1(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale):
        out, lse = forward(q, k, v, causal=causal, sm_scale=sm_scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.sm_scale = causal, sm_scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        return (*backward(grad_out, q, k, v, out, lse, ctx.causal, ctx.sm_scale), None, None)


# ---------------------------------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------------------------------


def attention(q, k, v, causal: bool = False, sm_scale: float | None = None) -> torch.Tensor:
    """FlashAttention-1 (Algorithm 1 forward, Algorithm 4 backward): ``softmax(q kᵀ · sm_scale [+ mask]) v``.

    Shapes and dtypes as ``kernels.attention.fa2.attention`` (same number of K/V and query heads).
    """
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v)):
        return _FlashAttention1.apply(q, k, v, causal, sm_scale)
    out, _ = forward(q, k, v, causal=causal, sm_scale=sm_scale)
    return out
