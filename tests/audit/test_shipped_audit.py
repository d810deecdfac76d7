"""The full audit over the shipped H200 attention table: every claim judged, analytic verdicts as the models
give them, measured rows citing the table, and the borderline band of the shipped timings."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from audit_helpers import judge

from analysis import audit, pipeline

ROOT = Path(__file__).resolve().parents[2]
H200_TABLE = "reports/reference/h200/attention.csv"


@pytest.fixture(scope="module")
def full(claims) -> pd.DataFrame:
    return judge(list(claims.values()), pipeline.read_context({"attention": {"h200": ROOT / H200_TABLE}}))


def _analytic(full: pd.DataFrame, cid: str) -> pd.Series:
    rows = full[(full["claim_id"] == cid) & (full["gpu"] == audit.ANALYTIC)]
    assert len(rows) == 1, cid
    return rows.iloc[0]


def test_full_audit_shape(full, claims):
    assert list(full.columns) == audit.COLUMNS
    assert set(full["claim_id"]) == set(claims)
    assert set(full["verdict"]) <= set(audit.VERDICTS)
    assert set(full["gpu"]) <= {audit.ANALYTIC, "h200"}
    counts = audit.summary(full)
    assert list(counts) == [*audit.VERDICTS, "borderline"]
    assert sum(counts[v] for v in audit.VERDICTS) == len(full)
    assert counts["borderline"] == int(full["borderline"].sum())


def test_full_audit_rows_explain_themselves(full):
    untestable = full[full["verdict"] == "untestable"]
    assert not untestable.empty
    assert (untestable["note"].str.strip() != "").all()
    assert (full["evidence"].str.strip() != "").all()


def test_full_audit_measured_rows_cite_the_table(full, claims):
    measured = full[full["gpu"] == "h200"]
    assert not measured.empty
    bad = measured[~measured["evidence"].str.contains(H200_TABLE, regex=False)]
    assert bad["claim_id"].tolist() == []
    # analytic rows point at no figure; measured rows at their claim's figure
    assert (full.loc[full["gpu"] == audit.ANALYTIC, "figure"] == "").all()
    for r in measured.itertuples():
        assert r.figure == claims[r.claim_id].figure


def test_full_audit_not_built_claims(full, claims):
    for cid, claim in claims.items():
        if claim.evaluator == "not_built":
            row = _analytic(full, cid)
            assert row["verdict"] == "untestable"
            assert row["note"].startswith("experiment not built"), cid


@pytest.mark.parametrize(
    "cid, verdict",
    [
        # 312 / 2.039 = 153.0 against ≈153 within 1%
        pytest.param("a100-knee", "holds", id="a100-knee"),
        # the article's per-kernel terms sum to 8N², its formula says 6N²
        pytest.param("std-bytes-formula", "inconsistent", id="std-bytes-formula"),
        # 2N²d is 2/14 = 14.3% of a recomputing training step, not 25–30%, and contradicts 15–20%
        pytest.param("recompute-flops-b", "inconsistent", id="recompute-flops-b"),
        # 2N²d over 12N²d = 16.7%: inside 15–20%
        pytest.param("recompute-flops-a", "holds", id="recompute-flops-a"),
        # 4·131072²·128 = 8.796e12 FLOP / 312e12 FLOP/s = 28.2 ms, not < 5 ms
        pytest.param("time-128k-compute", "fails", id="time-128k-compute"),
        # 4 × 34,359,738,368 B / 1.5e12 B/s = 91.63 ms against ≈91.6 within 1%
        pytest.param("time-128k-hbm", "holds", id="time-128k-hbm"),
        # Br = min(321, 64) = 64 ≠ Bc = 321
        pytest.param("fa1-blocks", "fails", id="fa1-blocks"),
        # 32768² / 8192² = 16 exactly
        pytest.param("incident-16x", "holds", id="incident-16x"),
        # 8192² · 2 B = 128 MiB exactly
        pytest.param("mem-8k-scores", "holds", id="mem-8k-scores"),
        # one head's S+P = 68.7 GB fits in 80 GB, 32 heads (2199 GB) do not
        pytest.param("mem-128k-oom", "partly", id="mem-128k-oom"),
        # 2,155,872,256 / 344,981,504 = 6.25×, not ≈20× ± 15%
        pytest.param("io-ratio-20", "fails", id="io-ratio-20"),
        # 1 − 129/256 = 49.6% of tiles skipped at T=128, ≈50% within 10%
        pytest.param("causal-skip-50", "holds", id="causal-skip-50"),
    ],
)
def test_certain_analytic_verdicts(full, cid, verdict):
    assert _analytic(full, cid)["verdict"] == verdict


@pytest.mark.parametrize(
    "cid, fragment, where",
    [
        # 312 / 2.039 = 153.016
        pytest.param("a100-knee", "153.0 FLOP/B", "start", id="a100-knee"),
        # 2N²d / (4N²d + 10N²d) = 1/7 = 14.29%
        pytest.param("recompute-flops-b", "14.3%", "start", id="recompute-flops-b"),
        # 2N²d / (4N²d + 8N²d) = 1/6 = 16.67%
        pytest.param("recompute-flops-a", "16.7%", "start", id="recompute-flops-a"),
        # 8,796,093,022,208 FLOP / 312e12 = 28.19 ms
        pytest.param("time-128k-compute", "28.2 ms", "start", id="time-128k-compute"),
        # ⌈82000 / 256⌉ = 321, min(321, 64) = 64
        pytest.param("fa1-blocks", "= 64; Bc = 321", "contains", id="fa1-blocks"),
        pytest.param("incident-16x", "16×", "start", id="incident-16x"),
        # 134,217,728 B / 2^20 = 128
        pytest.param("mem-8k-scores", "128 MiB", "start", id="mem-8k-scores"),
        # 545,259,520 / 178,257,920 = 3.0588
        pytest.param("io-q2-8k", "3.06×", "start", id="io-q2-8k"),
        # 127/256 = 49.6%
        pytest.param("causal-skip-50", "49.6%", "start", id="causal-skip-50"),
    ],
)
def test_analytic_observed_strings(full, cid, fragment, where):
    observed = _analytic(full, cid)["observed"]
    if where == "start":
        assert observed.startswith(fragment), observed
    else:
        assert fragment in observed, observed


def test_full_audit_judges_measured_claims_on_h200(full):
    # every wired measured claim produced an H200 row (none silently vanished)
    for cid in (
        "idle-95",
        "tc-bound-55",
        "std-mfu",
        "fa-exact",
        "online-softmax",
        "fp16-tolerance",
        "fa2-mfu.tflops",
        "causal-skip-50",
        "incident-rollback.memory",
        "incident-rollback.latency",
        "exp1-oom-16k.oom",
        "exp3-maxdiff",
        "exp4-close.vs-naive",
        "exp4-close.vs-official",
        "exp-s0-slower",
    ):
        rows = full[(full["claim_id"] == cid) & (full["gpu"] == "h200")]
        assert len(rows) == 1, cid


def test_the_shipped_borderline_verdicts_name_both_sides(full):
    """A measured verdict whose band of the shipped timings reaches across its tolerance's edge is marked
    borderline, its band naming the verdicts on both sides, its own among them. Which claims sit there moves
    from run to run (fp8-2pf has come out at 1.90-1.96x against 1.97x: on the edge in some H200 runs, plainly
    partly in others), so the test holds the rule, not a list; most verdicts do not move."""
    measured = full[full["gpu"] == "h200"]
    edge = measured[measured["borderline"]]
    assert 1 <= len(edge) < len(measured) // 4
    for _, row in edge.iterrows():
        sides = row["band"].split(", ")
        assert len(sides) == 2 and row["verdict"] in sides and set(sides) <= set(audit.VERDICTS), row.to_dict()
    ratio = measured[measured["claim_id"] == "fp8-2pf"].iloc[0]
    assert ratio["verdict"] in ("holds", "partly")
    assert ratio["band"] == ("holds, partly" if ratio["borderline"] else ratio["verdict"])
    assert (full.loc[~full["borderline"], "band"].isin(["", *audit.VERDICTS])).all()
