"""The one evaluator most performance targets need: a ratio between two implementations at the same points.

A family's targets (``targets`` of its ``claims.yaml``) name ``ratio`` and say in ``conditions`` which rows to
read and how to compare them:

- ``table`` (default ``attention``) and ``where``: the rows, finished and timed, by column values (a list means
  any of them, ``{at_least: x}`` / ``{at_most: x}`` a bound);
- ``ours`` and ``other``: the two implementations (``other`` a list: the best of them at each point);
- ``value``: the column compared (``tflops``, ``gbps``, ``ms_median``, ``peak_mem_mib``); ``ratio``:
  ``ours/other`` (default) or ``other/ours``; ``by``: the columns that make a point (default: dtype, causal and
  the sequence lengths);
- how the observed value reads: ``show`` ``times`` (default, ``1.20–1.35×``) or ``percent``; ``per``: a column
  whose every value gets its own figure (``4.5× at 32K, 5.0× at 64K``); ``rates``: a unit to append both
  implementations' values in (``(405–490 TFLOP/s against 525–636)``); ``suffix``: words after the figure.

The ratios are judged against the target's asserted bound by ``judge_part``: every point meets it (holds), some
(partly), none (fails). Targets whose judgement needs more than one ratio have evaluators of their own, in their
family's ``claims.py``.
"""

from __future__ import annotations

import pandas as pd

from analysis.audit.claims import Claim
from analysis.audit.context import Context
from analysis.audit.verdicts import Evaluators, Untestable, Verdict, judge_part, on_each_gpu
from analysis.core.summaries import kilo, span
from analysis.core.tables import at_least, at_most

EVALUATORS = Evaluators()
LOWER_IS_BETTER = ("ms_median", "peak_mem_mib")  # the best of several others is their smallest value
BY = ["dtype", "causal", "seqlen_q", "seqlen_k"]


def query(where: dict) -> dict:
    """A target's ``where`` as ``Results.select`` takes it: ``{at_least: x}`` and ``{at_most: x}`` as bounds."""
    out = {}
    for col, val in where.items():
        if isinstance(val, dict):
            (kind, bound), *rest = val.items()
            if rest or kind not in ("at_least", "at_most"):
                raise ValueError(f"condition {col}: a bound is {{at_least: x}} or {{at_most: x}}, got {val}")
            out[col] = at_least(bound) if kind == "at_least" else at_most(bound)
        else:
            out[col] = val
    return out


def figure(values: pd.Series, show: str) -> str:
    """A ratio as the summary writes it: ``1.20–1.35×``, or ``60–75%``."""
    return span(100 * values, ".0f", "%") if show == "percent" else span(values)


def one_value(v: float, show: str) -> str:
    return f"{100 * v:.0f}%" if show == "percent" else f"{v:.1f}×"


@EVALUATORS("ratio")
def ratio(claim: Claim, ctx: Context) -> list[Verdict]:
    c = claim.conditions
    table = ctx.table(c.get("table", "attention"))
    value, show = c["value"], c.get("show", "times")
    others = [c["other"]] if isinstance(c["other"], str) else list(c["other"])

    def one(gpu):
        sel = table.select(gpu, **query(c["where"]), impl=[c["ours"], *others])
        rows = sel.rows
        by = [k for k in c.get("by", BY) if k in rows.columns]
        wide = rows.pivot_table(index=by, columns="impl", values=value)
        present = [o for o in others if o in wide]
        if c["ours"] not in wide or not present:
            raise Untestable(f"{c['ours']} and {' or '.join(others)} finished at no common point ({sel.evidence})")
        best = wide[present].min(axis=1) if value in LOWER_IS_BETTER else wide[present].max(axis=1)
        ratios = wide[c["ours"]] / best if c.get("ratio", "ours/other") == "ours/other" else best / wide[c["ours"]]
        ratios = ratios.dropna()
        if ratios.empty:
            raise Untestable(f"{c['ours']} and {' or '.join(others)} finished at no common point ({sel.evidence})")
        if "per" in c:
            at = ratios.groupby(level=c["per"]).max()
            text = ", ".join(f"{one_value(v, show)} at {kilo(n)}" for n, v in at.items())
        else:
            text = figure(ratios, show)
        if "rates" in c:
            ours = rows[rows["impl"] == c["ours"]][value]
            other = rows[rows["impl"].isin(present)][value]
            text += f" ({span(ours, '.0f', '')} {c['rates']} against {span(other, '.0f', '')})"
        if "suffix" in c:
            text += f" {c['suffix']}"
        return Verdict(
            judge_part(claim, ratios),
            text,
            f"{c['ours']} against {' / '.join(present)} ({c.get('ratio', 'ours/other')} of {value}), "
            f"{len(ratios)} points",
            sel.evidence,
            gpu=gpu,
            unit=claim.asserted.get("unit", ""),
        )

    return on_each_gpu(table, one, claim.statement)
