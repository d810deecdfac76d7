"""Evaluators of the articles' GPU arithmetic: claims that are datasheet figures and ratios about GPUs (the
A100's bandwidth and roofline knee, the H100's peak, fp16 tensor cores against fp32) or N² growth, rather than
about any kernel family. They judge from the GPU specification table (``analysis.core.gpus``) and the models
(``analysis.core.models``) alone, read no result table, and the registry collects them beside the families'
evaluators (``analysis.registry.evaluators``).
"""

from __future__ import annotations

from analysis.audit.verdicts import Evaluators, Verdict, judge_approx, within
from analysis.core import gpus, models

EVALUATORS = Evaluators()


@EVALUATORS("a100_bw")
def a100_bw(claim, ctx):
    s = gpus.spec("a100-sxm4-80gb")
    ok = within(s.hbm_tbps, claim.asserted["approx"], claim.tolerance) and within(
        s.fp16_tflops, claim.asserted["also"]["fp16_tflops"], claim.tolerance
    )
    note = "datasheet figures confirmed; the 'effective ≈1.5 TB/s' (74% of peak) needs an A100 to measure"
    parts = {
        "peak-bandwidth": ([s.hbm_tbps], f"{s.hbm_tbps:g} TB/s (datasheet)"),
        "effective-bandwidth": ("untestable", "needs an A100 to measure"),
        "fp16-peak": ([s.fp16_tflops], f"{s.fp16_tflops:g} TFLOP/s (datasheet)"),
    }
    return [
        Verdict(
            "holds" if ok else "fails",
            f"{s.hbm_tbps:g} TB/s; {s.fp16_tflops:g} TFLOP/s",
            note,
            "analysis/core/gpu_specs.yaml: a100-sxm4-80gb",
            unit="TB/s",
            parts=parts,
        )
    ]


@EVALUATORS("incident_16x")
def incident_16x(claim, ctx):
    c = claim.conditions
    ratio = models.score_matrix_bytes(c["N_to"]) / models.score_matrix_bytes(c["N_from"])
    return [
        Verdict(
            judge_approx(ratio, claim),
            f"{ratio:g}×",
            "S and P grow as N²",
            "analysis/core/models.py: score_matrix_bytes",
            unit="×",
        )
    ]


@EVALUATORS("a100_knee")
def a100_knee(claim, ctx):
    s = gpus.spec("a100-sxm4-80gb")
    knee = gpus.ridge_point(s, "fp16")
    return [
        Verdict(
            judge_approx(knee, claim),
            f"{knee:.1f} FLOP/B",
            f"{s.fp16_tflops:g} / {s.hbm_tbps:g}",
            "analysis/core/gpu_specs.yaml: a100-sxm4-80gb",
            unit="FLOP/B",
        )
    ]


@EVALUATORS("h100_peak")
def h100_peak(claim, ctx):
    s = gpus.spec("h100-sxm5-80gb")
    return [
        Verdict(
            judge_approx(s.fp16_tflops, claim),
            f"{s.fp16_tflops:g} TFLOP/s",
            "dense, SXM5",
            "analysis/core/gpu_specs.yaml: h100-sxm5-80gb",
            unit="TFLOP/s",
        )
    ]


@EVALUATORS("fp32_16x")
def fp32_16x(claim, ctx):
    ratios = {}
    for slug in ("a100-sxm4-80gb", "h100-sxm5-80gb", "h200"):
        s = gpus.spec(slug)
        ratios[slug] = s.fp16_tflops / s.fp32_tflops
    verdicts = [judge_approx(r, claim) for r in ratios.values()]
    verdict = "holds" if all(v == "holds" for v in verdicts) else "partly" if "holds" in verdicts else "fails"
    note = (
        "dense fp16 tensor peak over plain fp32 (non-tensor) peak; TF32 tensor cores, Triton's default for fp32 "
        "dots, would give only 2×"
    )
    observed = "; ".join(f"{k} {v:.1f}×" for k, v in ratios.items())
    return [Verdict(verdict, observed, note, "analysis/core/gpu_specs.yaml", unit="×")]
