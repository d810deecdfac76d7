"""The attention family's plan: what one shard measures (``Spec``), the shards of the config, their cost.

Kept free of torch and Triton so that the workflow can plan its jobs without importing them
(``analysis.families.attention.run`` measures a Spec). A shard is one (experiment, dtype, head_dim, causal,
mode) combination of the ``attention`` config section (decode adds the K/V heads and the query length), so a
rerun resumes shard by shard. Names: ``<experiment>_<dtype>_d<head_dim>_<full|causal>``, then ``_bwd`` or
``_fwdbwd`` for the gradient modes (forward shards keep the names they had before modes existed, so their
results are reused), then ``_hkv<H_kv>_q<Nq>`` for decode. ``checks(config)`` are the interpreter checks: our
kernel at tiny, odd shapes on the CPU, correctness only.

``Spec`` carries its experiments' vocabulary as class attributes (``EXPERIMENT_IMPLS``, ``FORWARD_ONLY``, …),
so that a family measuring other experiments on the same [B, H, N, d] points (FP8 attention) subclasses it.

``estimate_seconds`` is a planning aid, not a measurement: per-point costs fitted to the shipped H200 run's
logs (a new process per shard; compiling and autotuning our FA-2 kernel on every new shape; the harness's
warm-up and repetition time; an assumed doubling for gradient modes; and a term for long calls at nominal
throughputs: each point runs its implementation about nine times outside the timed repetitions, the
autotuner some fifty more). It keeps the default grid's budget visible (``workflow/config.yaml`` quotes it,
``python -m analysis.budget`` recomputes it) and is checked by the tests; the real cost is in each shard's log.
"""

from __future__ import annotations

import dataclasses
import re
from typing import ClassVar

from analysis.core.flops import attention_flops

# Dense attention on [B, H, N, d] tensors: every experiment may compare these.
DENSE_IMPLS = ("ours-fa2", "ours-fa1", "naive", "sdpa-math", "sdpa-efficient", "sdpa-flash", "sdpa-cudnn")
DECODE_IMPLS = ("ours-decode", "ours-decode-unsplit", "copy-kv")
VARLEN_IMPLS = ("ours-varlen", "ours-fa2-padded", "sdpa-efficient-padded")
# FlashAttention-3 (kernels/attention/fa3.py, Gluon, sm_90): ours-fa3 is its full schedule; ours-fa3-<name>
# the same kernel with one technique switched off (the names of fa3.SCHEDULES; a test keeps them equal).
FA3_ABLATIONS = ("no-warp-specialize", "no-pingpong", "no-overlap", "no-tma")
FA3_IMPLS = ("ours-fa3",) + tuple(f"ours-fa3-{a}" for a in FA3_ABLATIONS)
IMPLS = DENSE_IMPLS + ("ours-fa2-eager",) + DECODE_IMPLS + VARLEN_IMPLS + FA3_IMPLS
# Which implementations each experiment can run.
EXPERIMENT_IMPLS = {
    "fa2-setting": ("ours-fa3",) + DENSE_IMPLS,
    "fa1-setting": DENSE_IMPLS,
    "gain-surface": DENSE_IMPLS,
    "block-sweep": ("ours-fa2",),
    "rescale-ablation": ("ours-fa2", "ours-fa2-eager"),
    "memory": DENSE_IMPLS,
    "decode": DECODE_IMPLS + DENSE_IMPLS,
    "varlen": VARLEN_IMPLS,
    "fa3-ablation": FA3_IMPLS + ("ours-fa2", "sdpa-cudnn"),
    "interpreter-check": DENSE_IMPLS,
}
EXPERIMENTS = tuple(EXPERIMENT_IMPLS)
MODES = ("fwd", "bwd", "fwd+bwd")
FORWARD_ONLY = ("block-sweep", "rescale-ablation", "decode", "interpreter-check", "fa3-ablation")
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
class Spec:
    """One shard of the attention grid (see ``workflow/config.yaml`` for what each field means)."""

    # the experiments' vocabulary (a subclass measuring other experiments on the same points sets its own)
    EXPERIMENT_IMPLS: ClassVar[dict[str, tuple[str, ...]]] = EXPERIMENT_IMPLS
    FORWARD_ONLY: ClassVar[tuple[str, ...]] = FORWARD_ONLY
    INPUTS: ClassVar[tuple[str, ...]] = ("normal",)  # input distributions; other than normal: INPUT_EXPERIMENTS
    INPUT_EXPERIMENTS: ClassVar[tuple[str, ...]] = ()
    HIDDEN_SHAPED: ClassVar[tuple[str, ...]] = ("fa2-setting", "rescale-ablation", "fa3-ablation")
    TOKEN_SHAPED: ClassVar[tuple[str, ...]] = ("gain-surface", "block-sweep")

    experiment: str
    dtype: str
    head_dim: int
    causal: bool
    seqlens: list[int]  # query lengths (varlen: the lengths of the batch's sequences)
    impls: list[str]
    mode: str = "fwd"
    tokens: int = 16384
    hidden: int = 2048
    batch: int = 1
    heads: int = 16
    heads_kv: int | None = None  # K/V heads (default: = heads); fewer is grouped-query attention
    seqlen_k: list[int] | None = None  # key lengths, one per entry of seqlens (default: = seqlens)
    configs: list[str] | None = None  # block-sweep: the FA2Config strings our kernel is pinned to
    check_rows: int = 128
    inputs: str = "normal"  # the input distribution (INPUTS)
    warmup_ms: float = DEFAULT_WARMUP_MS
    rep_ms: float = DEFAULT_REP_MS
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
        if self.experiment == "block-sweep":
            if not self.configs:
                raise ValueError("block-sweep needs a list of configs")
            for text in self.configs:  # a typo fails when the workflow is planned, not in a GPU job
                if not CONFIG_PATTERN.match(text):
                    raise ValueError(f"cannot parse FA-2 config {text!r}: expected the form {CONFIG_PATTERN.pattern}")
                check_tiles(text)
        elif self.configs:
            raise ValueError(f"configs apply to block-sweep only, not to {self.experiment!r}")
        if self.inputs not in self.INPUTS:
            raise ValueError(f"unknown inputs {self.inputs!r}; known: {self.INPUTS}")
        if self.inputs != "normal" and self.experiment not in self.INPUT_EXPERIMENTS:
            where = " or ".join(self.INPUT_EXPERIMENTS) or "no experiment"
            raise ValueError(f"inputs {self.inputs!r} apply to {where} only, not to {self.experiment!r}")
        if self.experiment == "varlen" and (not self.seqlens or min(self.seqlens) < 1):
            raise ValueError("varlen needs at least one sequence, each of length >= 1")

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
        if self.experiment == "block-sweep":
            return [(impl, cfg) for impl in self.impls for cfg in self.configs]
        return [(impl, None) for impl in self.impls]

    def points(self) -> int:
        if self.experiment == "varlen":
            return len(self.impls)
        return len(self.seqlens) * len(self.variants())


def spec(fields: dict) -> Spec:
    return Spec(**fields)


# --- the shards of the config ----------------------------------------------------------------------------

MODE_SLUG = {"fwd": "", "bwd": "_bwd", "fwd+bwd": "_fwdbwd"}


def _flag(causal: bool) -> str:
    return "causal" if causal else "full"


def shard_name(experiment: str, dtype: str, head_dim: int, causal: bool, mode: str = "fwd", extra: str = "") -> str:
    return f"{experiment}_{dtype}_d{head_dim}_{_flag(causal)}{MODE_SLUG[mode]}{extra}"


def _timing(att: dict, exp: dict) -> dict:
    """The experiment's own warm-up/repetition times, where it sets them, else the attention-wide ones."""
    pick = lambda key: att[key] if exp.get(key) is None else exp[key]  # noqa: E731
    return dict(warmup_ms=pick("warmup_ms"), rep_ms=pick("rep_ms"), check_rows=att["check_rows"])


def checked(where: str, name: str, fields: dict, spec_class: type[Spec] = Spec) -> dict:
    """``fields`` after the checks that tie config fields together, made when the workflow is planned so that
    a bad combination fails there with its config section ``where`` named, not in a job: ``Spec``'s own
    checks and the shape of every point (e.g. hidden a multiple of head_dim)."""
    try:
        s = spec_class(**fields)
        for i in range(len(s.seqlens)):
            s.shape(i)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where} (shard {name}): {exc}") from None
    return fields


def shards(config: dict) -> dict[str, dict]:
    """Shard name → Spec fields for every GPU benchmark job of the ``attention`` config section (the block
    sweep's configurations default to those of the ``traffic`` section)."""
    att = config["attention"]
    out: dict[str, dict] = {}
    section = {
        "fa2-setting": "fa2_setting",
        "fa1-setting": "fa1_setting",
        "gain-surface": "gain_surface",
        "block-sweep": "block_sweep",
        "rescale-ablation": "rescale_ablation",
    }

    def add(name: str, **fields) -> None:
        if name in out:
            raise ValueError(f"the attention config makes shard {name!r} twice (overlapping grids)")
        where = f"attention.{section.get(fields['experiment'], fields['experiment'].replace('-', '_'))}"
        out[name] = checked(where, name, fields)

    fa2 = att["fa2_setting"]
    if fa2.get("enabled", True):
        for grid in fa2["grids"]:
            for mode in grid["modes"]:
                for dtype in grid["dtypes"]:
                    for d in grid["head_dims"]:
                        for causal in grid["causal"]:
                            add(
                                shard_name("fa2-setting", dtype, d, causal, mode),
                                experiment="fa2-setting",
                                dtype=dtype,
                                head_dim=d,
                                causal=causal,
                                mode=mode,
                                seqlens=grid["seqlens"],
                                impls=grid["impls"],
                                tokens=fa2["tokens"],
                                hidden=fa2["hidden"],
                                **_timing(att, fa2),
                            )
    fa1 = att["fa1_setting"]
    if fa1["enabled"]:
        for mode in fa1["modes"]:
            add(
                shard_name("fa1-setting", fa1["dtype"], fa1["head_dim"], fa1["causal"], mode),
                experiment="fa1-setting",
                dtype=fa1["dtype"],
                head_dim=fa1["head_dim"],
                causal=fa1["causal"],
                mode=mode,
                seqlens=fa1["seqlens"],
                impls=fa1["impls"],
                batch=fa1["batch"],
                heads=fa1["heads"],
                **_timing(att, fa1),
            )
    gain = att["gain_surface"]
    if gain["enabled"]:
        for mode in gain["modes"]:
            for d in gain["head_dims"]:
                add(
                    shard_name("gain-surface", gain["dtype"], d, gain["causal"], mode),
                    experiment="gain-surface",
                    dtype=gain["dtype"],
                    head_dim=d,
                    causal=gain["causal"],
                    mode=mode,
                    seqlens=gain["seqlens"],
                    impls=gain["impls"],
                    tokens=gain["tokens"],
                    heads=gain["heads"],
                    **_timing(att, gain),
                )
    sweep = att["block_sweep"]
    traffic_configs = ((config.get("traffic") or {}).get("block_sweep") or {}).get("configs")
    configs = sweep["configs"] if sweep["configs"] is not None else traffic_configs
    if sweep["enabled"] and configs:
        for d in sweep["head_dims"]:
            add(
                shard_name("block-sweep", sweep["dtype"], d, sweep["causal"]),
                experiment="block-sweep",
                dtype=sweep["dtype"],
                head_dim=d,
                causal=sweep["causal"],
                seqlens=sweep["seqlens"],
                impls=["ours-fa2"],
                configs=list(configs),
                tokens=sweep["tokens"],
                heads=sweep["heads"],
                **_timing(att, sweep),
            )
    resc = att["rescale_ablation"]
    if resc["enabled"]:
        for dtype in resc["dtypes"]:
            for d in resc["head_dims"]:
                for causal in resc["causal"]:
                    add(
                        shard_name("rescale-ablation", dtype, d, causal),
                        experiment="rescale-ablation",
                        dtype=dtype,
                        head_dim=d,
                        causal=causal,
                        seqlens=resc["seqlens"],
                        impls=resc["impls"],
                        tokens=resc["tokens"],
                        hidden=resc["hidden"],
                        **_timing(att, resc),
                    )
    mem = att["memory"]
    if mem.get("enabled", True):
        for mode in mem["modes"]:
            add(
                shard_name("memory", mem["dtype"], mem["head_dim"], mem["causal"], mode),
                experiment="memory",
                dtype=mem["dtype"],
                head_dim=mem["head_dim"],
                causal=mem["causal"],
                mode=mode,
                seqlens=mem["seqlens"] if mode == "fwd" else mem["backward_seqlens"],
                impls=mem["impls"],
                batch=mem["batch"],
                heads=mem["heads"],
                **_timing(att, mem),
            )
    dec = att["decode"]
    if dec["enabled"]:
        for hk in dec["heads_kv"]:
            for nq in dec["query_lens"]:
                add(
                    shard_name("decode", dec["dtype"], dec["head_dim"], dec["causal"], extra=f"_hkv{hk}_q{nq}"),
                    experiment="decode",
                    dtype=dec["dtype"],
                    head_dim=dec["head_dim"],
                    causal=dec["causal"],
                    seqlens=[nq] * len(dec["seqlens_k"]),
                    seqlen_k=dec["seqlens_k"],
                    impls=dec["impls"],
                    batch=dec["batch"],
                    heads=dec["heads"],
                    heads_kv=hk,
                    **_timing(att, dec),
                )
    abl = att["fa3_ablation"]
    if abl["enabled"]:
        for d in abl["head_dims"]:
            for causal in abl["causal"]:
                add(
                    shard_name("fa3-ablation", abl["dtype"], d, causal),
                    experiment="fa3-ablation",
                    dtype=abl["dtype"],
                    head_dim=d,
                    causal=causal,
                    seqlens=abl["seqlens"],
                    impls=abl["impls"],
                    tokens=abl["tokens"],
                    hidden=abl["hidden"],
                    **_timing(att, abl),
                )
    var = att["varlen"]
    if var["enabled"]:
        for mode in var["modes"]:
            for causal in var["causal"]:
                add(
                    shard_name("varlen", var["dtype"], var["head_dim"], causal, mode),
                    experiment="varlen",
                    dtype=var["dtype"],
                    head_dim=var["head_dim"],
                    causal=causal,
                    mode=mode,
                    seqlens=var["seqlens"],
                    impls=var["impls"],
                    heads=var["heads"],
                    **_timing(att, var),
                )
    return out


def checks(config: dict) -> dict[str, dict]:
    """Shard name → Spec fields for the interpreter checks (CPU, correctness only) of
    ``attention.interpreter_check``: one per (dtype, head_dim, causal), our kernel at every
    (seqlens[i], seqlen_k[i]); none when the section's ``enabled`` is false."""
    att = config["attention"]
    c = att["interpreter_check"]
    out = {}
    for dtype in c["dtypes"]:
        for d in c["head_dims"]:
            for causal in c["causal"]:
                name = f"check_{dtype}_d{d}_{_flag(causal)}"
                fields = dict(
                    experiment="interpreter-check",
                    dtype=dtype,
                    head_dim=d,
                    causal=causal,
                    seqlens=c["seqlens"],
                    seqlen_k=c["seqlen_k"],
                    batch=c["batch"],
                    heads=c["heads"],
                    impls=["ours-fa2"],
                    check_rows=att["check_rows"],
                )
                out[name] = checked("attention.interpreter_check", name, fields)
    return out


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
}
# Compiling a kernel specialisation (dtype, head dim, mask, even/uneven tails) the first time, with an empty
# Triton cache, fitted to the first points of the shipped run's shards: the tuned forward compiles its seven
# candidates, a fixed-configuration kernel one or two, an FA-3 variant ("gluon") one (TMA handles the tails,
# so N needs no variant of its own). Paid once per specialisation per run.
COMPILE_S = {"tuned": 6.0, "fixed": 1.5, "gluon": 3.5}
# Materialising implementations: N×N tensors alive at the peak (forward; doubled with gradients). Beyond
# the memory of an H200 such a point fails at once ("oom") and costs only its setup.
MATERIALISED = {"naive": 2, "sdpa-math": 4}
GPU_BYTES = 141e9
DEFAULT_TFLOPS = 300


def _point_seconds(s: Spec, impl: str, pinned: bool, flops: float, nominal: dict, scores: int = 0) -> float:
    """``scores``: elements of the point's N×N score tensors (B·H·Nq·Nk)."""
    timing = (s.warmup_ms + s.rep_ms) / 1e3
    tensors = MATERIALISED.get(impl, 0) * (1 if s.mode == "fwd" else 2)
    if tensors * scores * 2 > 0.8 * GPU_BYTES:
        return OTHER_S
    tuned = impl in TUNED and not pinned
    fixed = TUNE_S if tuned else OURS_S if impl.startswith("ours") else OTHER_S
    call_s = flops / (nominal.get(impl, DEFAULT_TFLOPS) * 1e12)
    calls = CALLS + (TUNE_CALLS if tuned else 0)
    return fixed * (1 if s.mode == "fwd" else 2) + timing + calls * call_s


def seconds_of(s: Spec, nominal: dict = NOMINAL_TFLOPS) -> float:
    """Planned seconds of one shard's spec on an H200 (module docstring: an estimate, not a measurement)."""
    total = SHARD_S
    if s.experiment == "varlen":
        flops = attention_flops(len(s.seqlens), s.heads, max(s.seqlens), max(s.seqlens), s.head_dim, s.causal, s.mode)
        return total + sum(_point_seconds(s, impl, False, flops, nominal) for impl in s.impls)
    for i in range(len(s.seqlens)):
        b, h, nq, nk = s.shape(i)
        flops = attention_flops(b, h, nq, nk, s.head_dim, s.causal, s.mode)
        scores = b * h * nq * nk
        total += sum(_point_seconds(s, impl, cfg is not None, flops, nominal, scores) for impl, cfg in s.variants())
    return total


def estimate_seconds(fields: dict) -> float:
    return seconds_of(spec(fields))


def keys_of(s: Spec, gluon_fp8: tuple[str, ...] = ()) -> set[tuple]:
    """The kernel specialisations a shard's spec compiles (to count their first-compile cost once per run);
    ``gluon_fp8``: the FP8 implementations (the FP8 family's), which run the FA-3 kernel on e4m3 unless
    ``-triton``: one variant per mask."""
    shapes = [s.shape(i) for i in range(len(s.seqlens))] if s.experiment != "varlen" else [(0, 0, 1, 1)]
    keys = set()
    for _, _, nq, nk in shapes:
        setting = (s.dtype, s.head_dim, s.causal, nq % 128 == 0, nk % 128 == 0)
        for impl, cfg in s.variants():
            if not impl.startswith("ours"):
                continue
            kernel = "ours-fa2" if impl == "ours-fa2-padded" else impl
            if impl in FA3_IMPLS:
                keys.add(("gluon", kernel, *setting[:3]))
            elif impl in gluon_fp8 and "-triton" not in impl:
                keys.add(("gluon", impl.removesuffix("-e2e"), *setting[:3]))
            elif cfg is not None:
                keys.add(("fixed", kernel, cfg, *setting))
            else:
                keys.add(("tuned" if impl in TUNED else "fixed", kernel, "fwd", *setting))
            if s.mode != "fwd":
                keys.add(("fixed", kernel, "bwd", *setting))
    return keys


def compile_keys(fields: dict) -> set[tuple]:
    return keys_of(spec(fields))
