"""The attention family's plan: its experiments, what one shard measures (``Spec``), the shards of the config.

Kept free of torch and Triton so that the workflow can plan its jobs without importing them
(``analysis.families.attention.run`` measures a Spec). A shard is one (experiment, dtype, head_dim, causal,
mode) combination of the ``attention`` config section (decode adds the K/V heads and the query length), so a
rerun resumes shard by shard. Names: ``<experiment>_<dtype>_d<head_dim>_<full|causal>``, then ``_bwd`` or
``_fwdbwd`` for the gradient modes (forward shards keep the names they had before modes existed, so their
results are reused), then ``_hkv<H_kv>_q<Nq>`` for decode. ``checks(config)`` are the interpreter checks: our
kernel at tiny, odd shapes on the CPU, correctness only.

``Spec`` is the attention-like families' ``AttentionSpec`` (``analysis.families._shared.attention_plan``: the
implementation names, shard names, planning checks and the cost model they share) with this family's
experiments as its vocabulary. ``estimate_seconds`` is that module's cost model: a planning aid, not a
measurement. ``decode-serving`` (batches of paged requests) has a spec, shards and costs of its own
(``analysis.families.attention.serving_plan``).
"""

from __future__ import annotations

from typing import ClassVar

from analysis.families._shared import attention_plan as shared
from analysis.families._shared.fa3_ablation import FA3_IMPLS
from analysis.families.attention import serving_plan

VARLEN_IMPLS = ("ours-varlen", "ours-fa2-padded", "sdpa-efficient-padded")
IMPLS = (
    shared.DENSE_IMPLS
    + ("ours-fa2-eager",)
    + shared.DECODE_IMPLS
    + VARLEN_IMPLS
    + FA3_IMPLS
    + (shared.FA3_BWD, shared.UPSTREAM_FA)
)
# Which implementations each experiment can run.
EXPERIMENT_IMPLS = {
    "fa2-setting": ("ours-fa3", shared.FA3_BWD) + shared.DENSE_IMPLS + (shared.UPSTREAM_FA,),
    "llama3-70b-heads": ("ours-fa3", shared.FA3_BWD) + shared.DENSE_IMPLS + (shared.UPSTREAM_FA,),
    "fa1-setting": shared.DENSE_IMPLS,
    "gain-surface": shared.DENSE_IMPLS,
    "block-sweep": ("ours-fa2",),
    "rescale-ablation": ("ours-fa2", "ours-fa2-eager"),
    "memory": shared.DENSE_IMPLS,
    "decode": shared.DECODE_IMPLS + shared.DENSE_IMPLS,
    "varlen": VARLEN_IMPLS,
    "fa3-ablation": FA3_IMPLS + ("ours-fa2", "sdpa-cudnn", shared.UPSTREAM_FA),
    "interpreter-check": shared.DENSE_IMPLS,
    serving_plan.EXPERIMENT: serving_plan.SERVING_IMPLS,
}
EXPERIMENTS = tuple(EXPERIMENT_IMPLS)
FORWARD_ONLY = (
    "block-sweep",
    "rescale-ablation",
    "decode",
    "interpreter-check",
    "fa3-ablation",
    serving_plan.EXPERIMENT,
)
COMPILE_S = shared.COMPILE_S  # first-compile seconds of a kernel specialisation, by kind


class Spec(shared.AttentionSpec):
    """One shard of the attention grid (see ``workflow/config.yaml`` for what each field means)."""

    EXPERIMENT_IMPLS: ClassVar[dict[str, tuple[str, ...]]] = EXPERIMENT_IMPLS
    FORWARD_ONLY: ClassVar[tuple[str, ...]] = FORWARD_ONLY
    HIDDEN_SHAPED: ClassVar[tuple[str, ...]] = ("fa2-setting", "rescale-ablation", "fa3-ablation")
    TOKEN_SHAPED: ClassVar[tuple[str, ...]] = ("gain-surface", "block-sweep")
    SWEPT: ClassVar[tuple[str, ...]] = ("block-sweep",)
    PACKED: ClassVar[tuple[str, ...]] = ("varlen",)
    IO_BOUND: ClassVar[tuple[str, ...]] = ("decode",)


def spec(fields: dict) -> Spec | serving_plan.ServingSpec:
    if fields.get("experiment") == serving_plan.EXPERIMENT:
        return serving_plan.ServingSpec(**fields)
    return Spec(**fields)


# --- the shards of the config ----------------------------------------------------------------------------


def _timing(att: dict, exp: dict) -> dict:
    """The experiment's own warm-up/repetition times, where it sets them, else the attention-wide ones; the
    attention-wide repeat rounds and gate rows."""
    pick = lambda key: att[key] if exp.get(key) is None else exp[key]  # noqa: E731
    return dict(
        warmup_ms=pick("warmup_ms"),
        rep_ms=pick("rep_ms"),
        spread_rounds=att["spread_rounds"],
        check_rows=att["check_rows"],
    )


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
        "llama3-70b-heads": "llama3_70b_heads",
    }

    def add(name: str, **fields) -> None:
        if name in out:
            raise ValueError(f"the attention config makes shard {name!r} twice (overlapping grids)")
        where = f"attention.{section.get(fields['experiment'], fields['experiment'].replace('-', '_'))}"
        out[name] = shared.checked(where, name, fields, Spec)

    fa2 = att["fa2_setting"]
    llama = att["llama3_70b_heads"]
    if llama["enabled"]:
        for grid in llama["grids"]:
            for mode in grid["modes"]:
                for causal in grid["causal"]:
                    add(
                        shared.shard_name("llama3-70b-heads", llama["dtype"], llama["head_dim"], causal, mode),
                        experiment="llama3-70b-heads",
                        dtype=llama["dtype"],
                        head_dim=llama["head_dim"],
                        causal=causal,
                        mode=mode,
                        seqlens=grid["seqlens"],
                        impls=grid["impls"],
                        batch=llama["batch"],
                        heads=llama["heads"],
                        heads_kv=llama["heads_kv"],
                        **_timing(att, llama),
                    )
    if fa2.get("enabled", True):
        for grid in fa2["grids"]:
            for mode in grid["modes"]:
                for dtype in grid["dtypes"]:
                    for d in grid["head_dims"]:
                        for causal in grid["causal"]:
                            add(
                                shared.shard_name("fa2-setting", dtype, d, causal, mode),
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
                shared.shard_name("fa1-setting", fa1["dtype"], fa1["head_dim"], fa1["causal"], mode),
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
                    shared.shard_name("gain-surface", gain["dtype"], d, gain["causal"], mode),
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
                shared.shard_name("block-sweep", sweep["dtype"], d, sweep["causal"]),
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
                        shared.shard_name("rescale-ablation", dtype, d, causal),
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
                shared.shard_name("memory", mem["dtype"], mem["head_dim"], mem["causal"], mode),
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
                    shared.shard_name("decode", dec["dtype"], dec["head_dim"], dec["causal"], extra=f"_hkv{hk}_q{nq}"),
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
                    shared.shard_name("fa3-ablation", abl["dtype"], d, causal),
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
                    shared.shard_name("varlen", var["dtype"], var["head_dim"], causal, mode),
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
    serving = att["decode_serving"]
    timing = {k: v for k, v in _timing(att, serving).items() if k != "check_rows"}
    for name, fields in serving_plan.shards(serving, timing).items():
        if name in out:
            raise ValueError(f"the attention config makes shard {name!r} twice (overlapping grids)")
        out[name] = fields
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
                name = f"check_{dtype}_d{d}_{shared.mask_word(causal)}"
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
                out[name] = shared.checked("attention.interpreter_check", name, fields, Spec)
    return out


# --- what the shards cost ----------------------------------------------------------------------------------


def estimate_seconds(fields: dict) -> float:
    """Planned seconds of one shard on an H200 (an estimate: ``analysis.families._shared.attention_plan``,
    ``serving_plan`` for decode-serving)."""
    s = spec(fields)
    return serving_plan.seconds_of(s) if isinstance(s, serving_plan.ServingSpec) else shared.seconds_of(s)


def compile_keys(fields: dict) -> set[tuple]:
    s = spec(fields)
    return serving_plan.keys_of(s) if isinstance(s, serving_plan.ServingSpec) else shared.keys_of(s)
