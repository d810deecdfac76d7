"""What the attention-like families plan alike: the attention implementations' names, the spec of a shard of
dense [B, H, N, d] points (``AttentionSpec``), shard names, the checks made at planning, and the cost model.

Kept free of torch and Triton so that the workflow can plan its jobs without importing them. The attention
family (``analysis.families.attention.plan``) and the FP8 family (``analysis.families.fp8.plan``) measure
their experiments on the same points: each subclasses ``AttentionSpec`` with its own vocabulary (class
attributes: which implementations each experiment runs, which are forward-only, how an experiment's shapes
are made), and the checks and shapes here follow that vocabulary.

``seconds_of`` is a planning aid, not a measurement: per-point costs fitted to the shipped H200 run's logs (a
new process per shard; compiling and autotuning our FA-2 kernel on every new shape; the harness's warm-up and
repetition time; an assumed doubling for gradient modes; a term for long calls at nominal throughputs:
each point runs its implementation about nine times outside the timed repetitions, the autotuner some fifty
more; the official kernels' first compiles and cuDNN's per-shape graphs, at assumed seconds; and the point's
repeat rounds, ``analysis.core.costs.rounds_seconds``). It keeps the default grid's budget visible
(``workflow/config.yaml`` quotes it, ``python -m analysis.budget`` recomputes it) and is checked by the tests;
the real cost is in each shard's log.
"""

from __future__ import annotations

import dataclasses
import re
from typing import ClassVar

from analysis.core.costs import rounds_seconds
from analysis.core.flops import BACKWARD_FACTOR, attention_flops
from analysis.families._shared.fa3_ablation import FA3_IMPLS

# Dense attention on [B, H, N, d] tensors: every experiment may compare these.
DENSE_IMPLS = ("ours-fa2", "ours-fa1", "naive", "sdpa-math", "sdpa-efficient", "sdpa-flash", "sdpa-cudnn")
# Split-KV decoding, our kernel without the split, and a device copy of the same K/V bytes.
DECODE_KERNELS = ("ours-decode", "ours-decode-unsplit")
DECODE_IMPLS = DECODE_KERNELS + ("copy-kv",)
# The official kernels beside ours where installed (``analysis.families._shared.peers``): FlashAttention's own
# (flash-attn-4) and, in the FP8 family, cuDNN's FP8 attention.
UPSTREAM_FA = "upstream-fa"
CUDNN_FP8 = "cudnn-fp8"
PEER_IMPLS = (UPSTREAM_FA, CUDNN_FP8)
# Our FA-3 forward with FA-3's Gluon backward (fa3.attention(backward="fa3")), for the gradient modes; ours-fa3's
# own rows keep its default backward. Not yet verified on a GPU: its rows pass the float64 gate or are mismatch.
FA3_BWD = "ours-fa3-bwd"
# What ``attention_measure.implementation`` builds: a callable f(q, k, v, causal) -> out.
CALLABLE_IMPLS = DENSE_IMPLS + ("ours-fa2-eager",) + DECODE_KERNELS + FA3_IMPLS + (FA3_BWD, UPSTREAM_FA)
MODES = ("fwd", "bwd", "fwd+bwd")
DTYPE_NAMES = ("float16", "bfloat16", "float32")
# The harness's defaults (analysis.core.harness.DEFAULT_WARMUP_MS / DEFAULT_REP_MS; a test keeps them equal).
DEFAULT_WARMUP_MS = 25
DEFAULT_REP_MS = 100
# The form FA2Config prints and parses (kernels/attention/fa2_config.py), checked here without importing Triton.
CONFIG_PATTERN = re.compile(r"^BLOCK_M=\d+,BLOCK_N=\d+,num_warps=\d+,num_stages=\d+$")


def check_tiles(text: str) -> None:
    """The rule FA2Config (kernels/attention/fa2_config.py) enforces when it is made, checked here without
    Triton: BLOCK_M and BLOCK_N powers of two >= 16, num_warps a power of two, num_stages >= 1."""
    fields = {k: int(v) for k, v in (part.split("=") for part in text.split(","))}
    for key in ("BLOCK_M", "BLOCK_N"):
        if fields[key] < 16 or fields[key] & (fields[key] - 1):
            raise ValueError(f"FA-2 config {text!r}: {key} must be a power of two >= 16, got {fields[key]}")
    if fields["num_warps"] < 1 or fields["num_warps"] & (fields["num_warps"] - 1):
        raise ValueError(f"FA-2 config {text!r}: num_warps must be a power of two, got {fields['num_warps']}")
    if fields["num_stages"] < 1:
        raise ValueError(f"FA-2 config {text!r}: num_stages must be >= 1, got {fields['num_stages']}")


@dataclasses.dataclass
class AttentionSpec:
    """One shard of dense attention points (see ``workflow/config.yaml`` for what each field means); a family
    subclasses it with its experiments' vocabulary, the class attributes below."""

    # which implementations each experiment can run; the experiments that measure the forward pass only
    EXPERIMENT_IMPLS: ClassVar[dict[str, tuple[str, ...]]] = {}
    FORWARD_ONLY: ClassVar[tuple[str, ...]] = ()
    INPUTS: ClassVar[tuple[str, ...]] = ("normal",)  # input distributions; other than normal: INPUT_EXPERIMENTS
    INPUT_EXPERIMENTS: ClassVar[tuple[str, ...]] = ()
    # shapes: batch = tokens / N and heads = hidden / d (HIDDEN_SHAPED), batch = tokens / N (TOKEN_SHAPED), else
    # batch and heads as given
    HIDDEN_SHAPED: ClassVar[tuple[str, ...]] = ()
    TOKEN_SHAPED: ClassVar[tuple[str, ...]] = ()
    SWEPT: ClassVar[tuple[str, ...]] = ()  # our FA-2 pinned to each of ``configs`` in turn
    PACKED: ClassVar[tuple[str, ...]] = ()  # ``seqlens`` are the lengths of one batch: one point per impl
    IO_BOUND: ClassVar[tuple[str, ...]] = ()  # rows carry the compulsory Q, K, V, O bytes and their GB/s

    experiment: str
    dtype: str
    head_dim: int
    causal: bool
    seqlens: list[int]  # query lengths (packed: the lengths of the batch's sequences)
    impls: list[str]
    mode: str = "fwd"
    tokens: int = 16384
    hidden: int = 2048
    batch: int = 1
    heads: int = 16
    heads_kv: int | None = None  # K/V heads (default: = heads); fewer is grouped-query attention
    seqlen_k: list[int] | None = None  # key lengths, one per entry of seqlens (default: = seqlens)
    configs: list[str] | None = None  # swept: the FA2Config strings our kernel is pinned to
    check_rows: int = 128
    inputs: str = "normal"  # the input distribution (INPUTS)
    warmup_ms: float = DEFAULT_WARMUP_MS
    rep_ms: float = DEFAULT_REP_MS
    spread_rounds: int = 0  # repeat rounds per timed point (the harness's step 6); the config's default is 3
    seed: int = 0

    @classmethod
    def impls_known(cls) -> tuple[str, ...]:
        return tuple(dict.fromkeys(i for impls in cls.EXPERIMENT_IMPLS.values() for i in impls))

    def __post_init__(self):
        experiments = tuple(self.EXPERIMENT_IMPLS)
        if self.experiment not in experiments:
            raise ValueError(f"unknown experiment {self.experiment!r}; known: {experiments}")
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"unknown dtype {self.dtype!r}; known: {list(DTYPE_NAMES)}")
        known = self.impls_known()
        unknown = set(self.impls) - set(known)
        if unknown:
            raise ValueError(f"unknown implementations {sorted(unknown)}; known: {known}")
        foreign = [i for i in self.impls if i not in self.EXPERIMENT_IMPLS[self.experiment]]
        if foreign:
            raise ValueError(
                f"implementations {foreign} do not belong to experiment {self.experiment!r} "
                f"(it runs {list(self.EXPERIMENT_IMPLS[self.experiment])})"
            )
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; known: {MODES}")
        if self.mode != "fwd" and self.experiment in self.FORWARD_ONLY:
            raise ValueError(f"experiment {self.experiment!r} measures the forward pass only, got mode {self.mode!r}")
        if self.seqlen_k is not None and len(self.seqlen_k) != len(self.seqlens):
            raise ValueError(
                f"seqlen_k must list one key length per entry of seqlens: {len(self.seqlen_k)} key lengths "
                f"{list(self.seqlen_k)} for {len(self.seqlens)} query lengths {list(self.seqlens)}"
            )
        if self.heads_kv is not None and (self.heads_kv < 1 or self.heads % self.heads_kv):
            raise ValueError(f"heads_kv {self.heads_kv} must divide heads {self.heads}")
        if self.experiment in self.SWEPT:
            if not self.configs:
                raise ValueError(f"{self.experiment} needs a list of configs")
            for text in self.configs:  # a typo fails when the workflow is planned, not in a GPU job
                if not CONFIG_PATTERN.match(text):
                    raise ValueError(f"cannot parse FA-2 config {text!r}: expected the form {CONFIG_PATTERN.pattern}")
                check_tiles(text)
        elif self.configs:
            where = " or ".join(self.SWEPT) or "no experiment"
            raise ValueError(f"configs apply to {where} only, not to {self.experiment!r}")
        if self.inputs not in self.INPUTS:
            raise ValueError(f"unknown inputs {self.inputs!r}; known: {self.INPUTS}")
        if self.inputs != "normal" and self.experiment not in self.INPUT_EXPERIMENTS:
            where = " or ".join(self.INPUT_EXPERIMENTS) or "no experiment"
            raise ValueError(f"inputs {self.inputs!r} apply to {where} only, not to {self.experiment!r}")
        if self.spread_rounds < 0:
            raise ValueError(f"spread_rounds must be >= 0, got {self.spread_rounds}")
        if self.experiment in self.PACKED and (not self.seqlens or min(self.seqlens) < 1):
            raise ValueError(f"{self.experiment} needs at least one sequence, each of length >= 1")

    def shape(self, index: int) -> tuple[int, int, int, int]:
        """(batch, heads, seqlen_q, seqlen_k) of the index-th point."""
        n = self.seqlens[index]
        nk = self.seqlen_k[index] if self.seqlen_k else n
        if self.experiment in self.HIDDEN_SHAPED:
            if self.hidden % self.head_dim:
                raise ValueError(f"hidden {self.hidden} is not a multiple of head_dim {self.head_dim}")
            return max(1, self.tokens // n), self.hidden // self.head_dim, n, nk
        if self.experiment in self.TOKEN_SHAPED:
            return max(1, self.tokens // n), self.heads, n, nk
        return self.batch, self.heads, n, nk

    def kv_heads(self, heads: int) -> int:
        return self.heads_kv or heads

    def variants(self) -> list[tuple[str, str | None]]:
        """(implementation, pinned config) of every measurement at one shape."""
        if self.experiment in self.SWEPT:
            return [(impl, cfg) for impl in self.impls for cfg in self.configs]
        return [(impl, None) for impl in self.impls]

    def points(self) -> int:
        if self.experiment in self.PACKED:
            return len(self.impls)
        return len(self.seqlens) * len(self.variants())


# --- shard names and the checks made at planning -----------------------------------------------------------

MODE_SLUG = {"fwd": "", "bwd": "_bwd", "fwd+bwd": "_fwdbwd"}


def mask_word(causal: bool) -> str:
    return "causal" if causal else "full"


def shard_name(experiment: str, dtype: str, head_dim: int, causal: bool, mode: str = "fwd", extra: str = "") -> str:
    """``<experiment>_<dtype>_d<head_dim>_<full|causal>``, then ``_bwd`` or ``_fwdbwd`` for the gradient modes
    (forward shards keep the names they had before modes existed, so their results are reused), then
    ``extra``."""
    return f"{experiment}_{dtype}_d{head_dim}_{mask_word(causal)}{MODE_SLUG[mode]}{extra}"


def checked(where: str, name: str, fields: dict, spec_class: type[AttentionSpec]) -> dict:
    """``fields`` after the checks that tie config fields together, made when the workflow is planned so that
    a bad combination fails there with its config section ``where`` named, not in a job: ``spec_class``'s own
    checks and the shape of every point (e.g. hidden a multiple of head_dim)."""
    try:
        s = spec_class(**fields)
        for i in range(len(s.seqlens)):
            s.shape(i)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where} (shard {name}): {exc}") from None
    return fields


# --- what the shards cost ----------------------------------------------------------------------------------

SHARD_S = 4.5  # a new Python process: imports, CUDA context, environment check
TUNED = ("ours-fa2", "ours-fa2-eager", "ours-varlen", "ours-fa2-padded")  # autotuned on every new shape
TUNE_S, OURS_S, OTHER_S = 1.3, 0.3, 0.05  # fixed seconds per point: compile+tune, compile (cached), setup
CALLS, TUNE_CALLS = 9, 50  # untimed calls of a point (gate, peak memory, the harness's estimate), tuner's
# Nominal TFLOP/s on an H200 for the long-call term (fwd; gradient modes use their own FLOPs).
NOMINAL_TFLOPS = {
    "ours-fa1": 60,
    "naive": 120,
    "sdpa-math": 25,
    "sdpa-efficient": 170,
    "copy-kv": 1e9,
    **{impl: 550 for impl in FA3_IMPLS},
    UPSTREAM_FA: 620,  # the 2026-12-04 H200 anchors: 600-670 forward, 540-610 backward at d=128
    FA3_BWD: 450,
}
# Compiling a kernel specialisation (dtype, head dim, mask, even/uneven tails) the first time, with an empty
# Triton cache, fitted to the first points of the shipped run's shards: the tuned forward compiles its seven
# candidates, a fixed-configuration kernel one or two, an FA-3 variant ("gluon") one (TMA handles the tails,
# so N needs no variant of its own). Paid once per specialisation per run. upstream-fa's CuTe DSL kernels
# ("cute": its forward of one dtype, head dim, mask and query heads per K/V head; "cute-bwd": the backward's
# kernels and the forward that keeps the logsumexp) are kept on disk after their first compile (peers.py); their
# seconds are assumed, not yet fitted to a run's logs.
COMPILE_S = {"tuned": 6.0, "fixed": 1.5, "gluon": 3.5, "cute": 10.0, "cute-bwd": 25.0}
# Seconds of a point's setup beside the fixed ones below: cuDNN's FP8 graph is built and planned per shape.
SETUP_S = {CUDNN_FP8: 2.0}
# Materialising implementations: N×N tensors alive at the peak (forward; doubled with gradients). Beyond
# the memory of an H200 such a point fails at once ("oom") and costs only its setup.
MATERIALISED = {"naive": 2, "sdpa-math": 4}
GPU_BYTES = 141e9
DEFAULT_TFLOPS = 300


def _point_seconds(s: AttentionSpec, impl: str, pinned: bool, flops: float, nominal: dict, scores: int = 0) -> float:
    """``scores``: elements of the point's N×N score tensors (B·H·Nq·Nk)."""
    timing = (s.warmup_ms + s.rep_ms) / 1e3
    tensors = MATERIALISED.get(impl, 0) * (1 if s.mode == "fwd" else 2)
    if tensors * scores * 2 > 0.8 * GPU_BYTES:
        return OTHER_S
    tuned = impl in TUNED and not pinned
    fixed = TUNE_S if tuned else OURS_S if impl.startswith("ours") else SETUP_S.get(impl, OTHER_S)
    call_s = flops / (nominal.get(impl, DEFAULT_TFLOPS) * 1e12)
    calls = CALLS + (TUNE_CALLS if tuned else 0)
    rounds = rounds_seconds(s.spread_rounds, s.warmup_ms, s.rep_ms, call_s)
    if s.mode == "bwd":  # each round of the backward alone builds its forward graph anew
        rounds += s.spread_rounds * call_s / BACKWARD_FACTOR
    return fixed * (1 if s.mode == "fwd" else 2) + timing + calls * call_s + rounds


def seconds_of(s: AttentionSpec, nominal: dict = NOMINAL_TFLOPS) -> float:
    """Planned seconds of one shard's spec on an H200 (module docstring: an estimate, not a measurement)."""
    total = SHARD_S
    if s.experiment in s.PACKED:
        flops = attention_flops(len(s.seqlens), s.heads, max(s.seqlens), max(s.seqlens), s.head_dim, s.causal, s.mode)
        return total + sum(_point_seconds(s, impl, False, flops, nominal) for impl in s.impls)
    for i in range(len(s.seqlens)):
        b, h, nq, nk = s.shape(i)
        flops = attention_flops(b, h, nq, nk, s.head_dim, s.causal, s.mode)
        scores = b * h * nq * nk
        total += sum(_point_seconds(s, impl, cfg is not None, flops, nominal, scores) for impl, cfg in s.variants())
    return total


def keys_of(s: AttentionSpec, gluon_fp8: tuple[str, ...] = ()) -> set[tuple]:
    """The kernel specialisations a shard's spec compiles (to count their first-compile cost once per run);
    ``gluon_fp8``: the FP8 implementations (the FP8 family's), which run the FA-3 kernel on e4m3 unless
    ``-triton``: one variant per mask."""
    shapes = [s.shape(i) for i in range(len(s.seqlens))] if s.experiment not in s.PACKED else [(0, 0, 1, 1)]
    keys = set()
    for _, h, nq, nk in shapes:
        setting = (s.dtype, s.head_dim, s.causal, nq % 128 == 0, nk % 128 == 0)
        for impl, cfg in s.variants():
            if impl == UPSTREAM_FA:  # one kernel per query heads per K/V head too (grouped-query packing)
                group = h // s.kv_heads(h) if h else 1
                keys.add(("cute", impl, *setting[:3], group))
                if s.mode != "fwd":
                    keys.add(("cute-bwd", impl, *setting[:3], group))
            if not impl.startswith("ours"):
                continue
            kernel = "ours-fa2" if impl == "ours-fa2-padded" else impl
            if impl in FA3_IMPLS or impl == FA3_BWD:  # (FA3_BWD's forward is ours-fa3's kernel)
                keys.add(("gluon", "ours-fa3" if impl == FA3_BWD else kernel, *setting[:3]))
            elif impl in gluon_fp8 and "-triton" not in impl:
                keys.add(("gluon", impl.removesuffix("-e2e"), *setting[:3]))
            elif cfg is not None:
                keys.add(("fixed", kernel, cfg, *setting))
            else:
                keys.add(("tuned" if impl in TUNED else "fixed", kernel, "fwd", *setting))
            if s.mode != "fwd":
                keys.add(("gluon" if impl == FA3_BWD else "fixed", kernel, "bwd", *setting))
    return keys
