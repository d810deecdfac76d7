"""Split-KV decoding attention (FlashDecoding) in Triton: a few query rows against a long K/V cache.

The FA-2 forward gives such a shape only B·H programs, far fewer than a GPU has multiprocessors; here the key
sequence is also split into ``num_splits`` chunks (by default enough to fill the GPU, each at least one key
block): one program per (chunk, batch·head) runs the FA-2 inner loop (``common.attn_fwd_inner``) over its
chunk, and a second kernel merges the partial outputs O_s by their logsumexps L_s: with L = log Σ_s exp(L_s),
O = Σ_s exp(L_s − L) · O_s, exact up to rounding.

Handles: query length 1…16, any key length, grouped-query K/V heads, causal masks aligned bottom-right (the
last query row sees every key), head dims 1…256, float16 and bfloat16 on a GPU, exact float32, any strides.
Tested in the interpreter (tests/kernels/test_decode.py) and on an H200, bf16 included.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._runtime import INTERPRET, check_flag, check_int, device_guard, multiprocessor_count, softmax_scale
from kernels.attention.common import attn_fwd_inner, check_dense

__all__ = ["attention", "forward", "choose_splits", "last_splits", "MAX_QUERY_LEN"]

MAX_QUERY_LEN = 16
BLOCK_M = 16  # query rows per program: the whole (short) query
BLOCK_N = 16 if INTERPRET else 64  # keys per inner step
NUM_WARPS = 4
NUM_STAGES = 1 if INTERPRET else 3
PROGRAMS_PER_SM = 2  # split count target: (split, batch·head) programs per multiprocessor (H200 sweep)


# ---------------------------------------------------------------------------------------------------
# Triton kernels
# ---------------------------------------------------------------------------------------------------


@triton.jit
def _decode_split_kernel(
    Q,  # (B, H, Nq, d)
    K,  # (B, H_kv, Nk, d)
    V,  # (B, H_kv, Nk, d)
    PART_O,  # (S, B·H, Nq, d) fp32: normalised output of each split
    PART_LSE,  # (S, B·H, Nq) fp32: natural-log logsumexp of each split (-inf if it saw no key)
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
    group,
    seqlen_q,
    seqlen_k,
    chunk,  # keys per split, a multiple of BLOCK_N
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    IS_FP32: tl.constexpr,
    EVEN_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    split = tl.program_id(0)
    off_bh = tl.program_id(1)
    num_bh = tl.num_programs(1)
    off_b = (off_bh // num_heads).to(tl.int64)
    off_h = (off_bh % num_heads).to(tl.int64)
    off_hk = off_h // group
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d[None, :] < HEAD_DIM
    q = tl.load(
        Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
        mask=(offs_m[:, None] < seqlen_q) & d_ok,
        other=0.0,
    )
    k_ptrs = K + off_b * stride_kb + off_hk * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
    v_ptrs = V + off_b * stride_vb + off_hk * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
    lo = split * chunk
    hi = tl.minimum(lo + chunk, seqlen_k)
    # bottom-right causal alignment: the last query row sees every key, earlier rows one fewer each
    diag = seqlen_k - seqlen_q
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    # every tile goes through the masked path: the split's last tile and the diagonal both need masks
    acc, l_i, m_i = attn_fwd_inner(
        acc,
        l_i,
        m_i,
        q,
        k_ptrs,
        v_ptrs,
        stride_kn,
        stride_vn,
        offs_m,
        offs_n,
        offs_d,
        lo,
        hi,
        seqlen_k,
        diag,
        sm_scale * 1.4426950408889634,
        HEAD_DIM,
        BLOCK_N,
        True,
        IS_CAUSAL,
        EVEN_D,
        IS_FP32,
    )
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    row = (split * num_bh + off_bh).to(tl.int64) * seqlen_q + offs_m
    m_ok = offs_m < seqlen_q
    tl.store(PART_LSE + row, lse, mask=m_ok)
    tl.store(PART_O + row[:, None] * HEAD_DIM + offs_d[None, :], acc / l_safe[:, None], mask=m_ok[:, None] & d_ok)


@triton.jit
def _decode_merge_kernel(
    PART_O,  # (S, B·H, Nq, d) fp32
    PART_LSE,  # (S, B·H, Nq) fp32
    Out,  # (B, H, Nq, d) contiguous
    LSE,  # (B·H, Nq) fp32
    num_splits,
    rows,  # B·H·Nq
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """One program per output row: weights exp(L_s − L) over the splits, then the weighted sum."""
    row = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < num_splits
    lse_s = tl.load(PART_LSE + offs_s * rows + row, mask=s_ok, other=float("-inf"))
    m = tl.max(lse_s, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.where(lse_s == float("-inf"), 0.0, tl.exp(lse_s - m_safe))
    total = tl.sum(w, 0)
    o_s = tl.load(
        PART_O + (offs_s[:, None] * rows + row) * HEAD_DIM + offs_d[None, :],
        mask=s_ok[:, None] & (offs_d[None, :] < HEAD_DIM),
        other=0.0,
    )
    total_safe = tl.where(total > 0.0, total, 1.0)
    o = tl.sum(o_s * w[:, None], 0) / total_safe
    tl.store(Out + row * HEAD_DIM + offs_d, o.to(Out.dtype.element_ty), mask=offs_d < HEAD_DIM)
    tl.store(LSE + row, tl.where(total > 0.0, m_safe + tl.log(total_safe), float("-inf")))


# ---------------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------------


_LAST_SPLITS: list[int | None] = [None]


def last_splits() -> int | None:
    """The number of key splits the most recent ``forward`` call ran (after rounding to whole key blocks)."""
    return _LAST_SPLITS[0]


def choose_splits(batch_heads: int, seqlen_k: int, device: torch.device) -> int:
    """Enough (split, batch·head) programs to give every multiprocessor ``PROGRAMS_PER_SM`` of them, each
    split at least one key block, at most 128 splits."""
    blocks = max(1, triton.cdiv(seqlen_k, BLOCK_N))
    target = PROGRAMS_PER_SM * multiprocessor_count(device, 4)  # 4 in the interpreter: a few splits
    return max(1, min(blocks, 128, triton.cdiv(target, max(batch_heads, 1))))


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    *,
    num_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-KV decoding attention. Returns ``(out [B, H, Nq, d], lse [B, H, Nq] float32)``.

    ``num_splits``: the number of key chunks (an int >= 1; rounded to whole key blocks, ``last_splits()``
    says what ran); None chooses it from the shape (``choose_splits``).
    """
    causal = check_flag("causal", causal)
    if num_splits is not None:
        num_splits = check_int("num_splits", num_splits, minimum=1)
    check_dense(q, k, v)
    b, h, seqlen_q, d = q.shape
    seqlen_k = k.shape[2]
    if seqlen_q > MAX_QUERY_LEN:
        raise ValueError(f"decoding attention takes 1 to {MAX_QUERY_LEN} query rows, got {seqlen_q}; use fa2")
    sm_scale = softmax_scale(d, sm_scale)
    out = torch.empty((b, h, seqlen_q, d), device=q.device, dtype=q.dtype)  # the merge writes every row
    lse = torch.empty((b, h, seqlen_q), device=q.device, dtype=torch.float32)
    if out.numel() == 0 or seqlen_k == 0:  # no keys: every row sees nothing
        return out.zero_(), lse.fill_(float("-inf"))
    splits = num_splits or choose_splits(b * h, seqlen_k, q.device)
    chunk = triton.cdiv(triton.cdiv(seqlen_k, splits), BLOCK_N) * BLOCK_N
    splits = triton.cdiv(seqlen_k, chunk)  # no empty trailing split
    _LAST_SPLITS[0] = splits
    part_o = torch.empty((splits, b * h, seqlen_q, d), device=q.device, dtype=torch.float32)
    part_lse = torch.empty((splits, b * h, seqlen_q), device=q.device, dtype=torch.float32)
    block_d = max(16, triton.next_power_of_2(d))
    with device_guard(q):
        _decode_split_kernel[(splits, b * h)](
            q,
            k,
            v,
            part_o,
            part_lse,
            *q.stride(),
            *k.stride(),
            *v.stride(),
            h,
            h // k.shape[1],
            seqlen_q,
            seqlen_k,
            chunk,
            float(sm_scale),
            HEAD_DIM=d,
            BLOCK_D=block_d,
            IS_CAUSAL=causal,
            IS_FP32=q.dtype == torch.float32,
            EVEN_D=d == block_d,
            BLOCK_M=BLOCK_M,
            BLOCK_N=BLOCK_N,
            num_warps=NUM_WARPS,
            num_stages=NUM_STAGES,
        )
        _decode_merge_kernel[(b * h * seqlen_q,)](
            part_o,
            part_lse,
            out,
            lse,
            splits,
            b * h * seqlen_q,
            HEAD_DIM=d,
            BLOCK_D=block_d,
            BLOCK_S=max(2, triton.next_power_of_2(splits)),
        )
    return out, lse


def attention(
    q, k, v, causal: bool = False, sm_scale: float | None = None, *, num_splits: int | None = None
) -> torch.Tensor:
    """Decoding attention for ``[B, H, 1…16, d]`` queries against ``[B, H_kv, Nk, d]`` keys and values
    (``num_splits`` as ``forward``)."""
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v)):
        raise NotImplementedError("decoding attention is inference-only; use kernels.attention.fa2 for training")
    return forward(q, k, v, causal=causal, sm_scale=sm_scale, num_splits=num_splits)[0]
