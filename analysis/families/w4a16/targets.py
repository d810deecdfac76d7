"""Evaluators of the W4A16 family's performance targets that are not a plain ratio of two implementations
(``claims.yaml``; the plain ones use ``analysis.audit.targets``). Each reads the implementation it holds to
from ``conditions.ours`` (so that a candidate path can be judged by the same rule: ``summary.py``)."""

from __future__ import annotations

from analysis.audit import Claim, Context, Evaluators, Untestable, Verdict, evidence
from analysis.audit.verdicts import judge_part
from analysis.core.summaries import span
from analysis.families._shared.operator_claims import OPS, measured_ops
from analysis.families.w4a16.tables import with_copy_gbps

EVALUATORS = Evaluators()


def _where(claim: Claim) -> dict:
    """The rows a target reads: the w4a16 linear rows of its M (and model, where it names one)."""
    c = claim.conditions
    return dict(experiment="w4a16", op="linear", m=c["m"], **({"model": c["model"]} if "model" in c else {}))


@EVALUATORS("w4_copy_share")
def w4_copy_share(claim: Claim, ctx: Context) -> list[Verdict]:
    """Our kernel's bandwidth on the packed weight at one M (on one layer where ``model`` is given), and its
    share of the same bytes' copy bandwidth (``copy-weight``, the same layer, dtype and group size)."""
    ours = claim.conditions.get("ours", "ours-w4a16")

    def one(gpu):
        sel = ctx.table(OPS).select(gpu, **_where(claim), impl=ours)
        copies = ctx.table(OPS).select(gpu, experiment="w4a16", op="linear", impl="copy-weight")
        rows = sel.rows
        share = (rows["gbps"] / with_copy_gbps(rows, copies.rows)).dropna()
        if share.empty:
            raise Untestable(f"no point of {ours} with a measured copy of its weight ({evidence(sel, copies)})")
        return Verdict(
            judge_part(claim, share),
            f"{span(rows['gbps'] / 1e3, '.1f', ' TB/s')}; {span(100 * share, '.0f', '%')}",
            f"{ours}, {len(share)} layer(s) at M = {claim.conditions['m']}",
            evidence(sel, copies),
            gpu=gpu,
        )

    return measured_ops(ctx, one, claim.statement)


@EVALUATORS("w4_host_share")
def w4_host_share(claim: Claim, ctx: Context) -> list[Verdict]:
    """What one eager call costs the host (``host_ms``) against its GPU time (``ms_median``), per point: the
    host's side of an eager call must not be the longer one."""
    ours = claim.conditions.get("ours", "ours-w4a16")

    def one(gpu):
        sel = ctx.table(OPS).select(gpu, **_where(claim), impl=ours)
        rows = sel.rows.dropna(subset=["host_ms", "ms_median"])
        if rows.empty:
            raise Untestable(f"no point of {ours} with its host time measured ({sel.evidence})")
        ratio = rows["host_ms"] / rows["ms_median"]
        return Verdict(
            judge_part(claim, ratio),
            f"{span(ratio)} the GPU time (host {span(1e3 * rows['host_ms'], '.0f', ' µs')}, GPU "
            f"{span(1e3 * rows['ms_median'], '.0f', ' µs')})",
            f"{ours}, {len(rows)} layers at M = {claim.conditions['m']}: host_ms (one eager call, from an idle GPU "
            "to its return) over ms_median (GPU time)",
            sel.evidence,
            gpu=gpu,
            unit="×",
        )

    return measured_ops(ctx, one, claim.statement)
