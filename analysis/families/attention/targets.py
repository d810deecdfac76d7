"""Evaluators of the attention family's performance targets that are not a plain ratio of two implementations
(``claims.yaml``; the plain ones use ``analysis.audit.targets``)."""

from __future__ import annotations

from analysis.audit import Claim, Context, Evaluators, Untestable, Verdict
from analysis.audit.targets import query
from analysis.audit.verdicts import judge_part, on_each_gpu
from analysis.core.summaries import span

ATTENTION = "attention"
EVALUATORS = Evaluators()


@EVALUATORS("memory_vs_sdpa")
def memory_vs_sdpa(claim: Claim, ctx: Context) -> list[Verdict]:
    """Our extra peak memory of a training step against the smaller of SDPA's backends, same point."""
    c = claim.conditions

    def one(gpu):
        sel = ctx.table(ATTENTION).select(gpu, **c["where"], impl=[c["ours"], *c["sdpa"]])
        peak = sel.rows.groupby("impl")["peak_mem_mib"].max()
        sdpa = [peak[i] for i in c["sdpa"] if i in peak]
        if c["ours"] not in peak or not sdpa:
            raise Untestable(f"{c['ours']} and SDPA finished at no common point ({sel.evidence})")
        ratio = peak[c["ours"]] / min(sdpa)
        names = {"sdpa-flash": "SDPA flash", "sdpa-cudnn": "cuDNN"}
        others = ", ".join(f"{names.get(i, i)} {peak.get(i, float('nan')):.0f}" for i in c["sdpa"])
        return Verdict(
            judge_part(claim, [ratio]),
            f"{peak[c['ours']]:.0f} MiB ({others})",
            f"{ratio:.2f}× the smaller of SDPA's backends",
            sel.evidence,
            gpu=gpu,
            unit="×",
        )

    return on_each_gpu(ctx.table(ATTENTION), one, claim.statement)


@EVALUATORS("host_cost")
def host_cost(claim: Claim, ctx: Context) -> list[Verdict]:
    """The host's cost of one eager call of an implementation (``host_ms``: from a synchronised GPU to the call's
    return, launches queued) at every point of the selection, against the target's bound."""
    c = claim.conditions

    def one(gpu):
        sel = ctx.table(ATTENTION).select(gpu, **query(c["where"]), impl=c["ours"])
        host = sel.rows["host_ms"].dropna() if "host_ms" in sel.rows else sel.rows.iloc[0:0]
        if len(host) == 0:
            raise Untestable(f"{c['ours']} has no timed row with a host cost ({sel.evidence})")
        return Verdict(
            judge_part(claim, host),
            span(host, ".3f", " ms"),
            f"host_ms of {c['ours']} at {len(host)} points: one eager call, its checks, allocations and launches",
            sel.evidence,
            gpu=gpu,
            unit="ms",
        )

    return on_each_gpu(ctx.table(ATTENTION), one, claim.statement)
