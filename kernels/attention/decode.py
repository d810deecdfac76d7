"""Decoding attention in Triton: a few new tokens' queries against long K/V caches, contiguous or paged.

The FA-2 forward gives such a shape only B·H programs, far fewer than a GPU has multiprocessors; here the key
sequence is also split into ``num_splits`` chunks (by default enough to fill the GPU, each at least one key
block, split-KV or "FlashDecoding"), each program runs the online softmax over its chunk, and a second
kernel merges the partial outputs O_s by their logsumexps L_s: with L = log Σ_s exp(L_s),
O = Σ_s exp(L_s − L) · O_s, exact up to rounding. The query heads that share a K/V head are packed into one
tile (grouped-query attention: with 64 query heads on 8 K/V heads, a tile holds the 8 heads' query rows), so
each K/V byte is read once per group, not once per query head (``pack_gqa=False`` gives the unpacked path).

Two caches, one inner loop (``decode_kernels.decode_inner``; only where a tile's keys are differs):

- contiguous (``forward``): ``[B, H_kv, Nk, d]`` per request, optionally with ``seqlens_k``, each request's
  number of keys (≤ Nk);
- paged (``paged_forward``): one pool of pages shared by every request, ``[num_pages, page_size, H_kv, d]``
  (``layout="nhd"``, vLLM's and FlashInfer's default) or ``[num_pages, H_kv, page_size, d]``
  (``layout="hnd"``), an int32 block table ``[B, max_pages]`` listing each request's pages in order (pages
  may be shared between requests: prefix sharing) and int32 ``context_lens [B]``, each request's keys.
  ``append_kv`` writes new tokens' K/V into their pages.

Handles: query length 1…16 (the same for every request), causal masks aligned bottom-right (the last new
token sees every key, earlier ones one fewer each), grouped-query heads, head dims 1…256, page sizes ≥ 1
(16–256 in serving), float16 and bfloat16 on a GPU, exact float32, any strides. An empty context (length 0)
gives zeros and a logsumexp of -inf, as ``fa2`` does for a row that sees no key. No call reads a value back to
the host unless asked to check its pages, so a decoding step can be captured in a CUDA graph (static block table
and lengths). Not handled: a different query length per request, sliding windows, ALiBi, soft-capping, FP8 K/V.

Bad page-table entries never read or write outside the cache: an entry outside [0, num_pages) is clamped to a
page that exists (its keys are garbage but in bounds; the append writes nothing), and the request's flag is
raised in ``page_flags`` (an int32 [B] tensor of zeros, ``new_page_flags``) when one is passed. Reading the
flags is the caller's choice (``check_page_flags``, or ``check_pages=True``), since it waits for the GPU.

Tested in the interpreter (tests/kernels/test_decode.py, test_paged_decode.py) and compiled for sm_90 on the CPU;
bf16 and the CUDA-graph capture are GPU-marked, and the paged path has not run on a GPU yet.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton

from kernels._runtime import (
    INTERPRET,
    LaunchCache,
    check_bf16,
    check_device,
    check_flag,
    check_int,
    device_guard,
    multiprocessor_count,
    softmax_scale,
)
from kernels.attention.common import SUPPORTED_DTYPES, check_dense, check_head_dim
from kernels.attention.decode_kernels import _append_kernel, _decode_merge_kernel, _decode_split_kernel

__all__ = [
    "attention",
    "forward",
    "paged_attention",
    "paged_forward",
    "append_kv",
    "new_page_flags",
    "check_page_flags",
    "choose_splits",
    "last_splits",
    "MAX_QUERY_LEN",
    "LAYOUTS",
]

MAX_QUERY_LEN = 16
MAX_BLOCK_M = 64  # packed rows per program; more rows (heads × new tokens) take several programs
BLOCK_N = 16 if INTERPRET else 64  # keys per inner step
NUM_WARPS = 4
NUM_STAGES = 1 if INTERPRET else 3
PROGRAMS_PER_SM = 2  # split count target: programs per multiprocessor (H200 sweep)
LAYOUTS = ("nhd", "hnd")  # paged caches: [pages, page, H_kv, d] or [pages, H_kv, page, d]

# launches after the first of each kind skip Triton's per-call argument binding (kernels._runtime.LaunchCache)
_SPLIT = LaunchCache(_decode_split_kernel)
_MERGE = LaunchCache(_decode_merge_kernel)
_APPEND = LaunchCache(_append_kernel)


# ---------------------------------------------------------------------------------------------------
# Launch heuristics
# ---------------------------------------------------------------------------------------------------


_LAST_SPLITS: list[int | None] = [None]


def last_splits() -> int | None:
    """The number of key splits the most recent call ran (after rounding to whole key blocks)."""
    return _LAST_SPLITS[0]


def choose_splits(programs: int, seqlen_k: int, device: torch.device) -> int:
    """Enough (split, program) pairs to give every multiprocessor ``PROGRAMS_PER_SM`` of them, each split at
    least one key block, at most 128 splits. ``programs``: the programs of one split (requests × head groups
    × row blocks)."""
    blocks = max(1, triton.cdiv(seqlen_k, BLOCK_N))
    target = PROGRAMS_PER_SM * multiprocessor_count(device, 4)  # 4 in the interpreter: a few splits
    return max(1, min(blocks, 128, triton.cdiv(target, max(programs, 1))))


def tiling(heads: int, heads_kv: int, seqlen_q: int, pack_gqa: bool = True) -> tuple[int, int, int]:
    """``(heads_per_program, block_m, m_blocks)``: the query heads a program packs (the whole group sharing a
    K/V head, or 1 unpacked), its tile rows (heads × new tokens, a power of two from 16 to ``MAX_BLOCK_M``)
    and the programs a group's rows take."""
    per_prog = heads // heads_kv if pack_gqa else 1
    rows = per_prog * seqlen_q
    block_m = min(MAX_BLOCK_M, max(16, triton.next_power_of_2(rows)))
    return per_prog, block_m, triton.cdiv(rows, block_m)


# ---------------------------------------------------------------------------------------------------
# The launch both paths share
# ---------------------------------------------------------------------------------------------------


class _Keys(NamedTuple):
    """Where the split kernel finds a request's keys: a contiguous cache (no table) or a paged one."""

    k_strides: tuple[int, ...]  # (request, page, key, head, dim); a paged cache has no request stride,
    v_strides: tuple[int, ...]  # a contiguous one no page stride
    heads_kv: int
    capacity: int  # the keys a request can have: a length is clamped to it
    split_len: int  # the keys the splits are sized for
    lens: torch.Tensor | None = None  # int32 [B] keys per request (None: every request has ``capacity``)
    table: torch.Tensor | None = None  # int32 [B, table_len] block table (paged)
    flags: torch.Tensor | None = None  # int32 [B] page flags (paged, optional)
    num_pages: int = 1
    page: int = 1


def _run(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keys: _Keys,
    causal: bool,
    sm_scale: float,
    num_splits: int | None,
    pack_gqa: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the split and merge kernels on the keys ``keys`` describes."""
    lens, table, flags, seqlen_k, heads_kv = keys.lens, keys.table, keys.flags, keys.capacity, keys.heads_kv
    b, h, seqlen_q, d = q.shape
    out = torch.empty((b, h, seqlen_q, d), device=q.device, dtype=q.dtype)  # the merge writes every row
    lse = torch.empty((b, h, seqlen_q), device=q.device, dtype=torch.float32)
    if out.numel() == 0 or seqlen_k == 0:  # no keys anywhere: every row sees nothing
        _LAST_SPLITS[0] = 0
        return out.zero_(), lse.fill_(float("-inf"))
    per_prog, block_m, m_blocks = tiling(h, heads_kv, seqlen_q, pack_gqa)
    programs = b * (h // per_prog) * m_blocks
    split_len = max(1, keys.split_len)
    splits = num_splits or choose_splits(programs, split_len, q.device)
    chunk = triton.cdiv(triton.cdiv(split_len, splits), BLOCK_N) * BLOCK_N
    splits = triton.cdiv(split_len, chunk)  # no empty trailing split (the last one takes any keys past split_len)
    _LAST_SPLITS[0] = splits
    rows = b * h * seqlen_q
    part_o = torch.empty((splits, rows, d), device=q.device, dtype=torch.float32)
    part_lse = torch.empty((splits, rows), device=q.device, dtype=torch.float32)
    block_d = max(16, triton.next_power_of_2(d))
    tensors = (q, k, v, part_o, part_lse, lens, table, flags)
    strides = (*q.stride(), *keys.k_strides, *keys.v_strides, lens.stride(0) if lens is not None else 0)
    strides += table.stride() if table is not None else (0, 0)
    table_len = table.shape[1] if table is not None else 0
    sizes = (h, h // heads_kv, per_prog, m_blocks, seqlen_q, seqlen_k, table_len, keys.num_pages, chunk, sm_scale)
    constexprs = dict(
        HEAD_DIM=d,
        BLOCK_D=block_d,
        IS_CAUSAL=causal,
        IS_FP32=q.dtype == torch.float32,
        EVEN_D=d == block_d,
        PAGED=table is not None,
        PAGE=keys.page,
        HAS_LENS=lens is not None,
        HAS_FLAGS=flags is not None,
        BLOCK_M=block_m,
        BLOCK_N=BLOCK_N,
    )
    merge = dict(HEAD_DIM=d, BLOCK_D=block_d, BLOCK_S=max(2, triton.next_power_of_2(splits)))
    with device_guard(q):
        _SPLIT.launch((splits, programs, 1), tensors + strides + sizes, constexprs, NUM_WARPS, NUM_STAGES)
        _MERGE.launch((rows, 1, 1), (part_o, part_lse, out, lse, splits, rows), merge, 4, 1)
    return out, lse


def _check_query_len(seqlen_q: int) -> None:
    if seqlen_q > MAX_QUERY_LEN:
        raise ValueError(f"decoding attention takes 1 to {MAX_QUERY_LEN} query rows, got {seqlen_q}; use fa2")


def _check_index(name: str, t, ndim: int, batch: int, layout: str) -> None:
    """An int32 index tensor of ``ndim`` dims whose first is the batch."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {t.dtype}")
    if t.dim() != ndim or t.shape[0] != batch:
        raise ValueError(f"{name} must be {layout} with B = {batch} (q's batch), got shape {tuple(t.shape)}")


# ---------------------------------------------------------------------------------------------------
# Contiguous caches
# ---------------------------------------------------------------------------------------------------


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    *,
    num_splits: int | None = None,
    seqlens_k: torch.Tensor | None = None,
    pack_gqa: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-KV decoding attention on contiguous caches. Returns ``(out [B, H, Nq, d], lse [B, H, Nq] float32)``.

    ``q [B, H, Nq, d]`` (Nq = 1…16), ``k, v [B, H_kv, Nk, d]`` (H_kv dividing H). ``seqlens_k``: int32 ``[B]``,
    the keys of each request (its first ``seqlens_k[b]`` rows of ``k``/``v``; a length past Nk counts as Nk, a
    negative one as 0); None: all Nk. ``num_splits``: the number of key chunks (an int >= 1; rounded to whole
    key blocks, ``last_splits()`` says what ran); None chooses it from the shape (``choose_splits``).
    ``pack_gqa``: the query heads of one K/V head in one tile (False: one query head per program).
    """
    causal = check_flag("causal", causal)
    pack_gqa = check_flag("pack_gqa", pack_gqa)
    if num_splits is not None:
        num_splits = check_int("num_splits", num_splits, minimum=1)
    check_dense(q, k, v)
    b, h, seqlen_q, d = q.shape
    _check_query_len(seqlen_q)
    if seqlens_k is not None:
        _check_index("seqlens_k", seqlens_k, 1, b, "[B]")
        check_device(q, seqlens_k, names=("q", "seqlens_k"))
    sm_scale = softmax_scale(d, sm_scale)
    nk = k.shape[2]
    k_strides = (k.stride(0), 0, k.stride(2), k.stride(1), k.stride(3))
    v_strides = (v.stride(0), 0, v.stride(2), v.stride(1), v.stride(3))
    keys = _Keys(k_strides, v_strides, k.shape[1], nk, nk, lens=seqlens_k)
    return _run(q, k, v, keys, causal, float(sm_scale), num_splits, pack_gqa)


def attention(
    q,
    k,
    v,
    causal: bool = False,
    sm_scale: float | None = None,
    *,
    num_splits: int | None = None,
    seqlens_k: torch.Tensor | None = None,
    pack_gqa: bool = True,
) -> torch.Tensor:
    """Decoding attention for ``[B, H, 1…16, d]`` queries against ``[B, H_kv, Nk, d]`` keys and values
    (the other arguments as ``forward``)."""
    _inference_only(q, k, v)
    return forward(q, k, v, causal, sm_scale, num_splits=num_splits, seqlens_k=seqlens_k, pack_gqa=pack_gqa)[0]


def _inference_only(*tensors) -> None:
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        raise NotImplementedError("decoding attention is inference-only; use kernels.attention.fa2 for training")


# ---------------------------------------------------------------------------------------------------
# Paged caches
# ---------------------------------------------------------------------------------------------------


def _paged_cache(k_cache, v_cache, layout: str, names=("k_cache", "v_cache")) -> tuple[int, int, int, int]:
    """``(num_pages, page_size, heads_kv, head_dim)`` of a pair of paged caches in ``layout``."""
    if layout not in LAYOUTS:
        raise ValueError(
            f"layout must be one of {LAYOUTS} ([pages, page, H_kv, d] or [pages, H_kv, page, d]), got {layout!r}"
        )
    form = "[num_pages, page_size, H_kv, d]" if layout == "nhd" else "[num_pages, H_kv, page_size, d]"
    for name, t in zip(names, (k_cache, v_cache), strict=True):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be {form} (layout {layout!r}), got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; supported: float16, bfloat16, float32")
    if k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError(
            f"{names[0]} and {names[1]} must have one shape and dtype, got {tuple(k_cache.shape)} {k_cache.dtype} "
            f"and {tuple(v_cache.shape)} {v_cache.dtype}"
        )
    num_pages, a, c, d = k_cache.shape
    page, heads_kv = (a, c) if layout == "nhd" else (c, a)
    if num_pages < 1 or page < 1 or heads_kv < 1:
        raise ValueError(
            f"{names[0]} {form} must hold at least one page of at least one token and one head, "
            f"got {tuple(k_cache.shape)}"
        )
    check_head_dim(d)
    return num_pages, page, heads_kv, d


def _paged_strides(t: torch.Tensor, layout: str) -> tuple[int, int, int, int, int]:
    """(batch, page, key in page, head, dim) strides of a paged cache; no batch stride."""
    s = t.stride()
    return (0, s[0], s[1], s[2], s[3]) if layout == "nhd" else (0, s[0], s[2], s[1], s[3])


def _check_table(block_table, lens, lens_name: str, batch: int, page_flags) -> None:
    _check_index("block_table", block_table, 2, batch, "[B, max_pages]")
    if block_table.shape[1] < 1:
        raise ValueError("block_table must have at least one column (a request's pages, in order)")
    _check_index(lens_name, lens, 1, batch, "[B]")
    if page_flags is not None:
        _check_index("page_flags", page_flags, 1, batch, "[B] (new_page_flags)")


def new_page_flags(batch: int, device) -> torch.Tensor:
    """Zeroed int32 page flags ``[B]`` for ``paged_forward`` and ``append_kv`` (one flag per request)."""
    return torch.zeros(check_int("batch", batch, minimum=0), dtype=torch.int32, device=device)


def paged_forward(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    *,
    layout: str = "nhd",
    num_splits: int | None = None,
    max_context_len: int | None = None,
    pack_gqa: bool = True,
    page_flags: torch.Tensor | None = None,
    check_pages: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoding attention on a paged K/V cache. Returns ``(out [B, H, Nq, d], lse [B, H, Nq] float32)``.

    - ``q [B, H, Nq, d]``: the new tokens' queries (Nq = 1…16, the same for every request);
    - ``k_cache, v_cache``: ``[num_pages, page_size, H_kv, d]`` (``layout="nhd"``) or ``[num_pages, H_kv,
      page_size, d]`` (``"hnd"``), H_kv dividing H, q's dtype;
    - ``block_table``: int32 ``[B, max_pages]``, request b's keys ``[j·page_size, (j+1)·page_size)`` in page
      ``block_table[b, j]`` (entries past a request's length are not read; pages may repeat across requests);
    - ``context_lens``: int32 ``[B]``, each request's keys, its new tokens' included (their K/V appended first,
      ``append_kv``); the causal mask lets new token i see keys ``j <= i + context_lens[b] - Nq``. A length
      of 0 gives zeros; a negative one counts as 0 and one past ``max_pages · page_size`` as that, both
      raising the request's flag.

    ``num_splits`` as ``forward``; ``max_context_len``: a bound on the lengths that the splits are sized for
    (None: the table's capacity, max_pages · page_size; a longer request is still computed whole, its last
    split taking the rest). ``pack_gqa`` as ``forward``. ``page_flags``: int32 ``[B]`` zeros
    (``new_page_flags``), raised by the kernel for a request that met a page entry outside ``[0, num_pages)``
    (clamped, never read outside the cache); ``check_pages``: read them after the call (waits for the GPU) and
    raise ``ValueError`` naming the request and page (``check_page_flags``).
    """
    causal = check_flag("causal", causal)
    pack_gqa = check_flag("pack_gqa", pack_gqa)
    check_pages = check_flag("check_pages", check_pages)
    if num_splits is not None:
        num_splits = check_int("num_splits", num_splits, minimum=1)
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    if q.dim() != 4:
        raise ValueError(f"q must be [B, H, Nq, d], got shape {tuple(q.shape)}")
    num_pages, page, heads_kv, d = _paged_cache(k_cache, v_cache, layout)
    b, h, seqlen_q, dq = q.shape
    if q.dtype != k_cache.dtype:
        raise TypeError(f"q and k_cache must share a dtype, got {q.dtype} and {k_cache.dtype}")
    if dq != d or h % heads_kv:
        raise ValueError(
            f"q {tuple(q.shape)} does not fit the cache {tuple(k_cache.shape)}: head_dim must match and the cache's "
            f"{heads_kv} K/V heads must divide q's {h} heads"
        )
    _check_query_len(seqlen_q)
    _check_table(block_table, context_lens, "context_lens", b, page_flags)
    tensors = (q, k_cache, v_cache, block_table, context_lens) + ((page_flags,) if page_flags is not None else ())
    check_device(*tensors, names=("q", "k_cache", "v_cache", "block_table", "context_lens", "page_flags"))
    check_bf16(q.dtype, q.device, "q")
    sm_scale = softmax_scale(d, sm_scale)
    table_len = block_table.shape[1]
    capacity = table_len * page
    split_len = capacity
    if max_context_len is not None:
        split_len = min(capacity, check_int("max_context_len", max_context_len, minimum=0))
    if check_pages and page_flags is None:
        page_flags = new_page_flags(b, q.device)
    strides = _paged_strides(k_cache, layout), _paged_strides(v_cache, layout)
    keys = _Keys(*strides, heads_kv, capacity, split_len, context_lens, block_table, page_flags, num_pages, page)
    out = _run(q, k_cache, v_cache, keys, causal, float(sm_scale), num_splits, pack_gqa)
    if check_pages:
        check_page_flags(page_flags, block_table, context_lens, k_cache, layout=layout)
    return out


def paged_attention(
    q,
    k_cache,
    v_cache,
    block_table,
    context_lens,
    causal: bool = False,
    sm_scale: float | None = None,
    **options,
) -> torch.Tensor:
    """``paged_forward``'s output alone (the keyword options as there)."""
    _inference_only(q, k_cache, v_cache)
    return paged_forward(q, k_cache, v_cache, block_table, context_lens, causal, sm_scale, **options)[0]


def append_kv(
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_lens: torch.Tensor,
    *,
    layout: str = "nhd",
    page_flags: torch.Tensor | None = None,
    check_pages: bool = False,
) -> None:
    """Write new tokens' keys and values into a paged cache, in place.

    ``k_new, v_new [B, H_kv, N_new, d]`` (the cache's dtype); token i of request b goes to position
    ``cache_lens[b] + i`` of the request, slot ``pos % page_size`` of page ``block_table[b, pos // page_size]``
    (a fresh page or the rest of a partly full one). ``cache_lens``: int32 ``[B]``, the tokens already cached;
    it is not updated (the caller's lengths become ``cache_lens + N_new``). Caches and block table as
    ``paged_forward``. A position whose page entry is outside ``[0, num_pages)``, or past the block table,
    writes nothing and raises the request's flag in ``page_flags``; ``check_pages`` reads the flags (waits
    for the GPU) and raises ``ValueError`` naming the request and page.
    """
    check_pages = check_flag("check_pages", check_pages)
    num_pages, page, heads_kv, d = _paged_cache(k_cache, v_cache, layout)
    for name, t in (("k_new", k_new), ("v_new", v_new)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4 or t.shape[1] != heads_kv or t.shape[3] != d:
            raise ValueError(
                f"{name} must be [B, H_kv={heads_kv}, N_new, d={d}] (the cache's heads and head_dim), "
                f"got {tuple(t.shape)}"
            )
        if t.dtype != k_cache.dtype:
            raise TypeError(f"{name} must have the cache's dtype {k_cache.dtype}, got {t.dtype}")
    if k_new.shape != v_new.shape:
        raise ValueError(f"k_new and v_new must have the same shape, got {tuple(k_new.shape)} and {tuple(v_new.shape)}")
    b, _, n_new, _ = k_new.shape
    _check_table(block_table, cache_lens, "cache_lens", b, page_flags)
    tensors = (k_new, v_new, k_cache, v_cache, block_table, cache_lens) + (
        (page_flags,) if page_flags is not None else ()
    )
    check_device(*tensors, names=("k_new", "v_new", "k_cache", "v_cache", "block_table", "cache_lens", "page_flags"))
    if check_pages and page_flags is None:
        page_flags = new_page_flags(b, k_new.device)
    if b * n_new:
        strides = (*k_new.stride(), *v_new.stride())
        strides += _paged_strides(k_cache, layout)[1:] + _paged_strides(v_cache, layout)[1:]
        strides += (cache_lens.stride(0), *block_table.stride())
        constexprs = dict(
            HEAD_DIM=d,
            BLOCK_H=triton.next_power_of_2(heads_kv),
            BLOCK_D=triton.next_power_of_2(d),
            PAGE=page,
            HAS_FLAGS=page_flags is not None,
        )
        args = (k_new, v_new, k_cache, v_cache, cache_lens, block_table, page_flags, *strides)
        with device_guard(k_new):
            _APPEND.launch(
                (b * n_new, 1, 1), args + (heads_kv, n_new, block_table.shape[1], num_pages), constexprs, 4, 1
            )
    if check_pages:
        check_page_flags(page_flags, block_table, cache_lens + n_new, k_cache, layout=layout, appended=n_new)


def check_page_flags(
    page_flags: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    k_cache: torch.Tensor,
    *,
    layout: str = "nhd",
    appended: int = 0,
) -> None:
    """Read the page flags (this waits for the GPU) and raise ``ValueError`` naming every flagged request with
    what was wrong: a negative length, a length its block table cannot hold, or the table entry (request, logical
    page, value) outside the cache's pages. ``context_lens``: each request's keys after the call (for
    ``append_kv``: ``cache_lens + N_new``, with ``appended=N_new``, the positions it wrote)."""
    num_pages, page, _, _ = _paged_cache(k_cache, k_cache, layout, names=("k_cache", "k_cache"))
    flags = page_flags.tolist()
    flagged = [b for b, f in enumerate(flags) if f]
    if not flagged:
        return
    table = block_table.cpu()
    lens = context_lens.tolist()
    problems = [
        _page_problem(b, lens[b] - appended if appended else 0, lens[b], table, num_pages, page) for b in flagged
    ]
    more = f"; and {len(problems) - 8} more requests" if len(problems) > 8 else ""
    raise ValueError(
        "page table out of range (the kernel clamped those reads to a page that exists and wrote nothing "
        "outside the cache): " + "; ".join(problems[:8]) + more
    )


def _page_problem(b: int, first: int, end: int, table: torch.Tensor, num_pages: int, page: int) -> str:
    """What is wrong with request b's positions [first, end) (host values)."""
    if first < 0 or end < 0:
        return f"request {b}: its length {min(first, end)} is negative"
    table_len = table.shape[1]
    if end > table_len * page:
        return (
            f"request {b}: {end} tokens need {triton.cdiv(end, page)} pages of {page}, its block table has {table_len}"
        )
    for lp in range(first // page, triton.cdiv(end, page)):
        entry = int(table[b, lp])
        if not 0 <= entry < num_pages:
            return f"request {b}: block_table[{b}, {lp}] = {entry}, outside the cache's pages 0…{num_pages - 1}"
    return f"request {b}: flag raised ({table_len} table entries, all in range now: the table changed after the call)"
