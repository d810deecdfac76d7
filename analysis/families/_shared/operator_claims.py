"""What the operator-like families' evaluators (W4A16, MoE) share: the table they read (``ops.csv``), a verdict
per GPU that has one (``measured_ops``), and the summary lines that judge candidate implementations by the
family's targets (``candidate_lines``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pandas as pd

from analysis.audit import Claim, Context, Results, Untestable, Verdict, judge
from analysis.audit.verdicts import per_gpu
from analysis.core.summaries import Line

OPS = "ops"  # the table these claims read
WOULD_MEET = {"holds": "yes", "partly": "partly", "fails": "no"}


def measured_ops(ctx: Context, fn: Callable[[str], Verdict], needs: str) -> list[Verdict]:
    """One verdict per GPU with an ops table; untestable (with the reason) when there is none."""
    if not ctx.table(OPS).frames:
        raise Untestable(
            f"no W4A16/MoE results on any GPU ({needs}): the operator experiments run on a GPU node "
            "(the w4a16 and moe families' benchmark jobs) or come with shipped reference results "
            "(reports/reference/<gpu>/ops.csv)"
        )
    return per_gpu(ctx.table(OPS), fn)


def candidate_lines(
    tables: dict[str, pd.DataFrame],
    targets: dict[str, Claim],
    candidates: dict[str, tuple[str, ...]],
    evaluators: dict[str, Callable],
) -> list[Line]:
    """Each target that holds an implementation with candidates (``conditions.ours`` a key of ``candidates``)
    judged again with every candidate that has rows in place of it: which candidate path would meet which
    target. One line each, the target's words in it but no target of its own, so that the README's table stays
    the project's targets on the implementations users get; nothing for a candidate no row measured."""
    ops = tables.get(OPS)
    if ops is None or not len(ops):
        return []
    present = set(ops["impl"].dropna())
    ctx = Context({OPS: Results({"gpu": ops}, {"gpu": f"{OPS}.csv"})})
    out = []
    for target in targets.values():
        for name in candidates.get(target.conditions.get("ours"), ()):
            if name not in present:
                continue
            claim = dataclasses.replace(
                target, id=f"{target.id}-{name}", conditions={**target.conditions, "ours": name}
            )
            for v in judge(claim, ctx, evaluators):
                if v.verdict in WOULD_MEET:
                    what = f"candidate {name}: {target.statement} (target {target.wording})"
                    out.append(Line(what, f"{v.observed}; would meet it: {WOULD_MEET[v.verdict]}"))
    return out
