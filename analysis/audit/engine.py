"""The claims audit: every claim gets a verdict with its evidence, judged by its evaluator.

An evaluator (a function of a family's ``claims.py``, or of ``analysis.audit.arithmetic`` for the articles' GPU
datasheet arithmetic; named by the claim) recomputes the claim from the analytic models
(``analysis.core.models``), the GPU specification table (``analysis.core.gpus``) or the pipeline's measured
tables (``analysis.audit.context``), and returns one ``Verdict`` per GPU it could judge (analytic claims: one,
with ``gpu = "-"``). Nothing observed is ever typed in: every observed number is computed from a model or read
from a result file named in the verdict's ``evidence``. ``audit`` judges every claim, and each measured verdict
again across the band of its timings (``analysis.audit.band``: borderline verdicts); ``summary`` counts them.

To wire a new experiment's claims: write an evaluator in the family's ``claims.py`` (``@EVALUATORS("name")``)
that reads the family's table from the context, and set ``evaluator: name`` in the claim (replacing
``not_built``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pandas as pd

from analysis.audit.band import Band
from analysis.audit.claims import Claim
from analysis.audit.context import ANALYTIC, Context
from analysis.audit.verdicts import VERDICTS, Untestable, Verdict, judge_part

COLUMNS = [
    "claim_id",
    "source",
    "kind",
    "statement",
    "asserted",
    "observed",
    "unit",
    "tolerance",
    "verdict",
    "gpu",
    "evidence",
    "note",
    "figure",
    "band",
    "borderline",
]


def not_built(claim: Claim, ctx: Context) -> list[Verdict]:
    raise Untestable(f"experiment not built: needs {claim.needs}")


def judge(claim: Claim, ctx: Context, evaluators: dict[str, Callable]) -> list[Verdict]:
    """The claim's verdicts from its evaluator (``not_built``: untestable with what it needs); a part of a
    compound claim: the whole's evaluator, each verdict narrowed to the part (``part_of``)."""
    fn = not_built if claim.evaluator == "not_built" else evaluators[claim.evaluator]
    try:
        verdicts = fn(claim.whole or claim, ctx)
    except Untestable as exc:
        return [Verdict("untestable", "", str(exc), claim.evaluator)]
    return [part_of(claim, v) for v in verdicts] if claim.part else verdicts


def part_of(claim: Claim, v: Verdict) -> Verdict:
    """The verdict of one part, taken from the whole's verdict (an untestable whole: every part is)."""
    if v.verdict == "untestable":
        return dataclasses.replace(v, parts={})
    if claim.part not in v.parts:
        raise ValueError(
            f"evaluator {claim.evaluator!r} gives no verdict for part {claim.part!r} of claim {claim.whole.id!r}"
        )
    values, observed = v.parts[claim.part]
    verdict = values if isinstance(values, str) else judge_part(claim, values)
    return dataclasses.replace(v, verdict=verdict, observed=observed, unit=claim.asserted.get("unit", v.unit), parts={})


def audit(claims: list[Claim], ctx: Context, evaluators: dict[str, Callable], band: bool = True) -> pd.DataFrame:
    """Evaluate every claim with its evaluator of ``evaluators``; one row per claim and GPU judged (analytic
    claims: gpu '-'). With ``band``, each measured verdict that reads the timings is also judged across its
    rows' band (p20–p80, widened to their repeat rounds' medians: ``analysis.audit.band``): ``band`` lists the
    verdicts reached, ``borderline`` says whether there is more than one."""
    rows = []
    moved = Band(ctx, lambda c, x: judge(c, x, evaluators)) if band else None
    for claim in claims:
        verdicts = judge(claim, ctx, evaluators)
        bands = moved.reached(claim, verdicts) if moved else [set() for _ in verdicts]
        for v, reached in zip(verdicts, bands, strict=True):
            rows.append(
                {
                    "claim_id": claim.id,
                    "source": claim.source,
                    "kind": ", ".join(claim.kind),
                    "statement": claim.statement,
                    "asserted": claim.asserted_text(),
                    "observed": v.observed,
                    "unit": v.unit or claim.asserted.get("unit", ""),
                    "tolerance": _tolerance_text(claim),
                    "verdict": v.verdict,
                    "gpu": v.gpu,
                    "evidence": v.evidence,
                    "note": v.note,
                    # the figure shows this GPU's measurement; analytic rows have none to point at
                    "figure": claim.figure if v.gpu != ANALYTIC else "",
                    "band": ", ".join(x for x in VERDICTS if x in reached),
                    "borderline": len(reached) > 1,
                }
            )
    return pd.DataFrame(rows, columns=COLUMNS)


def _tolerance_text(claim: Claim) -> str:
    a = claim.asserted
    if "range" in a:
        return "inside the range" + (f" ±{100 * claim.tolerance:g}%" if claim.tolerance else "")
    if "approx" in a:
        return f"within {100 * claim.tolerance:g}%" if claim.tolerance else "exact"
    if "at_least" in a or "at_most" in a:
        return "bound" + (f" with {100 * claim.tolerance:g}% slack" if claim.tolerance else "")
    return "qualitative"


def summary(verdicts: pd.DataFrame) -> dict[str, int]:
    """Count of claims per verdict (a claim judged on several GPUs counts once per GPU), then how many of
    them are borderline (their verdict changes inside the band of the timings they use)."""
    counts = verdicts["verdict"].value_counts()
    out = {v: int(counts.get(v, 0)) for v in VERDICTS}
    out["borderline"] = int(verdicts["borderline"].sum()) if "borderline" in verdicts else 0
    return out
