"""Evaluators of the claims about FP8 attention: the FP8 GEMM's doubling, P's underflow and its scale, and what
the quantisation scales buy, from the datasheet and the FP8 rows of the attention table. The doubling's claim is
about FA-3's FP8 kernel, of which no build runs here: its subject is ours (``analysis.audit.subject``), and
cuDNN's FP8 attention (``cudnn-fp8``, where installed) is shown beside it as a peer, not judged."""

from __future__ import annotations

import math

from analysis.audit import Context, Evaluators, Selection, Untestable, Verdict
from analysis.audit.subject import judged
from analysis.audit.verdicts import dense_peak, judge_approx, on_each_gpu, side_by_side, within
from analysis.core import gpus
from analysis.core.summaries import span
from analysis.core.tables import at_least

ATTENTION = "attention"  # the table these claims read (the FP8 rows are in the attention table)
CUDNN_FP8 = "cudnn-fp8"  # cuDNN's FP8 attention, a peer (analysis.families._shared.peers)
EVALUATORS = Evaluators()


@EVALUATORS("fp8_2pf")
def fp8_2pf(claim, ctx):
    s = gpus.spec("h100-sxm5-80gb")
    ratio = s.fp8_tflops / s.fp16_tflops
    out = [
        Verdict(
            judge_approx(s.fp8_tflops, claim),
            f"{s.fp8_tflops:g} TFLOP/s",
            f"dense fp8 is {ratio:.2f}× dense fp16 on the datasheet",
            "analysis/core/gpu_specs.yaml: h100-sxm5-80gb",
            unit="TFLOP/s",
        )
    ]

    def one(gpu):
        sel = ctx.table(ATTENTION).select(gpu, experiment="fp8-speed")
        rows = sel.rows
        ceil = rows.groupby("impl")["tflops"].median()
        if "fp8-mm" not in ceil or "bf16-mm" not in ceil:
            raise Untestable("no finished fp8-mm and bf16-mm ceiling rows (experiment fp8-speed)")
        gemm = ceil["fp8-mm"] / ceil["bf16-mm"]
        keys = ["dtype", "head_dim", "causal", "batch", "heads", "seqlen_q", "seqlen_k"]
        long = rows[rows["seqlen_q"] >= 4096]
        bf16 = "ours-fa3" if "ours-fa3" in set(long["impl"]) else "ours-fa2"
        subject = judged(claim, ctx.table(ATTENTION), gpu, experiment="fp8-speed")
        att_text = ""
        for impl, what in (
            (subject.impl, "inputs quantised"),
            ("ours-fp8-block-e2e", "end to end"),
            (CUDNN_FP8, "cuDNN's, a peer: inputs quantised per tensor"),
        ):
            att = side_by_side(long, keys, bf16, impl)
            if len(att):
                sp = span(att["ms_median_a"] / att["ms_median_b"], ".2f")
                whose = "cuDNN's FP8 attention forward" if impl == CUDNN_FP8 else "our FP8 attention forward"
                att_text += f"; {whose} ({what}) {sp} our bf16 {bf16} at N ≥ 4096"
        peak, name = dense_peak(gpu, "fp8")
        verdict = "holds" if within(gemm, ratio, claim.tolerance) else "partly" if gemm > 1 else "fails"
        return Verdict(
            verdict,
            f"FP8 GEMM {ceil['fp8-mm']:.0f} TFLOP/s = {gemm:.2f}× bf16 GEMM ({ceil['bf16-mm']:.0f})",
            f"The claim's kernel is FA-3's FP8 one, {subject.impl} here ({claim.subject.why}); the doubling is "
            f"judged on this run's GEMMs. Measured on {name}: torch._scaled_mm against torch.matmul, both 8192³ "
            f"(medians over the shard's points); {100 * ceil['fp8-mm'] / peak:.0f}% of the {peak:g} TFLOP/s dense FP8 "
            f"peak{att_text}. "
            "The theoretical doubling is the datasheet row; holds here needs the achieved GEMM ratio within "
            f"{100 * claim.tolerance:g}% of the datasheet's {ratio:g}×, partly is faster but short of it",
            sel.evidence,
            gpu=gpu,
            unit="×",
        )

    return out + on_each_gpu(ctx.table(ATTENTION), one, "the FP8 speed experiment", optional=True)


def _accuracy_rows(ctx: Context, gpu: str, **where) -> Selection:
    """The FP8 accuracy experiment's rows that finished (they are not timed)."""
    sel = ctx.table(ATTENTION).select(gpu, finished=False, experiment="fp8-accuracy", status="ok", **where)
    if sel.empty:
        raise Untestable("no finished rows of the FP8 accuracy experiment")
    return sel


@EVALUATORS("fp8_accuracy")
def fp8_accuracy(claim, ctx):
    import torch

    # every E4M3 bit pattern, decoded: the smallest positive value is the smallest subnormal
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    subnormal = float(values[values > 0].min())
    out = [
        Verdict(
            "holds" if subnormal == claim.asserted["approx"] else "fails",
            f"{subnormal:g} = 2^{math.log2(subnormal):.0f}",
            "E4M3's smallest subnormal (all 256 codes decoded by torch): P entries below half of it round to 0",
            "torch.float8_e4m3fn, every bit pattern decoded",
        )
    ]

    def one(gpu):
        every = _accuracy_rows(ctx, gpu)
        n = every.rows["seqlen_q"].max()
        # FlashAttention-3's outlier inputs where measured (their sharp rows put the most of P near zero)
        kind = "outliers" if (every.rows["inputs"] == "outliers").any() else "normal"
        sel = every.narrow(seqlen_q=n, inputs=kind)
        at = sel.rows.groupby("impl")[["rms_err", "p_underflow", "p_mass_lost"]].mean()
        if not {"ours-fp8-block", "ours-fp8-block-p1", "ours-fa2"} <= set(at.index):
            raise Untestable(f"ours-fp8-block, ours-fp8-block-p1 and ours-fa2 rows are all needed (inputs={kind})")
        scaled, unscaled, fa2 = at.loc["ours-fp8-block"], at.loc["ours-fp8-block-p1"], at.loc["ours-fa2"]
        cost = unscaled["rms_err"] / scaled["rms_err"]
        underflows = unscaled["p_underflow"] > 0
        if underflows and scaled["p_underflow"] < unscaled["p_underflow"] and cost > 1.05:
            verdict = "holds"
        elif underflows:
            verdict = "partly"
        else:
            verdict = "fails"
        what = "FlashAttention-3's outlier inputs" if kind == "outliers" else "N(0,1) inputs"
        return Verdict(
            verdict,
            f"P flushed: {100 * unscaled['p_underflow']:.1f}% of entries ({100 * unscaled['p_mass_lost']:.2g}% of the "
            f"mass) unscaled, {100 * scaled['p_underflow']:.2g}% with P×256; RMS error {unscaled['rms_err']:.2e} vs "
            f"{scaled['rms_err']:.2e} ({cost:.2f}×)",
            f"{what}, N={int(n)}, per-block scales for Q, K, V in both; P cast to e4m3 without (-p1) and with "
            f"its scale of 256. For scale: bf16/fp16 FA-2's RMS error {fa2['rms_err']:.1e}. Holds needs the "
            "underflow to occur, the scale to reduce it and the error to drop by more than 5%; partly: P "
            "underflows, but the flushed entries carry too little of the row sums to change the error",
            sel.evidence,
            gpu=gpu,
        )

    return out + on_each_gpu(ctx.table(ATTENTION), one, "the FP8 accuracy experiment", optional=True)


@EVALUATORS("fp8_scales")
def fp8_scales(claim, ctx):
    def one(gpu):
        every = _accuracy_rows(ctx, gpu, impl=["ours-fp8-none", "ours-fp8-tensor"])
        sel = every.narrow(seqlen_q=every.rows["seqlen_q"].max())
        n = sel.where["seqlen_q"]
        at = sel.rows.groupby(["inputs", "impl"])["rms_err"].mean()
        ratios = {}
        for kind in ("normal", "outliers", "large", "small"):
            if (kind, "ours-fp8-none") in at and (kind, "ours-fp8-tensor") in at:
                ratios[kind] = at[(kind, "ours-fp8-none")] / at[(kind, "ours-fp8-tensor")]
        wide = [ratios[k] for k in ("large", "small") if k in ratios]
        if not wide:
            raise Untestable("no ours-fp8-none / ours-fp8-tensor rows on the large or small inputs")
        verdict = "holds" if max(wide) >= 2 else "fails"
        if verdict == "holds" and max(ratios.get("normal", 1.0), ratios.get("outliers", 1.0)) < 2:
            verdict = "partly"
        text = ", ".join(f"{k} {v:.3g}×" for k, v in ratios.items())
        return Verdict(
            verdict,
            f"unscaled/per-tensor RMS error: {text}",
            f"N={int(n)}: FP8 attention with Q, K, V cast to e4m3 unscaled (saturating at ±448) against one scale "
            "per tensor, on N(0,1), FlashAttention-3's outliers, V × 1000 (large) and Q, K, V × 1/1000 (small). "
            "Holds: scales matter on every distribution (≥ 2×); partly: only once values leave e4m3's range "
            "(large or small), while unit-scale inputs do as well without them; fails: scales never matter",
            sel.evidence,
            gpu=gpu,
            unit="×",
        )

    return on_each_gpu(ctx.table(ATTENTION), one, "the FP8 accuracy experiment")


@EVALUATORS("fp8_kernel_target")
def fp8_kernel_target(claim, ctx):
    """The FP8 FA-3 kernel on quantised inputs, at every long unmasked point: its TFLOP/s and its ratio to our bf16
    FA-3 at the same point, both against their targets (a point meets the target when it meets both)."""
    c = claim.conditions

    def one(gpu):
        sel = ctx.table(ATTENTION).select(
            gpu,
            experiment="fp8-speed",
            head_dim=c["head_dim"],
            causal=False,
            seqlen_q=at_least(c["seqlen_from"]),
            impl=[c["ours"], c["bf16"]],
        )
        tf = sel.rows.pivot_table(index=["causal", "seqlen_q"], columns="impl", values="tflops")
        if not {c["ours"], c["bf16"]} <= set(tf.columns):
            raise Untestable(f"{c['ours']} and {c['bf16']} finished at no common point ({sel.evidence})")
        at = tf[[c["ours"], c["bf16"]]].dropna()
        rate, ratio = at[c["ours"]], at[c["ours"]] / at[c["bf16"]]
        if ratio.empty:
            raise Untestable(f"{c['ours']} and {c['bf16']} finished at no common point ({sel.evidence})")
        meets = (rate >= c["tflops"]) & (ratio >= c["ratio"])
        return Verdict(
            "holds" if meets.all() else "partly" if meets.any() else "fails",
            f"{span(rate, '.0f', '')} TFLOP/s; {span(ratio)}",
            f"{int(meets.sum())} of {len(meets)} points reach both {c['tflops']:g} TFLOP/s and {c['ratio']:g}× "
            f"{c['bf16']}",
            sel.evidence,
            gpu=gpu,
        )

    return on_each_gpu(ctx.table(ATTENTION), one, claim.statement)
