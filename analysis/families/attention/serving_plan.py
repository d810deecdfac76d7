"""The ``decode-serving`` experiment's plan: decoding as a server runs it (torch-free, as every plan).

A point is one decoding step of a batch of ``batch`` requests whose contexts are mixed: request 0 has ``context``
keys, the others a length drawn uniformly from ``[context · (1 − spread), context]`` (a seeded draw,
``context_lengths``), all in one pool of pages of ``page_size`` tokens listed by a block table. A shard is one
(dtype, head_dim, query heads / K/V heads, page size, query length) with the points of ``batches`` ×
``contexts`` whose ``batch × context`` stays within ``max_tokens``: the pool and the contiguous copy of it
(padded to the longest context) must fit in the GPU's memory together (the others are not planned).
Shard names: ``decode-serving_<dtype>_d<head_dim>_<full|causal>_h<heads>_hkv<heads_kv>_p<page>_q<Nq>``.

Implementations (``SERVING_IMPLS``; ``analysis.families.attention.serving`` measures them): ``ours-paged``
(``decode.paged_forward``, GQA packed), ``ours-paged-unpacked`` (one query head per program), ``ours-decode``
(the contiguous path on the gathered copy with per-request lengths: same data, same inner loop),
``gather-kv`` (the gather into that copy, timed apart), ``sdpa-efficient-gathered`` and
``sdpa-cudnn-gathered`` (SDPA on the gathered copy with a key-padding mask), ``upstream-fa-paged`` (the
upstream FlashAttention's paged path, where one is installed), ``copy-kv`` (a device copy of the pool: the
reference bandwidth).

``seconds_of`` is a planning aid fitted like the rest of the family's (``_shared.attention_plan``): a new
process, per point the inputs (pool, copy, reference), per implementation its setup, the harness's timing,
and its untimed calls at a nominal bandwidth.
"""

from __future__ import annotations

import dataclasses
import random

from analysis.core.costs import rounds_seconds
from analysis.families._shared import attention_plan as shared

EXPERIMENT = "decode-serving"
SERVING_IMPLS = (
    "ours-paged",
    "ours-paged-unpacked",
    "ours-decode",
    "gather-kv",
    "sdpa-efficient-gathered",
    "sdpa-cudnn-gathered",
    "upstream-fa-paged",
    "copy-kv",
)
OURS = ("ours-paged", "ours-paged-unpacked", "ours-decode")
LAYOUTS = ("nhd", "hnd")


def context_lengths(batch: int, context: int, spread: float, seed: int) -> list[int]:
    """The keys of each request of a point: ``context`` for the first, the rest drawn uniformly from
    ``[context · (1 − spread), context]`` (at least 1), seeded by the point so that every run draws the same."""
    rng = random.Random(f"{seed}:{batch}:{context}")
    low = max(1, round(context * (1.0 - spread)))
    return [context] + [rng.randint(low, context) for _ in range(batch - 1)]


@dataclasses.dataclass
class ServingSpec:
    """One shard of ``decode-serving`` (``workflow/config.yaml``, ``attention.decode_serving``, says what each
    field means)."""

    dtype: str
    head_dim: int
    heads: int
    heads_kv: int
    page_size: int
    seqlen_q: int
    batches: list[int]
    contexts: list[int]
    impls: list[str]
    experiment: str = EXPERIMENT
    causal: bool = True
    layout: str = "nhd"
    spread: float = 0.5
    max_tokens: int = 4 * 2**20
    warmup_ms: float = 10
    rep_ms: float = 50
    spread_rounds: int = 0  # repeat rounds per timed point (the harness's step 6; attention.spread_rounds)
    check_rows: int = 0  # the attention-wide gate rows: decoding gates every query row, so unused here
    seed: int = 0
    mode: str = "fwd"  # what every attention row carries
    inputs: str = "normal"

    def __post_init__(self):
        if self.experiment != EXPERIMENT:
            raise ValueError(f"a serving spec is for {EXPERIMENT!r}, got {self.experiment!r}")
        if self.dtype not in shared.DTYPE_NAMES:
            raise ValueError(f"unknown dtype {self.dtype!r}; known: {list(shared.DTYPE_NAMES)}")
        unknown = [i for i in self.impls if i not in SERVING_IMPLS]
        if unknown:
            raise ValueError(
                f"implementations {unknown} do not belong to {EXPERIMENT!r} (it runs {list(SERVING_IMPLS)})"
            )
        if self.heads_kv < 1 or self.heads % self.heads_kv:
            raise ValueError(f"heads_kv {self.heads_kv} must divide heads {self.heads}")
        if not 1 <= self.seqlen_q <= 16:
            raise ValueError(f"query length {self.seqlen_q}: decoding takes 1 to 16 new tokens")
        if self.page_size < 1 or not 0.0 <= self.spread < 1.0 or self.layout not in LAYOUTS:
            raise ValueError(
                f"page_size {self.page_size} (>= 1), spread {self.spread} (in [0, 1)), layout {self.layout!r} "
                f"(one of {LAYOUTS})"
            )
        if min(self.batches, default=0) < 1 or min(self.contexts, default=0) < 1:
            raise ValueError(f"batches {self.batches} and contexts {self.contexts} must be >= 1")
        if not self.grid():
            raise ValueError(
                f"no point of batches {self.batches} × contexts {self.contexts} has batch × context within "
                f"max_tokens {self.max_tokens}"
            )

    def grid(self) -> list[tuple[int, int]]:
        """(batch, context) of every point, batch-major: those within ``max_tokens``."""
        return [(b, c) for b in self.batches for c in self.contexts if b * c <= self.max_tokens]

    def lengths(self, index: int) -> list[int]:
        b, c = self.grid()[index]
        return context_lengths(b, c, self.spread, self.seed)

    def shape(self, index: int) -> tuple[int, int, int, int]:
        """(batch, heads, seqlen_q, the longest context) of the index-th point."""
        b, c = self.grid()[index]
        return b, self.heads, self.seqlen_q, c

    def variants(self) -> list[tuple[str, None]]:
        return [(impl, None) for impl in self.impls]

    def points(self) -> int:
        return len(self.grid()) * len(self.impls)


def shard_name(s: dict) -> str:
    return shared.shard_name(
        EXPERIMENT,
        s["dtype"],
        s["head_dim"],
        s["causal"],
        extra=f"_h{s['heads']}_hkv{s['heads_kv']}_p{s['page_size']}_q{s['seqlen_q']}",
    )


def shards(section: dict, timing: dict) -> dict[str, dict]:
    """Shard name → ServingSpec fields of the ``attention.decode_serving`` config section (``timing``: its
    warm-up and repetition times as the family resolves them); none when it is off."""
    if not section["enabled"]:
        return {}
    out = {}
    for heads, heads_kv in section["heads"]:
        for page in section["page_sizes"]:
            for nq in section["query_lens"]:
                fields = dict(
                    experiment=EXPERIMENT,
                    dtype=section["dtype"],
                    head_dim=section["head_dim"],
                    heads=heads,
                    heads_kv=heads_kv,
                    page_size=page,
                    seqlen_q=nq,
                    batches=list(section["batches"]),
                    contexts=list(section["contexts"]),
                    impls=list(section["impls"]),
                    causal=section["causal"],
                    layout=section["layout"],
                    spread=section["spread"],
                    max_tokens=section["max_tokens"],
                    **timing,
                )
                name = shard_name(fields)
                try:
                    ServingSpec(**fields)
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"attention.decode_serving (shard {name}): {exc}") from None
                if name in out:
                    raise ValueError(f"attention.decode_serving makes shard {name!r} twice (repeated heads or pages)")
                out[name] = fields
    return out


# --- what the shards cost ----------------------------------------------------------------------------------

POINT_S = 0.4  # a point's inputs: the pool drawn, the block table, the contiguous copy, the float64 reference
DRAW_BPS = 2e11  # bytes a second of drawing and copying those inputs
NOMINAL_BPS = 3e12  # a call's bytes a second (decoding, the gather, the copy)
CALLS = shared.CALLS


def seconds_of(s: ServingSpec) -> float:
    """Planned seconds of one serving shard on an H200 (an estimate, as ``attention_plan.seconds_of``)."""
    total = shared.SHARD_S
    per_token = 2 * s.heads_kv * s.head_dim * 2  # K and V of one key, 16-bit
    timing = (s.warmup_ms + s.rep_ms) / 1e3
    for b, c in s.grid():
        tokens = b * c
        total += POINT_S + 3 * tokens * per_token / DRAW_BPS
        for impl in s.impls:
            fixed = shared.OURS_S if impl in OURS else shared.OTHER_S
            call_s = 2 * tokens * per_token / NOMINAL_BPS
            total += fixed + timing + CALLS * call_s + rounds_seconds(s.spread_rounds, s.warmup_ms, s.rep_ms, call_s)
    return total


def keys_of(s: ServingSpec) -> set[tuple]:
    """The kernel specialisations a serving shard compiles: the split kernel of each of our paths (paged at
    this page size, packed or not; contiguous with lengths); PyTorch's gather and SDPA compile nothing."""
    keys = set()
    setting = (s.dtype, s.head_dim, s.causal, s.seqlen_q)
    for impl in s.impls:
        if impl in ("ours-paged", "ours-paged-unpacked"):
            keys.add(("fixed", impl, s.page_size, *setting))
        elif impl == "ours-decode":
            keys.add(("fixed", impl, "lens", *setting))
    return keys
