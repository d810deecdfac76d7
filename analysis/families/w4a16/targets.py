"""Evaluators of the W4A16 family's performance targets that are not a plain ratio of two implementations
(``claims.yaml``; the plain ones use ``analysis.audit.targets``)."""

from __future__ import annotations

from analysis.audit import Claim, Context, Evaluators, Untestable, Verdict, evidence
from analysis.audit.verdicts import judge_part
from analysis.core.summaries import span
from analysis.families._shared.operator_claims import OPS, measured_ops
from analysis.families.w4a16.tables import with_copy_gbps

EVALUATORS = Evaluators()
KEYS = ["model", "dtype", "group_size", "m"]


@EVALUATORS("w4_speedup")
def w4_speedup(claim: Claim, ctx: Context) -> list[Verdict]:
    """Our fused kernel's speed-up over bf16 ``F.linear`` at each M shown, judged at one."""
    c = claim.conditions

    def one(gpu):
        sel = ctx.table(OPS).select(gpu, experiment="w4a16", op="linear", impl=["ours-w4a16", "torch-linear"])
        wide = sel.rows.pivot_table(index=KEYS, columns="impl", values="ms_median")
        if not {"ours-w4a16", "torch-linear"} <= set(wide.columns):
            raise Untestable(f"our W4A16 kernel and F.linear finished at no common point ({sel.evidence})")
        speed = (wide["torch-linear"] / wide["ours-w4a16"]).dropna().rename("ratio").reset_index()
        judged = speed[speed["m"] == c["judged_m"]]["ratio"]
        if judged.empty:
            raise Untestable(f"no point at M = {c['judged_m']} ({sel.evidence})")
        text = "; ".join(
            f"M = {m}: {span(speed[speed['m'] == m]['ratio'])}" for m in c["shown_m"] if (speed["m"] == m).any()
        )
        groups = ", ".join(str(g) for g in sorted(speed["group_size"].unique()))
        return Verdict(
            judge_part(claim, judged),
            text,
            f"{speed['model'].nunique()} layers, group size {groups}; judged at M = {c['judged_m']}",
            sel.evidence,
            gpu=gpu,
            unit="×",
        )

    return measured_ops(ctx, one, claim.statement)


@EVALUATORS("w4_copy_share")
def w4_copy_share(claim: Claim, ctx: Context) -> list[Verdict]:
    """Our fused kernel's bandwidth on the packed weight at one M, and its share of the same bytes' copy."""
    m = claim.conditions["m"]

    def one(gpu):
        sel = ctx.table(OPS).select(gpu, experiment="w4a16", op="linear", m=m, impl="ours-w4a16")
        copies = ctx.table(OPS).select(gpu, experiment="w4a16", op="linear", impl="copy-weight")
        ours = sel.rows
        share = (ours["gbps"] / with_copy_gbps(ours, copies.rows)).dropna()
        if share.empty:
            raise Untestable(f"no point of ours with a measured copy of its weight ({evidence(sel, copies)})")
        return Verdict(
            judge_part(claim, share),
            f"{span(ours['gbps'] / 1e3, '.1f', ' TB/s')}; {span(100 * share, '.0f', '%')}",
            f"{len(share)} layers at M = {m}",
            evidence(sel, copies),
            gpu=gpu,
        )

    return measured_ops(ctx, one, claim.statement)
