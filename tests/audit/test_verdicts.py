"""The judging helpers: approximate values, ranges and bounds with their tolerances, and what a verdict must say."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis.audit import Claim, Untestable, verdicts


def _claim(asserted: dict, tolerance: float) -> Claim:
    return Claim(
        id="t",
        source="S1 (b.txt) §1",
        statement="s",
        asserted=asserted,
        wording="w",
        tolerance=tolerance,
        conditions={},
        kind=("analytic",),
        evaluator="std_flops",
    )


@pytest.mark.parametrize(
    "observed, expected",
    [
        pytest.param(16.0, "holds", id="on-target"),
        # tolerance 0.25 of 16 = 4 (exact in binary): the edges 12 and 20 are inside
        pytest.param(20.0, "holds", id="upper-edge"),
        pytest.param(12.0, "holds", id="lower-edge"),
        pytest.param(20.01, "fails", id="just-above"),
        pytest.param(11.99, "fails", id="just-below"),
    ],
)
def test_judge_approx_tolerance_edges(observed, expected):
    assert verdicts.judge_approx(observed, _claim({"approx": 16}, 0.25)) == expected


@pytest.mark.parametrize(
    "observed, expected",
    [
        pytest.param(16.0, "holds", id="exact"),
        pytest.param(16.001, "fails", id="off-by-a-little"),
    ],
)
def test_judge_approx_zero_tolerance_is_exact(observed, expected):
    assert verdicts.judge_approx(observed, _claim({"approx": 16}, 0.0)) == expected


def test_judge_approx_explicit_target_overrides_asserted():
    claim = _claim({"approx": 16}, 0.25)
    assert verdicts.judge_approx(100.0, claim, target=100.0) == "holds"
    assert verdicts.judge_approx(16.0, claim, target=100.0) == "fails"


@pytest.mark.parametrize(
    "values, expected",
    [
        pytest.param([4.0, 5.0, 7.5], "holds", id="all-inside"),
        pytest.param([3.0, 8.0], "holds", id="exactly-lo-and-hi"),
        pytest.param([2.0, 5.0], "partly", id="some-below"),
        pytest.param([5.0, 8.5], "partly", id="some-above"),
        pytest.param([1.0, 9.0], "fails", id="none-inside"),
        pytest.param([2.999, 8.001], "fails", id="just-outside-both"),
        pytest.param([math.nan, 5.0], "holds", id="nan-ignored-inside"),
        pytest.param([math.nan, 9.0], "fails", id="nan-ignored-outside"),
        pytest.param(pd.Series([3.0, 9.0]), "partly", id="series"),
    ],
)
def test_judge_range(values, expected):
    assert verdicts.judge_range(values, 3.0, 8.0) == expected


@pytest.mark.parametrize(
    "values",
    [pytest.param([], id="empty"), pytest.param([math.nan, math.nan], id="only-nan")],
)
def test_judge_range_without_values_is_untestable(values):
    with pytest.raises(Untestable):
        verdicts.judge_range(values, 3.0, 8.0)


@pytest.mark.parametrize(
    "values, expected",
    [
        # [4, 8] widened by 25%: [3, 10]
        pytest.param([3.0, 10.0], "holds", id="widened-edges"),
        pytest.param([2.99, 5.0], "partly", id="below-widened"),
        pytest.param([10.01], "fails", id="above-widened"),
    ],
)
def test_judge_range_with_tolerance(values, expected):
    assert verdicts.judge_range(values, 4.0, 8.0, tol=0.25) == expected


@pytest.mark.parametrize(
    "observed, limit, tol, expected",
    [
        pytest.param(5.0, 5.0, 0.0, "holds", id="at-limit"),
        pytest.param(4.0, 5.0, 0.0, "holds", id="below"),
        pytest.param(5.0001, 5.0, 0.0, "fails", id="just-above"),
        # 5 · 1.25 = 6.25
        pytest.param(6.25, 5.0, 0.25, "holds", id="at-slack"),
        pytest.param(6.26, 5.0, 0.25, "fails", id="beyond-slack"),
    ],
)
def test_judge_at_most(observed, limit, tol, expected):
    assert verdicts.judge_at_most(observed, limit, tol) == expected


@pytest.mark.parametrize(
    "observed, limit, tol, expected",
    [
        pytest.param(95.0, 95.0, 0.0, "holds", id="at-limit"),
        pytest.param(99.0, 95.0, 0.0, "holds", id="above"),
        pytest.param(94.99, 95.0, 0.0, "fails", id="just-below"),
        # 8 · 0.75 = 6
        pytest.param(6.0, 8.0, 0.25, "holds", id="at-slack"),
        pytest.param(5.99, 8.0, 0.25, "fails", id="beyond-slack"),
    ],
)
def test_judge_at_least(observed, limit, tol, expected):
    assert verdicts.judge_at_least(observed, limit, tol) == expected


def test_untestable_verdict_must_say_why():
    with pytest.raises(ValueError):
        verdicts.Verdict("untestable", "", "", "somewhere")
    with pytest.raises(ValueError):
        verdicts.Verdict("maybe", "x", "y", "somewhere")


def test_one_span_writes_every_range():
    """The summaries' and the verdicts' ranges are one function: the format and unit the caller passes, NaN
    and NA left out, one value when both ends round alike, and what to write when nothing is left."""
    from analysis.core.summaries import span

    assert span([1.04, 2.5, float("nan")]) == "1.04–2.50×"
    assert span([1.04, 2.5], ".1f") == "1.0–2.5×"
    assert span(pd.Series([3.01, 2.99, None], dtype="Float64"), ".0f", "%") == "3%"
    assert span([]) == "—" and span([float("nan")], ".1f", empty="none") == "none"
