"""Reference attention implementations, used by the tests and as benchmark baselines alike.

- ``naive_attention``: the three-step materialising attention the articles describe (``baddbmm`` for the
  scaled scores S, ``softmax`` for P, ``bmm`` for O), in the input dtype. S and P are N×N tensors in HBM:
  this is the baseline whose memory and traffic FlashAttention removes.
- ``reference_attention``: the same computation in float64 (on the given query rows only, so that a
  long-sequence benchmark point can still be checked exactly at O(rows·N·d) cost).
- ``attention_grads``: output and gradients (dq, dk, dv) of the three-step attention by autograd, in
  float64 (the ground truth for a backward pass) or in the input dtype (plain PyTorch's own error).
- ``online_softmax_attention``: the tiled online-softmax algorithm itself in float64 (running max and sum,
  one key block at a time), with the rescaling of the running sum and output switchable off: the
  textbook mistake whose effect the claims audit measures.
- ``attention_scores``, ``grouped_values``: the first step (the scaled, masked S) and V per query head, the
  pieces the materialising references are built from; ``fp8.emulate`` builds its arithmetic on them too.
- ``sdpa_attention``: ``torch.nn.functional.scaled_dot_product_attention`` pinned to one backend
  (``math``, ``efficient``, ``flash``, ``cudnn``), so a benchmark row names exactly what ran.
- ``gather_paged``: a paged K/V cache (``kernels.attention.decode``'s layouts) gathered into one contiguous
  ``[B, H_kv, N, d]`` tensor, zero past each request's length; ``paged_reference_attention``: decoding on a
  paged cache, request by request on the gathered keys, in float64 (or, ``exact=False``, three-step attention
  in the input dtype: plain PyTorch's error for the tolerance policy).

All take ``[B, H, N, d]`` tensors (K and V may have fewer heads, dividing H: grouped-query attention)
and share one masking convention with the Triton kernels: causal masks
are aligned to the bottom-right corner (query row i sees key j iff j <= i + Nk - Nq); a row that sees
no key gives zeros.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from kernels._runtime import softmax_scale

SDPA_BACKENDS = ("math", "efficient", "flash", "cudnn")
P_SCALE = 256.0  # what an FP8 attention kernel multiplies P by before its e4m3 cast (kernels.attention.fp8's)
E4M3_FLUSH = 2.0**-10  # half of e4m3's smallest subnormal (2⁻⁹): below it a value rounds to 0


def round_p(p: torch.Tensor, p_scale: float = P_SCALE) -> torch.Tensor:
    """P as an FP8 kernel multiplies it into V, in float64: P · p_scale cast to e4m3, divided back."""
    return (p * p_scale).to(torch.float8_e4m3fn).to(torch.float64) / p_scale


def causal_mask(rows: torch.Tensor, seqlen_q: int, seqlen_k: int) -> torch.Tensor:
    """Boolean ``[len(rows), seqlen_k]``, True where the key is hidden from the query row."""
    cols = torch.arange(seqlen_k, device=rows.device)
    return cols[None, :] > rows[:, None] + (seqlen_k - seqlen_q)


def attention_scores(q, k, causal, sm_scale, rows, compute_dtype):
    """Step 1 of three-step attention: S = scale · Q Kᵀ ``[B·H, len(rows), Nk]`` in ``compute_dtype`` (all
    query rows when ``rows`` is None), masked entries -inf; K repeated over grouped query heads."""
    b, h, seqlen_q, d = q.shape
    seqlen_k = k.shape[2]
    if rows is None:
        rows_t = torch.arange(seqlen_q, device=q.device)
        qr = q
    else:
        rows_t = torch.as_tensor(rows, device=q.device, dtype=torch.long)
        qr = q.index_select(2, rows_t)
    if k.shape[1] != h:  # grouped-query: each K/V head serves h / h_kv query heads, in order
        k = k.repeat_interleave(h // k.shape[1], dim=1)
    qf = qr.to(compute_dtype).reshape(b * h, qr.shape[2], d)
    kf = k.to(compute_dtype).reshape(b * h, seqlen_k, d)
    # written to memory as an N×N tensor
    s = torch.baddbmm(
        torch.empty((1, 1, 1), dtype=compute_dtype, device=q.device),
        qf,
        kf.transpose(1, 2),
        beta=0.0,
        alpha=softmax_scale(d, sm_scale),
    )
    if causal:
        s.masked_fill_(causal_mask(rows_t, seqlen_q, seqlen_k)[None], float("-inf"))
    return s


def grouped_values(v, heads, compute_dtype):
    """V as ``[B·H, Nk, d]`` in ``compute_dtype``, repeated over grouped query heads."""
    if v.shape[1] != heads:
        v = v.repeat_interleave(heads // v.shape[1], dim=1)
    return v.to(compute_dtype).reshape(v.shape[0] * heads, v.shape[2], v.shape[3])


def _materialise(q, k, v, causal, sm_scale, rows, compute_dtype):
    b, h, seqlen_q, d = q.shape
    # step 1: S = scale · Q Kᵀ, written to memory as an N×N tensor
    s = attention_scores(q, k, causal, sm_scale, rows, compute_dtype)
    # step 2: P = softmax(S), another N×N tensor
    p = torch.softmax(s, dim=-1)
    del s
    if causal and seqlen_q > k.shape[2]:
        p = torch.nan_to_num(p, nan=0.0)  # rows that see no key
    # step 3: O = P V
    o = torch.bmm(p, grouped_values(v, h, compute_dtype))
    return o.reshape(b, h, p.shape[1], v.shape[3])


def naive_attention(q, k, v, causal: bool = False, sm_scale: float | None = None) -> torch.Tensor:
    """Three-step materialising attention in the input dtype (the articles' "standard attention")."""
    return _materialise(q, k, v, causal, sm_scale, None, q.dtype)


def naive_attention_rows(q, k, v, rows, causal: bool = False, sm_scale: float | None = None) -> torch.Tensor:
    """``naive_attention`` restricted to some query rows: identical arithmetic, row by row."""
    return _materialise(q, k, v, causal, sm_scale, rows, q.dtype)


def reference_attention(
    q, k, v, causal: bool = False, sm_scale: float | None = None, rows: Sequence[int] | torch.Tensor | None = None
) -> torch.Tensor:
    """Float64 attention (optionally only for ``rows`` of the query sequence): the ground truth."""
    return _materialise(q, k, v, causal, sm_scale, rows, torch.float64)


def _probabilities_rows(q, k, rows, causal, sm_scale):
    """Float64 P = exp(S − rowmax) ``[B·H, len(rows), Nk]`` (unnormalised; rows that see no key all 0)."""
    s = attention_scores(q, k, causal, sm_scale, rows, torch.float64)
    m = s.amax(dim=-1, keepdim=True)
    return torch.exp(s - torch.where(torch.isinf(m), torch.zeros_like(m), m)), torch.isfinite(s)


def p_rounded_attention_rows(q, k, v, rows, causal: bool = False, sm_scale: float | None = None, p_scale=P_SCALE):
    """Float64 attention of ``rows`` with P = exp(S − rowmax) rounded as an FP8 kernel rounds it before P·V
    (P · p_scale cast to e4m3, divided back) and the row sum taken from the unrounded P: the
    same-precision computation the tolerance policy bounds an FP8 attention kernel by (the kernel's
    running maximum moves the rounding points a little; the error is of the same size)."""
    p, _ = _probabilities_rows(q, k, rows, causal, sm_scale)
    ell = p.sum(dim=-1, keepdim=True)
    o = round_p(p, p_scale) @ grouped_values(v, q.shape[1], torch.float64)
    o = torch.where(ell > 0, o / torch.where(ell > 0, ell, torch.ones_like(ell)), torch.zeros_like(o))
    return o.reshape(q.shape[0], q.shape[1], -1, v.shape[3])


def p_underflow_rows(q, k, rows, causal: bool = False, sm_scale: float | None = None, p_scale=P_SCALE):
    """``(fraction, mass)`` of the visible entries of P = exp(S − rowmax) on the query ``rows`` that e4m3
    flushes to zero once multiplied by ``p_scale`` (below 2⁻¹⁰, half the smallest subnormal): their
    share of the entries and their share of the row sums, in float64."""
    p, visible = _probabilities_rows(q, k, rows, causal, sm_scale)
    flushed = visible & (p * p_scale < E4M3_FLUSH)
    count = visible.sum().item()
    if count == 0:
        return 0.0, 0.0
    return flushed.sum().item() / count, (p * flushed).sum().item() / p.sum().item()


def attention_grads(q, k, v, do, causal: bool = False, sm_scale: float | None = None, dtype=torch.float64):
    """``(out, dq, dk, dv)`` of three-step attention computed in ``dtype`` by autograd, for upstream
    gradient ``do``: float64 gives the reference gradients, the input dtype plain PyTorch's."""
    leaves = [t.detach().to(dtype).requires_grad_(True) for t in (q, k, v)]
    with torch.enable_grad():
        out = _materialise(*leaves, causal, sm_scale, None, dtype)
        grads = torch.autograd.grad(out, leaves, do.to(dtype))
    return (out.detach(), *grads)


def online_softmax_attention(q, k, v, block: int, rescale: bool = True, sm_scale: float | None = None):
    """Non-causal attention of ``q [M, d]`` against ``k, v [N, d]`` by the online softmax, ``block`` keys
    at a time, in float64.

    With ``rescale`` (the algorithm), when a block raises a row's running max m, the running sum ℓ and
    output O are multiplied by exp(m_old − m_new) before the block's terms are added: the result equals
    softmax(q kᵀ) v up to rounding. Without it, earlier blocks keep the weights of their own, smaller
    max, so they are over-weighted by exp(m_new − m_old) against later ones; with a single block the two
    are identical.
    """
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    scale = softmax_scale(q.shape[-1], sm_scale)
    m = torch.full((q.shape[0],), -math.inf, dtype=torch.float64, device=q.device)
    ell = torch.zeros_like(m)
    acc = torch.zeros((q.shape[0], v.shape[-1]), dtype=torch.float64, device=q.device)
    for start in range(0, k.shape[0], block):
        s = (q @ k[start : start + block].T) * scale
        m_new = torch.maximum(m, s.amax(dim=1))
        p = torch.exp(s - m_new[:, None])
        if rescale:
            alpha = torch.exp(m - m_new)
            ell, acc = ell * alpha, acc * alpha[:, None]
        ell = ell + p.sum(dim=1)
        acc = acc + p @ v[start : start + block]
        m = m_new
    return acc / ell[:, None]


def sdpa_attention(q, k, v, causal: bool = False, sm_scale: float | None = None, backend: str = "flash"):
    """PyTorch SDPA restricted to one backend; raises ``RuntimeError`` if that backend cannot run it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {
        "math": SDPBackend.MATH,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
    }
    if backend not in backends:
        raise ValueError(f"unknown SDPA backend {backend!r}; choose from {SDPA_BACKENDS}")
    seqlen_q, seqlen_k = q.shape[2], k.shape[2]
    kwargs = {"scale": sm_scale}
    if causal and seqlen_q != seqlen_k:
        # SDPA's is_causal is top-left aligned; the lower-right bias matches our convention
        from torch.nn.attention.bias import causal_lower_right

        kwargs["attn_mask"] = causal_lower_right(seqlen_q, seqlen_k)
    else:
        kwargs["is_causal"] = causal
    if k.shape[1] != q.shape[1]:
        kwargs["enable_gqa"] = True
    with sdpa_kernel([backends[backend]]):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


def gather_paged(
    cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    layout: str = "nhd",
    length: int | None = None,
) -> torch.Tensor:
    """Request b's first ``context_lens[b]`` keys (or values) of a paged ``cache`` (``[pages, page, H_kv, d]``
    for ``layout="nhd"``, ``[pages, H_kv, page, d]`` for ``"hnd"``), gathered through ``block_table [B, P]``
    into a contiguous ``[B, H_kv, length, d]`` tensor by one indexed copy, zeros past each length (``length``:
    the longest; reading it waits for the device). Table entries outside the cache are clamped, as the kernels
    clamp them."""
    page = cache.shape[1] if layout == "nhd" else cache.shape[2]
    heads = torch.arange(cache.shape[2] if layout == "nhd" else cache.shape[1], device=cache.device)
    lens = context_lens.to(torch.long).clamp(min=0, max=block_table.shape[1] * page)
    if length is None:
        length = int(lens.max().item()) if lens.numel() else 0
    pos = torch.arange(length, device=cache.device)
    logical = (pos // page).clamp(max=block_table.shape[1] - 1)
    pages = block_table.to(torch.long)[:, logical].clamp(0, cache.shape[0] - 1)[:, None, :]  # [B, 1, length]
    slots, heads = (pos % page)[None, None, :], heads[None, :, None]
    out = cache[pages, slots, heads] if layout == "nhd" else cache[pages, heads, slots]  # [B, H_kv, length, d]
    return out.masked_fill_((pos[None, :] >= lens[:, None])[:, None, :, None], 0)


def paged_reference_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    *,
    layout: str = "nhd",
    requests: Sequence[int] | None = None,
    exact: bool = True,
) -> torch.Tensor:
    """Decoding attention of ``q [B, H, Nq, d]`` on a paged cache (arguments as
    ``kernels.attention.decode.paged_forward``), request by request on its own gathered keys: float64
    (``exact``), or three-step attention in q's dtype. ``requests``: the requests to compute (all by default);
    returns ``[len(requests), H, Nq, d]``. A request of length 0 gives zeros."""
    requests = range(q.shape[0]) if requests is None else requests
    dtype = torch.float64 if exact else q.dtype
    out = torch.zeros((len(requests), *q.shape[1:]), dtype=dtype, device=q.device)
    for i, b in enumerate(requests):
        table, lens = block_table[b : b + 1], context_lens[b : b + 1]
        n = int(lens.clamp(min=0).item())
        if n == 0:
            continue
        k = gather_paged(k_cache, table, lens, layout, n)
        v = gather_paged(v_cache, table, lens, layout, n)
        out[i] = _materialise(q[b : b + 1], k, v, causal, sm_scale, None, dtype)[0]
    return out
