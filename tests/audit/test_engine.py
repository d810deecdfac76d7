"""The verdict engine on small fixture tables: claims not built, claims without tables, GPU types the
specification table lacks, and borderline verdicts (the band of the timings: p20–p80, widened to the repeat
rounds' medians)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from audit_helpers import (
    ATTENTION,
    FIXTURE_PATH,
    audit_one,
    claims_of,
    context,
    fa3_run,
    fixture_ctx,
    fixture_row,
    judge,
    measured_row,
)

from analysis import audit
from analysis.audit import Context, band


@pytest.mark.parametrize("cid", ["flashinfer"])
def test_not_built_claim_is_untestable_with_its_needs(claims, cid):
    df = audit_one(claims, cid, fixture_ctx([fixture_row("ours-fa2")]))
    assert len(df) == 1
    row = df.iloc[0]
    assert row["verdict"] == "untestable"
    assert row["note"].startswith("experiment not built")
    assert claims[cid].needs in row["note"]
    assert row["gpu"] == audit.ANALYTIC


@pytest.mark.parametrize("cid", ["fp16-tolerance", "exp3-maxdiff", "exp4-close", "std-mfu"])
def test_measured_claim_without_tables_is_untestable(claims, cid):
    df = audit_one(claims, cid, Context())
    assert len(df) == len(claims_of(claims, cid))  # one row per part of a compound claim
    for _, row in df.iterrows():
        assert row["verdict"] == "untestable"
        assert "no measured results" in row["note"]
        assert row["evidence"]


def test_mixed_claim_keeps_its_analytic_verdict_without_tables(claims):
    df = judge([claims["idle-95"], claims["tc-bound-55"], claims["causal-skip-50"]], Context())
    analytic = df[df["gpu"] == audit.ANALYTIC].set_index("claim_id")["verdict"].to_dict()
    # the same analytic verdicts as with the H200 table (see test_certain_analytic_verdicts)
    assert analytic == {"idle-95": "fails", "tc-bound-55": "holds", "causal-skip-50": "holds"}


@pytest.mark.parametrize("cid", ["std-mfu", "fa2-mfu", "idle-95", "tc-bound-55"])
def test_gpu_missing_from_spec_table_is_untestable_for_that_gpu(claims, cid):
    frame = ATTENTION.frame(
        [
            fixture_row("naive", tflops=200.0),
            fixture_row("sdpa-flash", tflops=600.0),
            fixture_row("naive", causal=False, tflops=180.0),
        ]
    )
    ctx = context({"h200": frame, "gpu-not-in-table": frame}, {"h200": FIXTURE_PATH, "gpu-not-in-table": "other.csv"})
    df = audit_one(claims, cid, ctx)
    for _, unknown in df[df["gpu"] == "gpu-not-in-table"].iterrows():  # every part of a compound claim
        assert unknown["verdict"] == "untestable"
        assert "not in the specification table" in unknown["note"]
        assert unknown["evidence"] == "other.csv"
    known = df[df["gpu"] == "h200"]
    assert len(known) == len(claims_of(claims, cid)) and (known["verdict"] != "untestable").all()
    assert known["evidence"].str.contains(FIXTURE_PATH, regex=False).all()


def _band_rows(spread_fp8: float, spread_bf16: float = 0.01):
    """The FP8/bf16 GEMM ratio 1940/1000 = 1.94× against the datasheet's 2.0× ± 2%: partly at the medians.
    ``spread``: how far p20 and p80 lie from the median time (a fraction of it)."""
    common = dict(experiment="fp8-speed", dtype="bfloat16", seqlen_q=4096, seqlen_k=4096, causal=False)
    return [
        fixture_row("fp8-mm", tflops=1940.0, ms_median=1.0, ms_p20=1 - spread_fp8, ms_p80=1 + spread_fp8, **common),
        fixture_row("bf16-mm", tflops=1000.0, ms_median=1.0, ms_p20=1 - spread_bf16, ms_p80=1 + spread_bf16, **common),
    ]


def test_a_verdict_that_flips_inside_the_band_is_borderline(claims):
    """The GEMM ratio moves from 1.94 towards 2.28 when the FP8 GEMM's time goes to its p20: it crosses
    the holds window (1.96–2.04) on the way, though both ends are partly; borderline, band both verdicts."""
    row = measured_row(audit_one(claims, "fp8-2pf", fixture_ctx(_band_rows(spread_fp8=0.15))))
    assert row["verdict"] == "partly"
    assert bool(row["borderline"])
    assert row["band"] == "holds, partly"


def test_a_verdict_that_stays_inside_the_band_is_not_borderline(claims):
    row = measured_row(audit_one(claims, "fp8-2pf", fixture_ctx(_band_rows(spread_fp8=0.001, spread_bf16=0.001))))
    assert row["verdict"] == "partly" and not row["borderline"] and row["band"] == "partly"


def test_the_band_needs_no_evaluator_of_its_own(claims):
    """The same generic re-judging flags a ratio of two implementations when only their spreads (not
    their medians) differ, and leaves a verdict that reads no timing alone, however wide the band."""
    common = dict(experiment="fp8-speed", dtype="bfloat16", seqlen_q=4096, seqlen_k=4096, causal=False)
    rows = _band_rows(spread_fp8=0.001, spread_bf16=0.15)  # now the bf16 GEMM is the noisy one
    row = measured_row(audit_one(claims, "fp8-2pf", fixture_ctx(rows)))
    assert row["borderline"] and row["band"] == "holds, partly"
    same = {k: v for k, v in common.items() if k != "dtype"}
    wide = [fixture_row(i, ms_p20=0.1, ms_p80=10.0, dtype="float16", **same) for i in ("ours-fa2", "sdpa-flash")]
    wide = [{**r, "experiment": "fa2-setting"} for r in wide]
    tol = measured_row(audit_one(claims, "fp16-tolerance", fixture_ctx(wide)))
    assert not tol["borderline"] and tol["band"] == tol["verdict"]


def test_analytic_and_untestable_rows_have_no_band(claims):
    df = judge([claims["std-flops"], claims["fp8-2pf"]], Context())
    assert (df["band"] == "").all() and not df["borderline"].any()


def test_same_data_same_verdicts_and_bands(claims):
    ctx = fixture_ctx(_band_rows(spread_fp8=0.15))
    some = [claims["fp8-2pf"], claims["fa2-mfu.utilisation"], claims["fa2-mfu.tflops"], claims["std-mfu"]]
    first, second = judge(some, ctx), judge(some, ctx)
    pd.testing.assert_frame_equal(first, second)


def test_band_levels_cover_p20_to_p80():
    df = pd.DataFrame(
        {"impl": ["a"], "ms_median": [2.0], "ms_p20": [1.0], "ms_p80": [4.0], "tflops": [10.0], "gbps": [5.0]}
    )
    lows = band._at_levels(df, pd.Series([0.0]).to_numpy())
    highs = band._at_levels(df, pd.Series([1.0]).to_numpy())
    mid = band._at_levels(df, pd.Series([0.5]).to_numpy())
    assert lows["ms_median"].iloc[0] == 1.0 and highs["ms_median"].iloc[0] == 4.0 and mid["ms_median"].iloc[0] == 2.0
    assert lows["tflops"].iloc[0] == 20.0 and highs["gbps"].iloc[0] == 2.5  # per median time: scaled with it
    assert band.BAND_LEVELS[0] == 0.0 and band.BAND_LEVELS[-1] == 1.0


def test_the_band_widens_to_the_repeat_rounds_and_no_more():
    """A row's band runs from the lower of p20 and its lowest round median to the higher of p80 and its highest;
    rounds inside p20-p80, or none (tables before them), leave p20-p80."""
    df = pd.DataFrame(
        {
            "impl": ["a", "b", "c"],
            "ms_median": [2.0, 2.0, 2.0],
            "ms_p20": [1.9, 1.9, 1.9],
            "ms_p80": [2.1, 2.1, 2.1],
            "ms_round_min": [1.8, 1.95, float("nan")],
            "ms_round_max": [2.05, 2.3, float("nan")],
        }
    )
    low, high = band.ends(df)
    assert low.tolist() == [1.8, 1.9, 1.9] and high.tolist() == [2.1, 2.3, 2.1]
    assert band.ends(df.drop(columns=list(band.ROUNDS)))[0].tolist() == [1.9] * 3
    at = lambda level: band._at_levels(df, np.full(3, level))["ms_median"].tolist()  # noqa: E731
    assert at(0.0) == [1.8, 1.9, 1.9] and at(1.0) == [2.1, 2.3, 2.1] and at(0.5) == [2.0] * 3


def _fa3_util(claims, rows) -> pd.Series:
    return measured_row(audit_one(claims, "fa3-util.utilisation", fixture_ctx(rows)))


def test_two_runs_that_straddle_an_edge_are_both_borderline(claims):
    """The case of two H200 runs of the default grid: FA-3's best forward at 74% of the peak in one and 76% in
    the next, against the claim's 75% edge. Their p20-p80 bands (±0.2%) miss the edge, so neither run flagged
    the change; with repeat rounds 2% either side of the median both runs reach the edge and are borderline,
    each naming the other's verdict. A run as noisy but far from the edge is not."""
    below, above = fa3_run(0.74), fa3_run(0.76)
    assert (_fa3_util(claims, below)["verdict"], _fa3_util(claims, above)["verdict"]) == ("fails", "holds")
    assert not _fa3_util(claims, below)["borderline"] and not _fa3_util(claims, above)["borderline"]
    for util, verdict in ((0.74, "fails"), (0.76, "holds")):
        row = _fa3_util(claims, fa3_run(util, rounds=0.02))
        assert row["verdict"] == verdict and row["borderline"] and row["band"] == "holds, fails"
    far = _fa3_util(claims, fa3_run(0.60, rounds=0.02))
    assert far["verdict"] == "fails" and not far["borderline"] and far["band"] == "fails"
    inside = _fa3_util(claims, fa3_run(0.80, rounds=0.02))
    assert inside["verdict"] == "holds" and not inside["borderline"]
