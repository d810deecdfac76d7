"""Evaluators of the claims about a FlashAttention build's speed that are judged on their subject
(``Claim.subject``, ``analysis.audit.subject``): FA-1's and FA-2's share of the tensor cores' peak, standard
attention's beside them, and the FA-2 rollback incident's latency and memory. The official build where its rows
are here (FA-2: SDPA's flash backend), with our replication beside it; ours where none runs (FA-1), and the note
says which. FA-3's utilisation is ``analysis.families.attention.fa3_claims``'s.
"""

from __future__ import annotations

from analysis.audit import Evaluators, Untestable, Verdict, evidence
from analysis.audit.subject import judged
from analysis.audit.verdicts import dense_peak, judge_range, on_each_gpu, within

ATTENTION = "attention"  # the table these claims read
A100 = "a100-sxm4-80gb"  # the GPU the articles' MFU and TFLOP/s figures are about
EVALUATORS = Evaluators()


def fraction_of_peak(ctx, claim, impl, what, experiments=("fa2-setting",), modes=("fwd",), about="an A100"):
    """``impl``'s 16-bit TFLOP/s as a share of each measured GPU's dense peak, judged against the claim's range
    (the hardware-independent form of a claim about another GPU). A claim with a subject is judged on it
    instead, ours beside an official build (``analysis.audit.subject``; ``impl`` and ``what`` are then unused)."""
    lo, hi = claim.asserted["range"]
    where = dict(experiment=list(experiments), mode=list(modes), dtype=["float16", "bfloat16"])
    text = ",".join(experiments)  # in the note

    def one(gpu):
        peak, name = dense_peak(gpu)
        table = ctx.table(ATTENTION)
        j = judged(claim, table, gpu, **where) if claim.subject else None
        pick, beside = (j.impl, j.beside) if j else (impl, "")
        sel = table.select(gpu, **where, impl=[pick, beside] if beside else pick)
        rows = sel.rows[sel.rows["impl"] == pick]
        if rows.empty:
            raise Untestable(f"no finished {pick} rows" + (f" ({j.text})" if j else ""))
        frac = 100 * rows["tflops"] / peak
        by_mode = (
            " (" + "; ".join(f"{m} ≤ {100 * g['tflops'].max() / peak:.0f}%" for m, g in rows.groupby("mode")) + ")"
            if rows["mode"].nunique() > 1
            else ""
        )
        # a TFLOP/s figure about an A100 in its hardware-independent form: the same share of the A100's peak
        a100, _ = dense_peak(A100)
        at_a100 = frac * a100 / 100
        other = 100 * sel.rows.loc[sel.rows["impl"] == beside, "tflops"] / peak
        label = f" ({j.label(pick)}, {pick})" if beside else ""
        ours = f"; ours ({beside}) {other.min():.0f}–{other.max():.0f}%" if len(other) else ""
        ours_tf = f"; ours ({beside}) {(other * a100 / 100).min():.0f}–{(other * a100 / 100).max():.0f}" if ours else ""
        judged_text = f"{j.text}. Hardware-independent form" if j else "hardware-independent form"
        measured = what if j is None else f"{pick}'s TFLOP/s"
        return Verdict(
            judge_range(frac, lo, hi),
            f"{frac.min():.0f}–{frac.max():.0f}% of peak{label}{ours}",
            f"{judged_text}: {measured} as a fraction of {name}'s dense fp16/bf16 peak "
            f"({peak:g} TFLOP/s), {len(rows)} points of {text}{by_mode}; the claim is about {about}",
            sel.evidence if j is None else evidence(sel, *j.evidence),
            gpu=gpu,
            unit="% of peak",
            parts={
                "utilisation": (frac, f"{frac.min():.0f}–{frac.max():.0f}% of {name}'s peak{label}{ours}"),
                "tflops": (
                    at_a100,
                    f"{at_a100.min():.0f}–{at_a100.max():.0f} TFLOP/s at the same share of the A100's {a100:g}"
                    f"{label}{ours_tf}",
                ),
            },
        )

    return on_each_gpu(ctx.table(ATTENTION), one, f"{claim.subject.impl if claim.subject else impl} rows")


@EVALUATORS("std_mfu")
def std_mfu(claim, ctx):
    return fraction_of_peak(ctx, claim, "naive", "naive attention's TFLOP/s")


@EVALUATORS("fa2_mfu")
def fa2_mfu(claim, ctx):
    # the official FA-2 (its subject: SDPA's flash backend), our FA-2 beside it
    return fraction_of_peak(ctx, claim, "sdpa-flash", "the official FlashAttention-2 (SDPA flash backend)")


@EVALUATORS("fa1_mfu")
def fa1_mfu(claim, ctx):
    return fraction_of_peak(
        ctx,
        claim,
        "ours-fa1",
        "our Triton port of Algorithm 1 (O, ℓ, m through HBM at every K/V block)",
        experiments=("fa2-setting", "fa1-setting"),
        modes=("fwd", "bwd", "fwd+bwd"),
        about="the original CUDA kernel on an A100",
    )


@EVALUATORS("incident_rollback")
def incident_rollback(claim, ctx):
    n = claim.conditions["N"]
    where = dict(experiment="memory", mode="fwd", seqlen_q=n)

    def one(gpu):
        table = ctx.table(ATTENTION)
        j = judged(claim, table, gpu, **where)
        sel = table.select(gpu, **where, impl=["naive", j.impl] + ([j.beside] if j.beside else []))
        rows = sel.rows
        naive = rows[rows["impl"] == "naive"]
        if naive.empty or not (rows["impl"] == j.impl).any():
            raise Untestable(f"naive or {j.impl} did not finish at N={n} in the memory experiment ({j.text})")

        def against_naive(impl):
            fa = rows[rows["impl"] == impl]
            speed = float(naive["ms_median"].iloc[0] / fa["ms_median"].iloc[0])
            return speed, 100 * (1 - float(fa["peak_mem_mib"].iloc[0] / naive["peak_mem_mib"].iloc[0]))

        speed, cut = against_naive(j.impl)
        mem_ok = cut >= claim.asserted["also"]["memory_cut_pct"]
        speed_ok = within(speed, claim.asserted["approx"], claim.tolerance)
        verdict = "holds" if mem_ok and speed_ok else "partly" if mem_ok or speed_ok else "fails"
        mem_ours = speed_ours = observed_ours = ""
        if j.beside and (rows["impl"] == j.beside).any():
            s2, c2 = against_naive(j.beside)
            mem_ours, speed_ours = f"; ours −{c2:.1f}%", f"; ours {s2:.2f}×"
            observed_ours = f"; ours ({j.beside}): memory −{c2:.1f}%, latency {s2:.2f}×"
        row = naive.iloc[0]
        return Verdict(
            verdict,
            f"memory −{cut:.1f}%; latency {speed:.2f}× ({j.impl}){observed_ours}",
            f"{j.text}. B={row['batch']}, H={row['heads']}, d={row['head_dim']}, {row['dtype']}, forward only (the "
            f"incident's batch, heads and pass are not given); {j.impl} vs naive (baddbmm+softmax+bmm)",
            evidence(sel, *j.evidence),
            gpu=gpu,
            unit="×",
            parts={
                "memory": ([cut], f"memory −{cut:.1f}% ({j.impl}{mem_ours})"),
                "latency": ([speed], f"latency {speed:.2f}× lower ({j.impl}{speed_ours})"),
            },
        )

    return on_each_gpu(ctx.table(ATTENTION), one, "the memory experiment")
