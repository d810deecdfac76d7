"""The attention grid of the workflow: its shards, made from the config, and what they are expected to cost.

``attention_shards(config["attention"])`` gives shard name → ``analysis.experiments.attention.Spec``
fields; ``workflow/rules/common.smk`` makes one benchmark job per shard, so a rerun resumes shard by shard.
A shard is one (experiment, dtype, head_dim, causal, mode) combination (decode adds the K/V heads and the
query length). Names: ``<experiment>_<dtype>_d<head_dim>_<full|causal>``, then ``_bwd`` or ``_fwdbwd``
for the gradient modes (forward shards keep the names they had before modes existed, so their results
are reused), then ``_hkv<H_kv>_q<Nq>`` for decode.

``estimate_seconds`` is a planning aid, not a measurement: per-point costs fitted by eye to the shipped
H200 run (reports/reference/h200/logs: about 4.5 s between shards for the process, imports and CUDA
context; about 1.3 s of compiling and autotuning for our FA-2 kernel on every new shape, a few tenths
of a second to set up any other point; plus the harness's warm-up and repetition time), with an assumed
doubling for gradient modes and a term for long calls (each point runs its implementation about nine
times outside the timed repetitions, the autotuner some fifty more) at nominal throughputs. It keeps
the default grid's budget visible (``workflow/config.yaml`` quotes it) and is checked by the tests; the
real cost is in each shard's log.
"""

from __future__ import annotations

from analysis.experiments.spec import FA3_IMPLS, FP8_IMPLS, Spec
from analysis.flops import attention_flops

MODE_SLUG = {"fwd": "", "bwd": "_bwd", "fwd+bwd": "_fwdbwd"}

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
    **{impl: 600 for impl in FP8_IMPLS},
    **{impl: 550 for impl in FA3_IMPLS},
}
# Compiling a kernel specialisation (dtype, head dim, mask, even/uneven tails) the first time, with an empty
# Triton cache: the tuned forward compiles its seven candidates (the shipped run's first points took 5-14 s
# where the cache was cold), a fixed-configuration kernel one or two. Paid once per specialisation per run.
# gluon: an FA-3 variant (TMA handles the tails, so N needs no variant of its own; 1.2-4.8 s, median 3.5, when the
# H200 machine compiled 33 of them)
COMPILE_S = {"tuned": 6.0, "fixed": 1.5, "gluon": 3.5}
# Materialising implementations: N×N tensors alive at the peak (forward; doubled with gradients). Beyond
# the memory of an H200 such a point fails at once ("oom") and costs only its setup.
MATERIALISED = {"naive": 2, "sdpa-math": 4}
GPU_BYTES = 141e9
DEFAULT_TFLOPS = 300


def _flag(causal: bool) -> str:
    return "causal" if causal else "full"


def shard_name(experiment: str, dtype: str, head_dim: int, causal: bool, mode: str = "fwd", extra: str = "") -> str:
    return f"{experiment}_{dtype}_d{head_dim}_{_flag(causal)}{MODE_SLUG[mode]}{extra}"


def _timing(att: dict, exp: dict) -> dict:
    """The experiment's own warm-up/repetition times, where it sets them, else the attention-wide ones."""
    pick = lambda key: att[key] if exp.get(key) is None else exp[key]  # noqa: E731
    return dict(warmup_ms=pick("warmup_ms"), rep_ms=pick("rep_ms"), check_rows=att["check_rows"])


def _checked(section: str, name: str, fields: dict) -> dict:
    """``fields`` after the checks that tie config fields together, made when the workflow is planned so that
    a bad combination fails there with its config section named, not in a job: ``Spec``'s own checks and
    the shape of every point (e.g. hidden a multiple of head_dim)."""
    try:
        spec = Spec(**fields)
        for i in range(len(spec.seqlens)):
            spec.shape(i)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"attention.{section} (shard {name}): {exc}") from None
    return fields


def attention_shards(att: dict) -> dict[str, dict]:
    """Shard name → Spec fields for every GPU benchmark job of the ``attention`` config section."""
    shards: dict[str, dict] = {}
    section = {"fa2-setting": "fa2_setting", "fa1-setting": "fa1_setting", "gain-surface": "gain_surface",
               "block-sweep": "block_sweep", "rescale-ablation": "rescale_ablation", "fp8-speed": "fp8_speed",
               "fp8-accuracy": "fp8_accuracy"}  # fmt: skip

    def add(name: str, **fields) -> None:
        if name in shards:
            raise ValueError(f"the attention config makes shard {name!r} twice (overlapping grids)")
        shards[name] = _checked(section.get(fields["experiment"], fields["experiment"]), name, fields)

    fa2 = att["fa2_setting"]
    if fa2.get("enabled", True):
        for grid in fa2["grids"]:
            for mode in grid["modes"]:
                for dtype in grid["dtypes"]:
                    for d in grid["head_dims"]:
                        for causal in grid["causal"]:
                            add(shard_name("fa2-setting", dtype, d, causal, mode), experiment="fa2-setting",
                                dtype=dtype, head_dim=d, causal=causal, mode=mode, seqlens=grid["seqlens"],
                                impls=grid["impls"], tokens=fa2["tokens"], hidden=fa2["hidden"],
                                **_timing(att, fa2))  # fmt: skip
    fa1 = att["fa1_setting"]
    if fa1["enabled"]:
        for mode in fa1["modes"]:
            add(shard_name("fa1-setting", fa1["dtype"], fa1["head_dim"], fa1["causal"], mode),
                experiment="fa1-setting", dtype=fa1["dtype"], head_dim=fa1["head_dim"], causal=fa1["causal"],
                mode=mode, seqlens=fa1["seqlens"], impls=fa1["impls"], batch=fa1["batch"], heads=fa1["heads"],
                **_timing(att, fa1))  # fmt: skip
    gain = att["gain_surface"]
    if gain["enabled"]:
        for mode in gain["modes"]:
            for d in gain["head_dims"]:
                add(shard_name("gain-surface", gain["dtype"], d, gain["causal"], mode), experiment="gain-surface",
                    dtype=gain["dtype"], head_dim=d, causal=gain["causal"], mode=mode, seqlens=gain["seqlens"],
                    impls=gain["impls"], tokens=gain["tokens"], heads=gain["heads"], **_timing(att, gain))  # fmt: skip
    sweep = att["block_sweep"]
    configs = sweep["configs"] if sweep["configs"] is not None else att["traffic"]["block_sweep"]["configs"]
    if sweep["enabled"] and configs:
        for d in sweep["head_dims"]:
            add(shard_name("block-sweep", sweep["dtype"], d, sweep["causal"]), experiment="block-sweep",
                dtype=sweep["dtype"], head_dim=d, causal=sweep["causal"], seqlens=sweep["seqlens"],
                impls=["ours-fa2"], configs=list(configs), tokens=sweep["tokens"], heads=sweep["heads"],
                **_timing(att, sweep))  # fmt: skip
    resc = att["rescale_ablation"]
    if resc["enabled"]:
        for dtype in resc["dtypes"]:
            for d in resc["head_dims"]:
                for causal in resc["causal"]:
                    add(shard_name("rescale-ablation", dtype, d, causal), experiment="rescale-ablation",
                        dtype=dtype, head_dim=d, causal=causal, seqlens=resc["seqlens"], impls=resc["impls"],
                        tokens=resc["tokens"], hidden=resc["hidden"], **_timing(att, resc))  # fmt: skip
    mem = att["memory"]
    if mem.get("enabled", True):
        for mode in mem["modes"]:
            add(shard_name("memory", mem["dtype"], mem["head_dim"], mem["causal"], mode), experiment="memory",
                dtype=mem["dtype"], head_dim=mem["head_dim"], causal=mem["causal"], mode=mode,
                seqlens=mem["seqlens"] if mode == "fwd" else mem["backward_seqlens"], impls=mem["impls"],
                batch=mem["batch"], heads=mem["heads"], **_timing(att, mem))  # fmt: skip
    dec = att["decode"]
    if dec["enabled"]:
        for hk in dec["heads_kv"]:
            for nq in dec["query_lens"]:
                add(shard_name("decode", dec["dtype"], dec["head_dim"], dec["causal"], extra=f"_hkv{hk}_q{nq}"),
                    experiment="decode", dtype=dec["dtype"], head_dim=dec["head_dim"], causal=dec["causal"],
                    seqlens=[nq] * len(dec["seqlens_k"]), seqlen_k=dec["seqlens_k"], impls=dec["impls"],
                    batch=dec["batch"], heads=dec["heads"], heads_kv=hk, **_timing(att, dec))  # fmt: skip
    f8 = att["fp8_speed"]
    if f8["enabled"]:
        for d in f8["head_dims"]:
            for causal in f8["causal"]:
                add(shard_name("fp8-speed", f8["dtype"], d, causal), experiment="fp8-speed", dtype=f8["dtype"],
                    head_dim=d, causal=causal, seqlens=f8["seqlens"], impls=f8["impls"], tokens=f8["tokens"],
                    hidden=f8["hidden"], **_timing(att, f8))  # fmt: skip
    abl = att["fa3_ablation"]
    if abl["enabled"]:
        for d in abl["head_dims"]:
            for causal in abl["causal"]:
                add(shard_name("fa3-ablation", abl["dtype"], d, causal), experiment="fa3-ablation", dtype=abl["dtype"],
                    head_dim=d, causal=causal, seqlens=abl["seqlens"], impls=abl["impls"], tokens=abl["tokens"],
                    hidden=abl["hidden"], **_timing(att, abl))  # fmt: skip
    acc = att["fp8_accuracy"]
    if acc["enabled"]:  # nothing is timed: no warm-up, no repetitions
        for inputs in acc["inputs"]:
            for dtype in acc["dtypes"]:
                add(shard_name("fp8-accuracy", dtype, acc["head_dim"], acc["causal"], extra=f"_{inputs}"),
                    experiment="fp8-accuracy", dtype=dtype, head_dim=acc["head_dim"], causal=acc["causal"],
                    seqlens=acc["seqlens"], impls=acc["impls"], batch=acc["batch"], heads=acc["heads"],
                    inputs=inputs, warmup_ms=0, rep_ms=0, check_rows=acc["check_rows"])  # fmt: skip
    var = att["varlen"]
    if var["enabled"]:
        for mode in var["modes"]:
            for causal in var["causal"]:
                add(shard_name("varlen", var["dtype"], var["head_dim"], causal, mode), experiment="varlen",
                    dtype=var["dtype"], head_dim=var["head_dim"], causal=causal, mode=mode, seqlens=var["seqlens"],
                    impls=var["impls"], heads=var["heads"], **_timing(att, var))  # fmt: skip
    return shards


def interpreter_shards(att: dict) -> dict[str, dict]:
    """Shard name → Spec fields for the interpreter checks (CPU, correctness only) of ``attention.interpreter_check``:
    one per (dtype, head_dim, causal), our kernel at every (seqlens[i], seqlen_k[i])."""
    c = att["interpreter_check"]
    shards = {}
    for dtype in c["dtypes"]:
        for d in c["head_dims"]:
            for causal in c["causal"]:
                name = f"check_{dtype}_d{d}_{_flag(causal)}"
                fields = dict(experiment="interpreter-check", dtype=dtype, head_dim=d, causal=causal,
                              seqlens=c["seqlens"], seqlen_k=c["seqlen_k"], batch=c["batch"], heads=c["heads"],
                              impls=["ours-fa2"], check_rows=att["check_rows"])  # fmt: skip
                shards[name] = _checked("interpreter_check", name, fields)
    return shards


def _point_seconds(spec: Spec, impl: str, pinned: bool, flops: float, scores: int = 0) -> float:
    """``scores``: elements of the point's N×N score tensors (B·H·Nq·Nk)."""
    timing = (spec.warmup_ms + spec.rep_ms) / 1e3
    tensors = MATERIALISED.get(impl, 0) * (1 if spec.mode == "fwd" else 2)
    if tensors * scores * 2 > 0.8 * GPU_BYTES:
        return OTHER_S
    tuned = impl in TUNED and not pinned
    fixed = TUNE_S if tuned else OURS_S if impl.startswith("ours") else OTHER_S
    call_s = flops / (NOMINAL_TFLOPS.get(impl, DEFAULT_TFLOPS) * 1e12)
    calls = CALLS + (TUNE_CALLS if tuned else 0)
    return fixed * (1 if spec.mode == "fwd" else 2) + timing + calls * call_s


def estimate_seconds(fields: dict) -> float:
    """Planned seconds of one shard on an H200 (see the module docstring: an estimate, not a measurement)."""
    spec = Spec(**fields)
    total = SHARD_S
    if spec.experiment == "varlen":
        flops = attention_flops(len(spec.seqlens), spec.heads, max(spec.seqlens), max(spec.seqlens),
                                spec.head_dim, spec.causal, spec.mode)  # fmt: skip
        return total + sum(_point_seconds(spec, impl, False, flops) for impl in spec.impls)
    for i in range(len(spec.seqlens)):
        b, h, nq, nk = spec.shape(i)
        flops = attention_flops(b, h, nq, nk, spec.head_dim, spec.causal, spec.mode)
        scores = b * h * nq * nk
        total += sum(_point_seconds(spec, impl, cfg is not None, flops, scores) for impl, cfg in spec.variants())
    return total


def compile_keys(fields: dict) -> set[tuple]:
    """The kernel specialisations a shard compiles (to count their first-compile cost once per run)."""
    spec = Spec(**fields)
    shapes = [spec.shape(i) for i in range(len(spec.seqlens))] if spec.experiment != "varlen" else [(0, 0, 1, 1)]
    keys = set()
    for _, _, nq, nk in shapes:
        setting = (spec.dtype, spec.head_dim, spec.causal, nq % 128 == 0, nk % 128 == 0)
        for impl, cfg in spec.variants():
            if not impl.startswith("ours"):
                continue
            kernel = "ours-fa2" if impl == "ours-fa2-padded" else impl
            if impl in FA3_IMPLS:
                keys.add(("gluon", kernel, *setting[:3]))
            elif impl in FP8_IMPLS and "-triton" not in impl:  # the FA-3 kernel on e4m3: one variant per mask
                keys.add(("gluon", impl.removesuffix("-e2e"), *setting[:3]))
            elif cfg is not None:
                keys.add(("fixed", kernel, cfg, *setting))
            else:
                keys.add(("tuned" if impl in TUNED else "fixed", kernel, "fwd", *setting))
            if spec.mode != "fwd":
                keys.add(("fixed", kernel, "bwd", *setting))
    return keys


def budget(shards: dict[str, dict]) -> dict[str, dict]:
    """Experiment → shards, points, estimated seconds with a warm Triton cache (``seconds``) and the extra
    seconds of first compiles with an empty one (``compile``; each specialisation counted once, under the
    first shard in name order that needs it)."""
    return tally_budget(shards, lambda fields: Spec(**fields), estimate_seconds, compile_keys, COMPILE_S)


def tally_budget(shards: dict[str, dict], spec_of, estimate, keys_of, compile_s: dict) -> dict[str, dict]:
    """``budget`` for any grid: ``spec_of(fields)`` gives a shard's spec (its ``experiment`` and ``points()``),
    ``estimate(fields)`` its warm-cache seconds, ``keys_of(fields)`` the specialisations it compiles, whose
    first element keys ``compile_s`` (seconds of one first compile)."""
    out: dict[str, dict] = {}
    seen: set[tuple] = set()
    for name in sorted(shards):
        fields = shards[name]
        spec = spec_of(fields)
        e = out.setdefault(spec.experiment, {"shards": 0, "points": 0, "seconds": 0.0, "compile": 0.0})
        e["shards"] += 1
        e["points"] += spec.points()
        e["seconds"] += estimate(fields)
        new = keys_of(fields) - seen
        seen |= new
        e["compile"] += sum(compile_s[k[0]] for k in new)
    return out


def budget_table(shards: dict[str, dict]) -> list[str]:
    """The budget as the comment lines quoted in ``workflow/config.yaml``."""
    return format_budget(budget(shards))


def format_budget(b: dict[str, dict]) -> list[str]:
    """A ``budget`` (experiment → shards, points, seconds, compile) as aligned comment lines with a total."""
    lines = [f"{'experiment':<20}{'shards':>7}{'points':>8}{'est. s':>8}{'+compile':>10}"]
    for name, e in b.items():
        lines.append(f"{name:<20}{e['shards']:>7}{e['points']:>8}{e['seconds']:>8.0f}{e['compile']:>10.0f}")
    tot = {k: sum(e[k] for e in b.values()) for k in ("shards", "points", "seconds", "compile")}
    lines.append(f"{'total':<20}{tot['shards']:>7}{tot['points']:>8}{tot['seconds']:>8.0f}{tot['compile']:>10.0f}")
    return lines


def load_config(paths) -> dict:
    """The workflow config as Snakemake builds it from config files: later files update earlier ones
    (nested mappings merged, anything else replaced), then checked and completed as the Snakefile does
    (``analysis.configuration.validate_config``: the schema, its defaults, the cross-field checks)."""
    from pathlib import Path

    import yaml

    from analysis.configuration import validate_config

    config: dict = {}

    def merge(into: dict, new: dict) -> None:
        for key, value in new.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = value

    for p in paths:
        merge(config, yaml.safe_load(Path(p).read_text()))
    validate_config(config, Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml")
    return config


if __name__ == "__main__":  # python -m analysis.experiments.grid workflow/config.yaml [more config files]
    import sys

    cfg = load_config(sys.argv[1:] or ["workflow/config.yaml"])
    print("\n".join(budget_table(attention_shards(cfg["attention"]))))
