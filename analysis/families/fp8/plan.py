"""The FP8 family's plan: its experiments on the attention family's points, their shards, their cost.

Torch-free, like every plan. FP8 attention (``kernels/attention/fp8.py``) is measured on the same [B, H, N, d]
points as the attention family, so its spec is the attention-like families' ``AttentionSpec``
(``analysis.families._shared.attention_plan``) with this family's vocabulary (``Fp8Spec``) and its rows go to
the attention table:

- ``fp8-speed``: our FP8 forward against our bf16 FA-2 and SDPA on the same inputs, FA-2 setting shapes
  (batch × N = ``tokens``, heads = ``hidden`` / d), with this run's GEMM ceilings at every point; one shard
  per (head_dim, causal) of ``fp8.speed``.
- ``fp8-accuracy``: nothing timed; the error of every implementation against float64 per input distribution
  (``INPUTS``); one shard per (inputs, dtype) of ``fp8.accuracy``.
- ``fp8-ablation``: the FA-3 ablation on e4m3 (``ours-fp8-block-fa3``, FA-3's full schedule, and each of its
  techniques switched off in turn, ``ours-fp8-block-<switch>``) beside our bf16 FA-3 on the same inputs, FA-2
  setting shapes; one shard per (head_dim, causal) of ``fp8.ablation``.

Implementation names ``ours-fp8-<granularity>[-rot][-p1][-triton][-e2e]``: the scales' granularity (``none``:
cast without scaling), ``-rot`` incoherent processing (Q and K rotated before quantising), ``-p1`` P cast to
e4m3 without its scale of 256, ``-triton`` the portable Triton kernel (else the FA-3 kernel on Hopper, the
Triton one elsewhere, on FP8's default schedule; ``ours-fp8-block-fa3`` is the FA-3 kernel on FA-3's full
schedule, ``ours-fp8-block-<switch>``, a name of ``FA3_ABLATIONS``, with that technique switched off from
it), ``-e2e`` ``fp8.attention`` on the 16-bit inputs, quantisation timed with the kernel
(else inputs quantised before timing, FlashAttention-3's convention). ``fp8-speed`` also times our bf16 FA-3
(``ours-fa3``). ``fp8-mm`` / ``bf16-mm``: this run's GEMM ceilings (``torch._scaled_mm`` in e4m3,
``torch.matmul`` in bf16, 8192³), measured once per ``fp8-speed`` point. ``fp8-quantize-<granularity>``:
the quantisation ``fp8.attention`` runs before its kernel (``fp8.quantize_qkv``: the fused quantiser on Q, K
and V, V in the kernel's layout), timed alone; ``copy-qkv``: a device copy of the same Q, K, V bytes, the
copy bandwidth the quantiser's byte floor is taken at. ``cudnn-fp8``: cuDNN's FP8 attention forward
(``analysis.families._shared.peers``, where installed), beside ``ours-fp8-tensor`` on the same per-tensor e4m3
inputs, quantised before timing.
"""

from __future__ import annotations

from typing import ClassVar

from analysis.families._shared import attention_plan as shared
from analysis.families._shared.fa3_ablation import FA3_ABLATIONS, FA3_IMPLS

FP8_GRANULARITIES = ("none", "tensor", "head", "block")
_FP8_BASE = tuple(f"ours-fp8-{g}{rot}" for g in FP8_GRANULARITIES for rot in ("", "-rot")) + ("ours-fp8-block-p1",)
# the FA-3 kernel on e4m3 on FA-3's full schedule, then with one technique switched off (the bf16 ablation's)
FP8_ABLATION_IMPLS = tuple(f"ours-fp8-block-{a}" for a in ("fa3", *FA3_ABLATIONS))
FP8_IMPLS = (
    tuple(f"{base}{kernel}{e2e}" for base in _FP8_BASE for kernel in ("", "-triton") for e2e in ("", "-e2e"))
    + FP8_ABLATION_IMPLS
)
CEILING_IMPLS = ("fp8-mm", "bf16-mm")
# fp8.attention's quantisation step alone, per granularity, and a device copy of the same Q, K, V: the
# copy bandwidth that the quantiser's byte floor is taken at
QUANTIZER_IMPLS = tuple(f"fp8-quantize-{g}" for g in FP8_GRANULARITIES if g != "none")
COPY_IMPL = "copy-qkv"
EXPERIMENT_IMPLS = {
    "fp8-speed": FP8_IMPLS
    + ("ours-fa3",)
    + shared.DENSE_IMPLS
    + CEILING_IMPLS
    + QUANTIZER_IMPLS
    + (COPY_IMPL, shared.CUDNN_FP8),
    "fp8-accuracy": FP8_IMPLS + shared.DENSE_IMPLS,
    "fp8-ablation": ("ours-fp8-block",) + FP8_ABLATION_IMPLS + FA3_IMPLS + ("ours-fa2", "sdpa-cudnn"),
}
EXPERIMENTS = tuple(EXPERIMENT_IMPLS)
IMPLS = tuple(dict.fromkeys(impl for impls in EXPERIMENT_IMPLS.values() for impl in impls))
# The input distributions of fp8-accuracy: N(0,1); FlashAttention-3's outlier setting, N(0,1) plus N(0,100)
# on a 0.1% Bernoulli mask; large, V times 1000 (past e4m3's ±448 without scales); small, Q, K, V times
# 1/1000 (below e4m3's smallest normal, 2⁻⁶, without scales).
INPUTS = ("normal", "outliers", "large", "small")


class Fp8Spec(shared.AttentionSpec):
    """One shard of the FP8 experiments: an ``AttentionSpec`` with this family's vocabulary."""

    EXPERIMENT_IMPLS: ClassVar[dict[str, tuple[str, ...]]] = EXPERIMENT_IMPLS
    FORWARD_ONLY: ClassVar[tuple[str, ...]] = EXPERIMENTS
    INPUTS: ClassVar[tuple[str, ...]] = INPUTS
    INPUT_EXPERIMENTS: ClassVar[tuple[str, ...]] = ("fp8-accuracy",)
    HIDDEN_SHAPED: ClassVar[tuple[str, ...]] = ("fp8-speed", "fp8-ablation")
    TOKEN_SHAPED: ClassVar[tuple[str, ...]] = ()


def spec(fields: dict) -> Fp8Spec:
    return Fp8Spec(**fields)


def shards(config: dict) -> dict[str, dict]:
    """Shard name → Fp8Spec fields for every GPU benchmark job of the ``fp8`` config section."""
    f8 = config["fp8"]
    out: dict[str, dict] = {}
    for key, experiment in (("speed", "fp8-speed"), ("ablation", "fp8-ablation")):
        timed = f8[key]
        if not timed["enabled"]:
            continue
        for d in timed["head_dims"]:
            for causal in timed["causal"]:
                name = shared.shard_name(experiment, timed["dtype"], d, causal)
                fields = dict(
                    experiment=experiment,
                    dtype=timed["dtype"],
                    head_dim=d,
                    causal=causal,
                    seqlens=timed["seqlens"],
                    impls=timed["impls"],
                    tokens=timed["tokens"],
                    hidden=timed["hidden"],
                    warmup_ms=timed["warmup_ms"],
                    rep_ms=timed["rep_ms"],
                    spread_rounds=f8["spread_rounds"],
                    check_rows=timed["check_rows"],
                )
                out[name] = shared.checked(f"fp8.{key}", name, fields, Fp8Spec)
    acc = f8["accuracy"]
    if acc["enabled"]:  # nothing is timed: no warm-up, no repetitions
        for inputs in acc["inputs"]:
            for dtype in acc["dtypes"]:
                name = shared.shard_name("fp8-accuracy", dtype, acc["head_dim"], acc["causal"], extra=f"_{inputs}")
                fields = dict(
                    experiment="fp8-accuracy",
                    dtype=dtype,
                    head_dim=acc["head_dim"],
                    causal=acc["causal"],
                    seqlens=acc["seqlens"],
                    impls=acc["impls"],
                    batch=acc["batch"],
                    heads=acc["heads"],
                    inputs=inputs,
                    warmup_ms=0,
                    rep_ms=0,
                    check_rows=acc["check_rows"],
                )
                out[name] = shared.checked("fp8.accuracy", name, fields, Fp8Spec)
    return out


# the attention-like families' cost model, with the nominal rate of our FP8 kernel
NOMINAL_TFLOPS = {
    **shared.NOMINAL_TFLOPS,
    **{impl: 600 for impl in FP8_IMPLS},
    shared.CUDNN_FP8: 850,  # the 2026-12-04 H200 anchors: 767-931 TF/s at d=128, N >= 4096
    **{impl: 1e9 for impl in QUANTIZER_IMPLS + (COPY_IMPL,)},
}  # (no FLOPs: memory-bound, µs)
COMPILE_S = shared.COMPILE_S


def estimate_seconds(fields: dict) -> float:
    """Planned seconds of one shard on an H200 (an estimate: see ``analysis.families._shared.attention_plan``)."""
    return shared.seconds_of(spec(fields), NOMINAL_TFLOPS)


def compile_keys(fields: dict) -> set[tuple]:
    return shared.keys_of(spec(fields), gluon_fp8=FP8_IMPLS)
