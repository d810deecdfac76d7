"""What the operator-like families' evaluators (W4A16, MoE) share: the table they read (``ops.csv``), and a
verdict per GPU that has one (``measured_ops``)."""

from __future__ import annotations

from collections.abc import Callable

from analysis.audit import Context, Untestable, Verdict
from analysis.audit.verdicts import per_gpu

OPS = "ops"  # the table these claims read


def measured_ops(ctx: Context, fn: Callable[[str], Verdict], needs: str) -> list[Verdict]:
    """One verdict per GPU with an ops table; untestable (with the reason) when there is none."""
    if not ctx.table(OPS).frames:
        raise Untestable(
            f"no W4A16/MoE results on any GPU ({needs}): the operator experiments run on a GPU node "
            "(the w4a16 and moe families' benchmark jobs) or come with shipped reference results "
            "(reports/reference/<gpu>/ops.csv)"
        )
    return per_gpu(ctx.table(OPS), fn)
