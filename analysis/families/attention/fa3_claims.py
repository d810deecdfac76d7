"""Evaluators of the claims about FlashAttention-3 that the attention table measures: the utilisation of the
H100/H200's tensor cores, judged on its subject (``Claim.subject``): FlashAttention's own Hopper kernels
(``upstream-fa``) where they ran, our FA-3 beside them, ours where they did not; and what each of FA-3's
techniques buys (the ``fa3-ablation`` rows: our kernel with one technique switched off at a time, timed side by
side, FlashAttention's own beside it). The claims about TMA's registers and WGMMA's instruction issue are the
compiled family's (``analysis.families.compiled.claims``)."""

from __future__ import annotations

from analysis.audit import Claim, Context, Evaluators, Untestable, Verdict, evidence
from analysis.audit.subject import judged
from analysis.audit.verdicts import dense_peak, judge_range, on_each_gpu, side_by_side
from analysis.core.summaries import span
from analysis.families._shared.fa3_ablation import ABLATED

ATTENTION = "attention"  # the table these claims read
UPSTREAM = "upstream-fa"  # FlashAttention's own kernels (analysis.families._shared.peers)
EVALUATORS = Evaluators()


@EVALUATORS("fa3_util")
def fa3_util(claim, ctx):
    lo, hi = claim.asserted["range"]
    where = dict(experiment="fa2-setting", mode="fwd", dtype=["float16", "bfloat16"])

    def one(gpu):
        peak, name = dense_peak(gpu)
        sel = ctx.table(ATTENTION).select(gpu, **where)
        rows = sel.rows
        if rows.empty:
            raise Untestable("no finished forward rows")
        best = rows.loc[rows.groupby("impl")["tflops"].idxmax()].set_index("impl")["tflops"]
        frac = 100 * best / peak
        subject = judged(claim, ctx.table(ATTENTION), gpu, **where)
        judged_impl = subject.impl if subject.impl in best else best.idxmax()
        official = subject.official and judged_impl == subject.impl
        others = [f"ours ({subject.beside}) {frac[subject.beside]:.0f}%"] if official and subject.beside in frac else []
        others += [
            f"{impl} {frac[impl]:.0f}%" for impl in ("sdpa-cudnn", "ours-fa2") if impl in frac and impl != judged_impl
        ]
        gemms = ctx.table(ATTENTION).select(gpu, experiment="fp8-speed", impl="bf16-mm")
        ceiling = gemms.rows
        if len(ceiling):
            gemm = ceiling["tflops"].median()
            share = 100 * best[judged_impl] / gemm
            others.append(f"{share:.0f}% of the fp8-speed rows' bf16 GEMM ({gemm:.0f} TFLOP/s, torch.matmul 8192³)")
        fp8 = ctx.table(ATTENTION).select(gpu, experiment="fp8-speed", impl=["ours-fp8-tensor", "ours-fp8-block"])
        fp8_rows = fp8.rows
        if len(fp8_rows):
            fp8_peak, _ = dense_peak(gpu, "fp8")
            best8 = fp8_rows["tflops"].max()
            others.append(f"our FP8 kernel {best8:.0f} TFLOP/s = {100 * best8 / fp8_peak:.0f}% of the FP8 peak")
        if judged_impl == subject.impl:
            what = subject.text
        else:  # neither the subject nor ours ran: the best 16-bit forward measured stands in
            named = claim.subject
            what = (
                f"the best 16-bit forward measured ({judged_impl}): neither {named.impl} nor {named.ours} has rows here"
            )
        label = f"{judged_impl}, official" if official else judged_impl
        ours = f"; {others[0]}" if official and others else ""
        ours_tf = f"; ours {best[subject.beside]:.0f}" if official and subject.beside in best else ""
        return Verdict(
            judge_range([frac[judged_impl]], lo, hi),
            f"{frac[judged_impl]:.0f}% of peak ({label}, {best[judged_impl]:.0f} TFLOP/s); " + "; ".join(others),
            f"{what}; its best forward point in the FA-2 setting on {name} ({peak:g} TFLOP/s dense), "
            "the claim's H100 figure in its hardware-independent form (the H200 has the H100's tensor cores); "
            "beside it: " + "; ".join(others),
            evidence(sel, *(s for s in (gemms, fp8) if not s.empty), *subject.evidence),
            gpu=gpu,
            unit="% of peak",
            parts={
                "utilisation": (
                    [frac[judged_impl]],
                    f"{frac[judged_impl]:.0f}% of the {peak:g} TFLOP/s peak ({label}){ours}",
                ),
                "tflops": ([best[judged_impl]], f"{best[judged_impl]:.0f} TFLOP/s ({label}){ours_tf}"),
            },
        )

    return on_each_gpu(ctx.table(ATTENTION), one, "forward rows")


@EVALUATORS("fa3_techniques")
def fa3_techniques(claim: Claim, ctx: Context) -> list[Verdict]:
    """What each FA-3 technique buys: the full schedule against the same kernel with it switched off."""
    least = claim.asserted["at_least"]

    def one(gpu):
        subject = judged(claim, ctx.table(ATTENTION), gpu, experiment="fa3-ablation")
        sel = ctx.table(ATTENTION).select(gpu, experiment="fa3-ablation")
        rows = sel.rows
        keys = ["dtype", "head_dim", "causal", "seqlen_q", "batch", "heads"]
        full = rows[rows["impl"] == "ours-fa3"][keys + ["ms_median"]]
        if full.empty:
            raise Untestable("no finished fa3-ablation rows of the full FA-3 schedule")
        costs, d128 = {}, {}
        for impl, name in ABLATED.items():
            pair = rows[rows["impl"] == impl][keys + ["ms_median"]].merge(full, on=keys, suffixes=("", "_full"))
            if pair.empty:
                continue
            cost = 100 * (pair["ms_median"] / pair["ms_median_full"] - 1)
            costs[name] = cost
            at128 = cost[pair["head_dim"] == 128]
            if len(at128):
                d128[name] = float(at128.median())
        if not d128:
            raise Untestable("no technique's variant finished beside the full schedule at head dim 128")
        paying = [n for n, c in d128.items() if c >= least]
        verdict = "holds" if len(paying) == len(d128) else "partly" if paying else "fails"
        observed = "switched off, at d=128: " + ", ".join(f"{n} {c:+.0f}%" for n, c in d128.items())
        if len(rows[rows["impl"] == "ours-fa3"]) > 1:  # more points than d=128's: every point's range too
            spans = "; ".join(f"{n} {span(c.tolist(), '+.0f', '%')}" for n, c in costs.items())
            observed += f" (all points: {spans})"
        both = side_by_side(rows, keys, UPSTREAM, "ours-fa3", "tflops")
        official = (
            f"; beside it FlashAttention's own kernel ({UPSTREAM}): {span(both['tflops_a'], '.0f', '')} TFLOP/s "
            f"against our full schedule's {span(both['tflops_b'], '.0f', '')} at the same points"
            if len(both)
            else ""
        )
        return Verdict(
            verdict,
            observed,
            f"{subject.text}. Time of the FA-3 kernel with one technique off over the full schedule's, same run and "
            f"point; a technique pays when switching it off costs at least {least:g}% at head dim 128; "
            f"{len(paying)} of {len(d128)} do{official}",
            sel.evidence,
            gpu=gpu,
            unit="%",
        )

    return on_each_gpu(ctx.table(ATTENTION), one, "the FA-3 ablation")
