"""``decode-serving``: one decoding step of a batch of requests of mixed lengths in a pool of K/V pages, measured.

A point (``serving_plan``: batch, the longest context, the lengths drawn below it) is built before anything is
timed: the pool (K and V in one tensor, ``[2, pages, page, H_kv, d]`` or head-major), each request's pages drawn
at random from it (so that no request's pages are contiguous), the int32 block table and lengths, the queries,
the contiguous copy of every request's keys padded to the longest context (``reference.gather_paged``), and
the float64 reference of the first and the last request (``reference.paged_reference_attention``; every
query head and new token of both). Every implementation's output on those requests passes the tolerance
policy before it is timed (``harness``: L2 flushed, median of many repetitions, ``host_ms`` the host's cost of
one eager call). Implementations:

- ``ours-paged``: ``kernels.attention.decode.paged_forward`` on the pool (GQA packed, split-KV, the batch's
  longest context as ``max_context_len``: what a scheduler knows); ``ours-paged-unpacked``: one query head per
  program, each reading its K/V head again (``pack_gqa=False``);
- ``ours-decode``: the contiguous path (``decode.forward`` with per-request lengths) on the gathered copy: the
  same values and inner loop, a contiguous cache;
- ``gather-kv``: the gather into that copy, alone (what SDPA on a paged cache costs on top);
- ``sdpa-efficient-gathered``, ``sdpa-cudnn-gathered``: SDPA pinned to a backend, on the gathered copy with a
  boolean mask of each request's keys (and the causal diagonal), K/V heads shared (``enable_gqa``);
- ``upstream-fa-paged``: the upstream FlashAttention's paged decoding where one is installed (``upstream``
  says which it tries); a row ``unsupported`` saying what is missing otherwise;
- ``copy-kv``: a device copy of the pool, the bandwidth the others are read against.

Rows: ``batch``, ``heads``, ``heads_kv``, ``seqlen_q`` (new tokens per request), ``seqlen_k`` (the longest
context), ``tokens`` (the batch's keys, Σ lengths), ``page_size``; ``model_bytes`` the step's compulsory bytes
(``analysis.core.models.decode_batch_bytes``: Q and O, each K/V byte once, the block table) for every
decoding implementation alike, so ``gbps`` compares them on the same work; ``gather-kv`` and ``copy-kv`` carry
the bytes they move themselves (``decode_gather_bytes``; read and written). ``tflops``: ``decode_batch_flops``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import torch
import torch.nn.functional as F

from analysis.core import harness
from analysis.core.flops import decode_batch_flops, tflops
from analysis.core.models import decode_batch_bytes, decode_gather_bytes
from analysis.core.points import DTYPES, generator, randn, short
from analysis.core.provenance import row_provenance
from analysis.families._shared.attention_measure import base_row, make_row, measure_copy, time_call, unbuilt
from analysis.families.attention.serving_plan import ServingSpec
from kernels import tolerance
from kernels.attention import decode, reference

SDPA_BACKENDS = {"sdpa-efficient-gathered": "EFFICIENT_ATTENTION", "sdpa-cudnn-gathered": "CUDNN_ATTENTION"}


class Batch:
    """One point's inputs, its contiguous copy and the float64 references, built before anything is timed."""

    def __init__(self, spec: ServingSpec, lengths: list[int], dtype: torch.dtype, device, gen: torch.Generator):
        self.lengths = lengths
        b, page = len(lengths), spec.page_size
        self.longest = max(lengths)
        counts = [-(-n // page) for n in lengths]
        num_pages = sum(counts)
        shape = (num_pages, page, spec.heads_kv, spec.head_dim)
        if spec.layout == "hnd":
            shape = (num_pages, spec.heads_kv, page, spec.head_dim)
        self.pool = randn((2, *shape), gen, dtype, device)  # K and V in one tensor: what copy-kv copies
        self.k, self.v = self.pool[0], self.pool[1]
        order = list(range(num_pages))
        random.Random(spec.seed).shuffle(order)
        table = torch.zeros((b, max(counts)), dtype=torch.int32)  # entries past a request's pages: never read
        start = 0
        for r, n in enumerate(counts):
            table[r, :n] = torch.tensor(order[start : start + n], dtype=torch.int32)
            start += n
        self.table = table.to(device)
        self.lens = torch.tensor(lengths, dtype=torch.int32, device=device)
        self.q = randn((b, spec.heads, spec.seqlen_q, spec.head_dim), gen, dtype, device)
        self.kg, self.vg = (
            reference.gather_paged(t, self.table, self.lens, spec.layout, self.longest) for t in (self.k, self.v)
        )
        self.checked = sorted({0, b - 1})  # the longest request and the last one
        args = (self.q, self.k, self.v, self.table, self.lens, spec.causal)
        self.ref = reference.paged_reference_attention(*args, layout=spec.layout, requests=self.checked)
        self.same = reference.paged_reference_attention(*args, layout=spec.layout, requests=self.checked, exact=False)
        self._mask: torch.Tensor | None = None
        self.causal, self.layout = spec.causal, spec.layout

    def mask(self) -> torch.Tensor:
        """Boolean ``[B, 1, Nq, longest]``: key j visible to new token i of request r (j < its length and, if
        causal, j <= i + length − Nq)."""
        if self._mask is None:
            nq = self.q.shape[2]
            j = torch.arange(self.longest, device=self.q.device)[None, None, :]
            lens = self.lens.to(torch.long)[:, None, None]
            keep = j < lens
            if self.causal:
                keep = keep & (j <= torch.arange(nq, device=self.q.device)[None, :, None] + lens - nq)
            self._mask = keep[:, None]
        return self._mask


def upstream() -> tuple[str, Callable]:
    """The first upstream FlashAttention with a paged decoding path that imports: ``(what it is, f(q [B, Nq, H,
    d], k, v [pages, page, H_kv, d], table, lens, causal) -> out [B, Nq, H, d])``. Tried in order: FA-3's
    Hopper build (``flash_attn_interface.flash_attn_with_kvcache``, ``page_table``), flash-attn-4
    (``flash_attn.cute.flash_attn_varlen_func``, ``page_table``, ``seqused_k``), flash-attn 2
    (``flash_attn.flash_attn_with_kvcache``, ``block_table``; pages of a multiple of 256 tokens). None:
    ``NotImplementedError`` naming what is missing (the row is ``unsupported``)."""
    missing = []
    try:
        from flash_attn_interface import flash_attn_with_kvcache as fa3

        def call3(q, k, v, table, lens, causal):
            return fa3(q, k, v, cache_seqlens=lens, page_table=table, causal=causal)

        return "flash_attn_interface.flash_attn_with_kvcache (FA-3)", call3
    except ImportError as exc:
        missing.append(f"flash_attn_interface ({exc})")
    try:
        from flash_attn.cute import flash_attn_varlen_func as fa4

        def call4(q, k, v, table, lens, causal):
            out = fa4(q, k, v, seqused_k=lens, page_table=table, causal=causal, num_splits=0)
            return out[0] if isinstance(out, tuple) else out

        return "flash_attn.cute.flash_attn_varlen_func (flash-attn-4)", call4
    except ImportError as exc:
        missing.append(f"flash_attn.cute ({exc})")
    try:
        from flash_attn import flash_attn_with_kvcache as fa2

        def call2(q, k, v, table, lens, causal):
            return fa2(q, k, v, cache_seqlens=lens, block_table=table, causal=causal)

        return "flash_attn.flash_attn_with_kvcache (flash-attn 2)", call2
    except ImportError as exc:
        missing.append(f"flash_attn ({exc})")
    raise NotImplementedError(f"no upstream FlashAttention with a paged path is installed: {'; '.join(missing)}")


def implementation(spec: ServingSpec, impl: str, p: Batch) -> tuple[Callable[[], torch.Tensor], str]:
    """``(call, kernel_config)``: the timed callable of ``impl`` on the point, giving ``[B, H, Nq, d]``."""
    causal = spec.causal
    if impl in ("ours-paged", "ours-paged-unpacked"):
        pack = impl == "ours-paged"
        options = dict(layout=spec.layout, max_context_len=p.longest, pack_gqa=pack)
        return (lambda: decode.paged_forward(p.q, p.k, p.v, p.table, p.lens, causal, **options)[0]), ""
    if impl == "ours-decode":
        return (lambda: decode.forward(p.q, p.kg, p.vg, causal, seqlens_k=p.lens)[0]), ""
    if impl in SDPA_BACKENDS:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, SDPA_BACKENDS[impl])
        mask = p.mask()

        def sdpa():
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(p.q, p.kg, p.vg, attn_mask=mask, enable_gqa=True)

        return sdpa, ""
    if impl == "upstream-fa-paged":
        if spec.layout != "nhd":
            raise NotImplementedError("the upstream paged kernels take token-major pages [pages, page, H_kv, d]")
        what, fn = upstream()
        q = p.q.transpose(1, 2).contiguous()  # [B, Nq, H, d], made before timing
        return (lambda: fn(q, p.k, p.v, p.table, p.lens, causal).transpose(1, 2)), what
    raise ValueError(f"unknown implementation {impl!r}")


def measure_gather(spec: ServingSpec, p: Batch, base: dict) -> dict:
    """``gather-kv``: the gather of K and V into the padded contiguous copy, alone, checked bit for bit."""
    metrics: dict = {"model_bytes": decode_gather_bytes(p.lengths, spec.heads_kv, spec.head_dim, p.q.element_size())}

    def call():
        return tuple(reference.gather_paged(t, p.table, p.lens, spec.layout, p.longest) for t in (p.k, p.v))

    try:
        k, v = call()
        exact = torch.equal(k, p.kg) and torch.equal(v, p.vg)
        del k, v
        metrics.update(max_abs_err=0.0 if exact else math.nan, rms_err=0.0 if exact else math.nan)
        if not exact:
            return make_row(base, "gather-kv", "mismatch", "the gathered copy differs from the point's", **metrics)
        metrics.update(time_call(call, spec))
        metrics["gbps"] = metrics["model_bytes"] / (metrics["ms_median"] * 1e-3) / 1e9
        return make_row(base, "gather-kv", "ok", "", **metrics)
    except Exception as exc:
        status, message = harness.classify(exc)
        harness.release_memory()
        return make_row(base, "gather-kv", status, message, **metrics)


def measure(spec: ServingSpec, impl: str, p: Batch, base: dict) -> dict:
    """One implementation at one point: gated, then timed (module docstring)."""
    if impl == "copy-kv":
        return measure_copy(spec, (p.pool,), base, True)
    if impl == "gather-kv":
        return measure_gather(spec, p, base)
    dtype = DTYPES[spec.dtype]
    metrics: dict = {}
    try:
        call, config = implementation(spec, impl, p)
        out = call()  # compiles outside any timed region
        if impl.startswith("ours-"):
            config = f"num_splits={decode.last_splits()}"
        metrics["kernel_config"] = config
        got = out[p.checked]
        check = tolerance.check(f"{impl} output", got, p.ref, p.same, dtype)
        del out, got
        metrics.update(max_abs_err=check.max_abs, rms_err=check.rms, ref_err=check.ref_err, err_bound=check.bound)
        if not check.ok:
            return make_row(base, impl, "mismatch", check.describe(), **metrics)
        metrics.update(time_call(call, spec))
        flops = decode_batch_flops(p.lengths, spec.heads, spec.seqlen_q, spec.head_dim)
        metrics["tflops"] = tflops(flops, metrics["ms_median"])
        metrics["model_bytes"] = decode_batch_bytes(
            p.lengths, spec.heads, spec.heads_kv, spec.seqlen_q, spec.head_dim, p.q.element_size(), spec.page_size
        )
        metrics["gbps"] = metrics["model_bytes"] / (metrics["ms_median"] * 1e-3) / 1e9
        return make_row(base, impl, "ok", "", **metrics)
    except Exception as exc:
        status, message = harness.classify(exc)
        harness.release_memory()
        return make_row(base, impl, status, message, **metrics)


def run(spec: ServingSpec, env: dict, device: str = "cuda", log_line: Callable[[str], None] = print) -> list[dict]:
    """Measure every point of a decode-serving shard; rows of the attention table."""
    dtype = DTYPES[spec.dtype]
    prov = row_provenance(env)
    progress = harness.Progress(spec.points(), log_line)
    gen = generator(device, spec.seed)
    rows: list[dict] = []
    for i, (b, context) in enumerate(spec.grid()):
        lengths = spec.lengths(i)
        shape = dict(batch=b, heads=spec.heads, heads_kv=spec.heads_kv, seqlen_q=spec.seqlen_q, seqlen_k=context)
        base = base_row(spec, prov, True, "attention", **shape, tokens=sum(lengths), page_size=spec.page_size)
        text = f"B={b} contexts≤{context} (Σ {sum(lengths)}) H={spec.heads}/{spec.heads_kv} page={spec.page_size}"
        try:
            point = Batch(spec, lengths, dtype, device, gen)
        except Exception as exc:  # the point's inputs do not fit: every implementation gets the status
            rows += unbuilt(base, spec.impls, exc, progress, text)
            continue
        rounds = harness.Rounds(spec.spread_rounds, rows)  # the point's repeat rounds (the harness's step 6)
        for impl in spec.impls:
            row = measure(spec, impl, point, base)
            rows.append(row)
            extra = f" {row['gbps']:.0f} GB/s" if row["status"] == "ok" and math.isfinite(row["gbps"]) else ""
            progress.step(f"{impl} {text}", row["status"] + extra + short(row["message"]))
        rounds.run()
        del point
        harness.release_memory()
    return rows
