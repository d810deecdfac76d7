"""Verdicts and the helpers every evaluator judges with.

Verdicts: ``holds`` (within the claim's tolerance), ``fails``, ``partly`` (some of what it asserts holds, or
it holds at some points of its range and not others), ``inconsistent`` (the articles contradict themselves;
the note names both statements), ``untestable`` (always with the reason: the experiment is not built yet,
or it needs hardware or software we do not have). An evaluator that cannot judge raises ``Untestable``.

A claim about an A100 or H100 that the GPU at hand cannot check directly is evaluated in its
hardware-independent form (a fraction of that GPU's own peak, a ratio between implementations measured side
by side, ``peak``) and the note says so. ``measured`` and ``per_gpu`` run a per-GPU evaluation over a
table's GPUs; ``side_by_side`` puts two implementations' rows side by side (a range is written with
``analysis.core.summaries.span``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from analysis.audit.claims import Claim
from analysis.audit.context import ANALYTIC, Results
from analysis.core import gpus

VERDICTS = ("holds", "fails", "partly", "inconsistent", "untestable")


@dataclasses.dataclass
class Verdict:
    verdict: str
    observed: str
    note: str
    evidence: str
    gpu: str = ANALYTIC
    unit: str = ""
    # each part of a compound claim, by part name: (the observed values, or a verdict for a qualitative
    # part; the observation in words). Values are judged against the part's own asserted value
    # (``judge_part``); ``verdict`` and ``observed`` above sum the whole up.
    parts: dict[str, tuple] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")
        if self.verdict == "untestable" and not self.note:
            raise ValueError("an untestable verdict must say why")


class Untestable(Exception):
    """Raised by an evaluator that cannot judge its claim; the message is the reason."""


def within(observed: float, target: float, tol: float) -> bool:
    """|observed − target| ≤ tol·|target| (tol = 0: equal up to float rounding)."""
    return abs(observed - target) <= max(tol * abs(target), 1e-9 * abs(target))


def judge_approx(observed: float, claim: Claim, target: float | None = None) -> str:
    target = claim.asserted["approx"] if target is None else target
    return "holds" if within(observed, target, claim.tolerance) else "fails"


def judge_range(values, lo: float, hi: float, tol: float = 0.0) -> str:
    """All values inside [lo, hi] (widened by tol): holds; some: partly; none: fails."""
    values = [v for v in values if v == v]
    if not values:
        raise Untestable("no finished measurement to compare")
    inside = [lo * (1 - tol) <= v <= hi * (1 + tol) for v in values]
    return "holds" if all(inside) else "partly" if any(inside) else "fails"


def judge_at_most(observed: float, limit: float, tol: float = 0.0) -> str:
    return "holds" if observed <= limit * (1 + tol) else "fails"


def judge_at_least(observed: float, limit: float, tol: float = 0.0) -> str:
    return "holds" if observed >= limit * (1 - tol) else "fails"


def combine(verdicts) -> str:
    """The whole's verdict from its parts': all alike → that; some holding (fully or partly) → partly."""
    verdicts = list(verdicts)
    if len(set(verdicts)) == 1:
        return verdicts[0]
    return "partly" if {"holds", "partly"} & set(verdicts) else "fails"


def judge_part(claim: Claim, values) -> str:
    """Observed values against a part's asserted value, widened by its tolerance: all agree → holds, some
    → partly, none → fails. A qualitative part (``text``) needs its verdict from the evaluator."""
    x = np.atleast_1d(np.asarray(values, dtype=float))
    x = x[np.isfinite(x)]
    if x.size == 0:
        raise ValueError(f"claim {claim.id!r}: no finite observed value to judge")
    a, tol = claim.asserted, claim.tolerance
    if "range" in a:
        return judge_range(x, *a["range"], tol)
    if "approx" in a:
        ok = np.array([within(v, a["approx"], tol) for v in x])
    elif "at_least" in a:
        ok = x >= a["at_least"] * (1 - tol)
    elif "at_most" in a:
        ok = x <= a["at_most"] * (1 + tol)
    else:
        raise ValueError(f"claim {claim.id!r} is qualitative: its evaluator must give the part's verdict")
    return "holds" if ok.all() else "partly" if ok.any() else "fails"


def three_digits(x: float) -> str:
    """Three significant digits, plain."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    return f"{x:.3g}" if 1e-3 <= abs(x) < 1e6 else f"{x:.3e}"


def loglog_slope(x, y) -> float:
    lx, ly = [math.log(v) for v in x], [math.log(v) for v in y]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum((a - mx) ** 2 for a in lx)


def side_by_side(
    rows: pd.DataFrame, keys: list[str], a: str, b: str, value: str | list[str] = "ms_median"
) -> pd.DataFrame:
    """Rows of impl ``a`` and impl ``b`` side by side on ``keys`` (columns ``<value>_a``, ``<value>_b`` for
    the column, or each of the columns, named by ``value``)."""
    cols = [*keys, *([value] if isinstance(value, str) else value)]
    left = rows[rows["impl"] == a][cols]
    right = rows[rows["impl"] == b][cols]
    return left.merge(right, on=keys, suffixes=("_a", "_b"))


class Evaluators(dict):
    """Name → evaluator ``fn(claim, ctx) -> list[Verdict]``; ``@EVALUATORS("name")`` adds one (a family's
    ``claims.py`` makes one of these and the registry collects them)."""

    def __call__(self, name: str):
        def register(fn):
            if name in self:
                raise ValueError(f"evaluator {name!r} is defined twice")
            self[name] = fn
            return fn

        return register


def per_gpu(results: Results, fn: Callable[[str], Verdict]) -> list[Verdict]:
    """``fn(gpu)`` for every GPU of ``results``, in name order; an ``Untestable`` it raises becomes that GPU's
    untestable verdict, with the reason and the GPU's file as the evidence."""
    out = []
    for gpu in sorted(results.frames):
        try:
            out.append(fn(gpu))
        except Untestable as exc:
            out.append(Verdict("untestable", "", str(exc), results.paths[gpu], gpu=gpu))
    return out


def on_each_gpu(
    results: Results, fn: Callable[[str], Verdict], needs: str, optional: bool = False, missing: str | None = None
) -> list[Verdict]:
    """Run a per-GPU evaluation for every GPU with results. With none: untestable (the reason ``missing``, or
    that no GPU has results for ``needs``), or, for claims that also have an analytic part (``optional``),
    no rows, so that the analytic verdict stands alone."""
    if not results.frames:
        if optional:
            return []
        raise Untestable(missing or f"no measured results on any GPU ({needs})")
    return per_gpu(results, fn)


def dense_peak(gpu: str, dtype: str = "fp16") -> tuple[float, str]:
    """Dense peak TFLOP/s of a measured GPU type from the specification table, and its name."""
    try:
        s = gpus.spec(gpu)
    except KeyError as exc:
        raise Untestable(f"GPU type {gpu!r} is not in the specification table (analysis/core/gpu_specs.yaml)") from exc
    return gpus.peak_tflops(s, dtype), s.name
