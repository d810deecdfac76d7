"""The claims audit: the registry, the judging helpers, the verdict engine on small fixture tables, and
the full audit over the shipped H200 table."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

from analysis import audit, tables
from analysis.audit import Claim, Context, Untestable

ROOT = Path(__file__).resolve().parents[2]
H200_TABLE = "reports/reference/h200/attention.csv"
FIXTURE_PATH = "fixture.csv"

# Every id of the project's claim catalog (claims.md); the registry must keep all of them.
CATALOG_IDS = [
    "mem-8k-scores", "mem-128k-head", "mem-128k-oom", "a100-bw", "time-128k-hbm", "time-128k-compute",
    "idle-95", "incident-16x", "incident-rollback", "std-bytes-formula", "std-flops", "ai-4096", "ai-limit",
    "ai-order-d", "a100-knee", "tc-bound-55", "std-mfu", "fa-hbm-on", "fa-exact", "fa1-speed-mem",
    "fa-gain-vanishes", "fa1-blocks", "recompute-flops-a", "recompute-flops-b", "mem-64k", "bwd-faster",
    "break-even-512", "fa-io-theorem", "io-ratio-20", "io-q2-8k", "io-q2-32k", "fa1-mfu", "online-softmax",
    "fp16-tolerance", "fa2-mfu", "fa2-vs-fa1", "causal-skip-50", "lazy-rescale", "h100-peak", "fa3-util",
    "tma-registers", "wgmma-issue", "fp8-2pf", "fp8-accuracy", "flashdecoding", "flashinfer", "fp32-16x",
    "varlen-waste", "block-64", "tc-95-inner", "exp1-oom-16k", "exp3-maxdiff", "exp4-close", "exp-s0-slower",
    "moe-dense-inside", "moe-grouped", "w4-bandwidth", "w4-fusion", "fp8-scales",
]  # fmt: skip


@pytest.fixture(scope="module")
def registry() -> dict[str, Claim]:
    return {c.id: c for c in audit.load_registry()}


# ---------------------------------------------------------------------------------------------------
# (1) The registry
# ---------------------------------------------------------------------------------------------------


def test_registry_loads_every_catalog_claim(registry):
    assert len(CATALOG_IDS) == len(set(CATALOG_IDS)) == 59
    missing = sorted(set(CATALOG_IDS) - {c.whole.id if c.whole else c.id for c in registry.values()})
    assert missing == []


def test_registry_claims_are_well_formed(registry):
    for claim in registry.values():
        assert claim.evaluator in audit.EVALUATORS, claim.id
        assert claim.statement, claim.id
        assert claim.kind, claim.id
        assert claim.source.startswith(("S0 (", "S1 (")), claim.id
        if claim.evaluator == "not_built":
            assert claim.needs, claim.id


def test_load_registry_reads_the_default_path(registry):
    assert audit.REGISTRY == ROOT / "analysis" / "claims" / "registry.yaml"
    assert [c.id for c in audit.load_registry(audit.REGISTRY)] == list(registry)


def _claim_entry(cid: str, evaluator: str = "std_flops", **extra) -> dict:
    entry = {
        "id": cid,
        "source": {"article": "S1", "section": "§1"},
        "statement": "a statement",
        "asserted": {"approx": 1, "unit": "x"},
        "wording": "≈ 1",
        "tolerance": 0.0,
        "kind": ["analytic"],
        "evaluator": evaluator,
    }
    entry.update(extra)
    return entry


def _write_registry(tmp_path, claims: list[dict]) -> Path:
    doc = {"sources": {"S0": {"file": "a.txt", "title": "A"}, "S1": {"file": "b.txt", "title": "B"}}, "claims": claims}
    path = tmp_path / "registry.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def test_small_valid_registry_loads(tmp_path):
    path = _write_registry(
        tmp_path,
        [_claim_entry("one"), _claim_entry("two", evaluator="not_built", needs="a kernel")],
    )
    claims = audit.load_registry(path)
    assert [c.id for c in claims] == ["one", "two"]
    assert claims[0].source == "S1 (b.txt) §1"
    assert claims[1].needs == "a kernel"
    assert claims[0].conditions == {}


@pytest.mark.parametrize(
    "claims, match",
    [
        pytest.param([_claim_entry("dup"), _claim_entry("dup")], "duplicate claim id 'dup'", id="duplicate-id"),
        pytest.param([_claim_entry("odd", evaluator="no_such_evaluator")], "unknown evaluator", id="unknown-evaluator"),
        pytest.param(
            [_claim_entry("later", evaluator="not_built")], "does not say what it needs", id="not-built-no-needs"
        ),
        pytest.param(
            [_claim_entry("empty-needs", evaluator="not_built", needs="")],
            "does not say what it needs",
            id="not-built-empty-needs",
        ),
        pytest.param(
            [_claim_entry("elsewhere", source={"article": "S9", "section": "x"})],
            "unknown article",
            id="unknown-article",
        ),
    ],
)
def test_malformed_registry_is_rejected(tmp_path, claims, match):
    with pytest.raises(ValueError, match=match):
        audit.load_registry(_write_registry(tmp_path, claims))


# ---------------------------------------------------------------------------------------------------
# (2) The judging helpers
# ---------------------------------------------------------------------------------------------------


def _claim(asserted: dict, tolerance: float) -> Claim:
    return Claim(
        id="t", source="S1 (b.txt) §1", statement="s", asserted=asserted, wording="w", tolerance=tolerance,
        conditions={}, kind=("analytic",), evaluator="std_flops",
    )  # fmt: skip


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
    assert audit.judge_approx(observed, _claim({"approx": 16}, 0.25)) == expected


@pytest.mark.parametrize(
    "observed, expected",
    [
        pytest.param(16.0, "holds", id="exact"),
        pytest.param(16.001, "fails", id="off-by-a-little"),
    ],
)
def test_judge_approx_zero_tolerance_is_exact(observed, expected):
    assert audit.judge_approx(observed, _claim({"approx": 16}, 0.0)) == expected


def test_judge_approx_explicit_target_overrides_asserted():
    claim = _claim({"approx": 16}, 0.25)
    assert audit.judge_approx(100.0, claim, target=100.0) == "holds"
    assert audit.judge_approx(16.0, claim, target=100.0) == "fails"


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
    assert audit.judge_range(values, 3.0, 8.0) == expected


@pytest.mark.parametrize(
    "values",
    [pytest.param([], id="empty"), pytest.param([math.nan, math.nan], id="only-nan")],
)
def test_judge_range_without_values_is_untestable(values):
    with pytest.raises(Untestable):
        audit.judge_range(values, 3.0, 8.0)


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
    assert audit.judge_range(values, 4.0, 8.0, tol=0.25) == expected


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
    assert audit.judge_at_most(observed, limit, tol) == expected


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
    assert audit.judge_at_least(observed, limit, tol) == expected


def test_untestable_verdict_must_say_why():
    with pytest.raises(ValueError):
        audit.Verdict("untestable", "", "", "somewhere")
    with pytest.raises(ValueError):
        audit.Verdict("maybe", "x", "y", "somewhere")


# ---------------------------------------------------------------------------------------------------
# (3) The verdict engine on small fixture tables
# ---------------------------------------------------------------------------------------------------


def _row(impl: str, **over) -> dict:
    """One finished, timed row of the result schema with plausible values; ``over`` replaces fields."""
    r = {
        "experiment": "fa2-setting", "family": "attention", "op": "attention", "impl": impl, "dtype": "float16",
        "mode": "fwd", "batch": 8, "heads": 16, "heads_kv": 16, "seqlen_q": 2048, "seqlen_k": 2048,
        "head_dim": 128, "causal": True, "status": "ok", "message": "", "timed": True, "ms_median": 1.0,
        "ms_p20": 0.99, "ms_p80": 1.01, "tflops": 200.0, "peak_mem_mib": 64.0, "max_abs_err": 1e-3,
        "rms_err": 1e-4, "ref_err": 2e-3, "err_bound": 1e-2, "sm_clock_mhz": 1980.0, "mem_clock_mhz": 3201.0,
        "temp_c": 45.0, "power_w": 300.0, "gpu_name": "NVIDIA H200", "gpu": "h200", "driver": "580.0",
        "cuda": "13.0", "torch": "2.11.0", "triton": "3.6.0", "python": "3.12.3", "git_sha": "0" * 40,
        "timestamp": "2026-01-01T00:00:00Z", "kernel_config": "",
    }  # fmt: skip
    assert set(r) <= set(tables.COLUMNS)
    r.update({c: math.nan for c in tables.COLUMNS if c not in r})  # columns only some experiments fill
    r.update(over)
    return r


def _ctx(rows: list[dict], gpu: str = "h200") -> Context:
    return Context(tables={gpu: tables.to_frame(rows)}, paths={gpu: FIXTURE_PATH})


def _claims(registry, cid: str) -> list[Claim]:
    """The claim ``cid``, or the parts of the compound claim ``cid``."""
    return [c for c in registry.values() if c.id == cid or (c.whole is not None and c.whole.id == cid)]


def _audit_one(registry, cid: str, ctx: Context) -> pd.DataFrame:
    claims = _claims(registry, cid)
    df = audit.audit(claims, ctx)
    assert list(df.columns) == audit.COLUMNS
    assert set(df["claim_id"]) == {c.id for c in claims}
    return df


def _part_rows(df: pd.DataFrame, gpu: str = "h200") -> dict[str, pd.Series]:
    """The GPU's row of each part, by part name."""
    return {r["claim_id"].split(audit.PART_SEP, 1)[1]: r for _, r in df[df["gpu"] == gpu].iterrows()}


def _measured_row(df: pd.DataFrame, gpu: str = "h200") -> pd.Series:
    rows = df[df["gpu"] == gpu]
    assert len(rows) == 1
    return rows.iloc[0]


@pytest.mark.parametrize(
    "ours_err, sdpa_err, expected",
    [
        # |ours − SDPA| ≤ 1e-3 + 2e-3 = 3e-3 ≤ 1e-2, smallest error 1e-3 > 1e-5
        pytest.param(1e-3, 2e-3, "holds", id="small-errors"),
        # 6e-3 + 5e-3 = 1.1e-2 > 1e-2
        pytest.param(6e-3, 5e-3, "fails", id="sum-above-atol"),
        # bound fine, but ours' smallest error 5e-6 ≤ 1e-5: the '1e-5 falsely fails' half does not show
        pytest.param(5e-6, 2e-3, "fails", id="errors-below-1e-5"),
    ],
)
def test_fp16_tolerance_on_fixture(registry, ours_err, sdpa_err, expected):
    ctx = _ctx([_row("ours-fa2", max_abs_err=ours_err), _row("sdpa-flash", max_abs_err=sdpa_err)])
    row = _measured_row(_audit_one(registry, "fp16-tolerance", ctx))
    assert row["verdict"] == expected
    assert FIXTURE_PATH in row["evidence"]


@pytest.mark.parametrize(
    "ours_err, flash_err, expected, observed",
    [
        # 1e-3 + 2e-3 = 3e-3 ≤ 5e-3
        pytest.param(1e-3, 2e-3, "holds", "≤ 0.003", id="holds"),
        # 2.5e-3 + 2.5e-3 = 5e-3 exactly (doubling is exact): at the bound
        pytest.param(2.5e-3, 2.5e-3, "holds", "≤ 0.005", id="at-bound"),
        # 3e-3 + 2.5e-3 = 5.5e-3 > 5e-3
        pytest.param(3e-3, 2.5e-3, "fails", "≤ 0.0055", id="sum-above-5e-3"),
    ],
)
def test_exp3_maxdiff_on_fixture(registry, ours_err, flash_err, expected, observed):
    rows = [
        _row("ours-fa2", max_abs_err=ours_err),
        _row("sdpa-flash", max_abs_err=flash_err),
        # other settings must not be picked up: a huge error at N=4096 and in the non-causal setting
        _row("ours-fa2", seqlen_q=4096, seqlen_k=4096, max_abs_err=0.5),
        _row("sdpa-flash", causal=False, max_abs_err=0.5),
    ]
    row = _measured_row(_audit_one(registry, "exp3-maxdiff", _ctx(rows)))
    assert row["verdict"] == expected
    assert row["observed"] == observed
    assert FIXTURE_PATH in row["evidence"]


def test_exp3_maxdiff_ignores_unfinished_rows(registry):
    rows = [
        _row("ours-fa2", max_abs_err=1e-3),
        _row("sdpa-flash", max_abs_err=1e-3, status="error", message="boom"),
    ]
    row = _measured_row(_audit_one(registry, "exp3-maxdiff", _ctx(rows)))
    assert row["verdict"] == "untestable"
    assert "no finished ours and sdpa-flash rows" in row["note"]


@pytest.mark.parametrize(
    "naive_ms, expected, observed_prefix",
    [
        # speed-ups naive/ours = 3.0 and 8.0: exactly the range's ends
        pytest.param((3.0, 8.0), "holds", "3.0–8.0×", id="exact-edges"),
        # 2.9 below the range, 8.0 at its top
        pytest.param((2.9, 8.0), "partly", "2.9–8.0×", id="one-below"),
        # 2.0 and 9.0: both outside
        pytest.param((2.0, 9.0), "fails", "2.0–9.0×", id="all-outside"),
    ],
)
def test_exp4_close_range_edges(registry, naive_ms, expected, observed_prefix):
    rows = []
    for n, naive in zip((1024, 16384), naive_ms, strict=True):
        rows += [
            _row("ours-fa2", seqlen_q=n, seqlen_k=n, ms_median=1.0),
            _row("naive", seqlen_q=n, seqlen_k=n, ms_median=naive),
            _row("sdpa-flash", seqlen_q=n, seqlen_k=n, ms_median=1.25),
        ]
    # d=64 and non-causal rows are outside the claim's setting: a 100× speed-up there must not count
    rows += [_row("naive", head_dim=64, ms_median=100.0), _row("ours-fa2", head_dim=64, ms_median=1.0)]
    rows += [_row("naive", causal=False, ms_median=100.0), _row("ours-fa2", causal=False, ms_median=1.0)]
    parts = _part_rows(_audit_one(registry, "exp4-close", _ctx(rows)))
    assert parts["vs-naive"]["verdict"] == expected
    assert parts["vs-naive"]["observed"].startswith(observed_prefix)
    # SDPA's FA-2 takes 1.25× our time: ours is at least 90% as fast, "close to the official kernel"
    assert parts["vs-official"]["verdict"] == "holds"
    assert parts["vs-official"]["observed"] == "1.25–1.25× SDPA flash's speed"


def test_exp4_close_without_naive_rows_is_untestable(registry):
    rows = [_row("ours-fa2"), _row("sdpa-flash")]
    for row in _part_rows(_audit_one(registry, "exp4-close", _ctx(rows))).values():
        assert row["verdict"] == "untestable"
        assert row["note"]
        assert row["evidence"] == FIXTURE_PATH


def test_exp4_close_far_below_the_official_kernel_is_not_close(registry):
    rows = []
    for n, flash in ((1024, 0.95), (16384, 0.5)):  # SDPA's FA-2 takes 0.95 / 0.5 of our time
        rows += [_row("ours-fa2", seqlen_q=n, seqlen_k=n, ms_median=1.0),
                 _row("naive", seqlen_q=n, seqlen_k=n, ms_median=5.0),
                 _row("sdpa-flash", seqlen_q=n, seqlen_k=n, ms_median=flash)]  # fmt: skip
    parts = _part_rows(_audit_one(registry, "exp4-close", _ctx(rows)))
    assert parts["vs-official"]["verdict"] == "partly" and parts["vs-naive"]["verdict"] == "holds"


def test_untimed_rows_are_not_measurements(registry):
    # correctness-only rows (timed False, e.g. the interpreter) have no time to compare
    rows = [_row("ours-fa2", timed=False), _row("naive", timed=False, ms_median=5.0), _row("sdpa-flash", timed=False)]
    df = _audit_one(registry, "exp4-close", _ctx(rows))
    assert (df.loc[df["gpu"] == "h200", "verdict"] == "untestable").all()


@pytest.mark.parametrize("cid", ["flashinfer", "tc-95-inner"])
def test_not_built_claim_is_untestable_with_its_needs(registry, cid):
    df = _audit_one(registry, cid, _ctx([_row("ours-fa2")]))
    assert len(df) == 1
    row = df.iloc[0]
    assert row["verdict"] == "untestable"
    assert row["note"].startswith("experiment not built")
    assert registry[cid].needs in row["note"]
    assert row["gpu"] == audit.ANALYTIC


@pytest.mark.parametrize("cid", ["fp16-tolerance", "exp3-maxdiff", "exp4-close", "std-mfu"])
def test_measured_claim_without_tables_is_untestable(registry, cid):
    df = _audit_one(registry, cid, Context())
    assert len(df) == len(_claims(registry, cid))  # one row per part of a compound claim
    for _, row in df.iterrows():
        assert row["verdict"] == "untestable"
        assert "no measured results" in row["note"]
        assert row["evidence"]


def test_mixed_claim_keeps_its_analytic_verdict_without_tables(registry):
    df = audit.audit([registry["idle-95"], registry["tc-bound-55"], registry["causal-skip-50"]], Context())
    analytic = df[df["gpu"] == audit.ANALYTIC].set_index("claim_id")["verdict"].to_dict()
    # the same analytic verdicts as with the H200 table (see test_certain_analytic_verdicts)
    assert analytic == {"idle-95": "fails", "tc-bound-55": "holds", "causal-skip-50": "holds"}


@pytest.mark.parametrize("cid", ["std-mfu", "fa2-mfu", "idle-95", "tc-bound-55"])
def test_gpu_missing_from_spec_table_is_untestable_for_that_gpu(registry, cid):
    frame = tables.to_frame(
        [_row("naive", tflops=200.0), _row("sdpa-flash", tflops=600.0), _row("naive", causal=False, tflops=180.0)]
    )
    ctx = Context(
        tables={"h200": frame, "gpu-not-in-table": frame},
        paths={"h200": FIXTURE_PATH, "gpu-not-in-table": "other.csv"},
    )
    df = _audit_one(registry, cid, ctx)
    for _, unknown in df[df["gpu"] == "gpu-not-in-table"].iterrows():  # every part of a compound claim
        assert unknown["verdict"] == "untestable"
        assert "not in the specification table" in unknown["note"]
        assert unknown["evidence"] == "other.csv"
    known = df[df["gpu"] == "h200"]
    assert len(known) == len(_claims(registry, cid)) and (known["verdict"] != "untestable").all()
    assert known["evidence"].str.contains(FIXTURE_PATH, regex=False).all()


@pytest.mark.parametrize(
    "tflops, expected",
    [
        # 200 TFLOP/s of the H200's ≈989 dense peak ≈ 20%: inside 15–25%
        pytest.param((200.0, 180.0), "holds", id="inside"),
        # ≈20% and ≈5%
        pytest.param((200.0, 50.0), "partly", id="one-outside"),
        # ≈5% and ≈60%
        pytest.param((50.0, 600.0), "fails", id="both-outside"),
    ],
)
def test_std_mfu_on_fixture(registry, tflops, expected):
    rows = [_row("naive", seqlen_q=n, seqlen_k=n, tflops=t) for n, t in zip((1024, 2048), tflops, strict=True)]
    row = _measured_row(_audit_one(registry, "std-mfu", _ctx(rows)))
    assert row["verdict"] == expected


# ---------------------------------------------------------------------------------------------------
# (4) The full audit over the shipped H200 table
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def full(registry) -> pd.DataFrame:
    ctx = Context.from_files({"h200": ROOT / H200_TABLE})
    return audit.audit(list(registry.values()), ctx)


def _analytic(full: pd.DataFrame, cid: str) -> pd.Series:
    rows = full[(full["claim_id"] == cid) & (full["gpu"] == audit.ANALYTIC)]
    assert len(rows) == 1, cid
    return rows.iloc[0]


def test_full_audit_shape(full, registry):
    assert list(full.columns) == audit.COLUMNS
    assert set(full["claim_id"]) == set(registry)
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


def test_full_audit_measured_rows_cite_the_table(full, registry):
    measured = full[full["gpu"] == "h200"]
    assert not measured.empty
    bad = measured[~measured["evidence"].str.contains(H200_TABLE, regex=False)]
    assert bad["claim_id"].tolist() == []
    # analytic rows point at no figure; measured rows at their claim's figure
    assert (full.loc[full["gpu"] == audit.ANALYTIC, "figure"] == "").all()
    for r in measured.itertuples():
        assert r.figure == registry[r.claim_id].figure


def test_full_audit_not_built_claims(full, registry):
    for cid, claim in registry.items():
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
    for cid in ("idle-95", "tc-bound-55", "std-mfu", "fa-exact", "online-softmax", "fp16-tolerance", "fa2-mfu.tflops",
                "causal-skip-50", "incident-rollback.memory", "incident-rollback.latency", "exp1-oom-16k.oom",
                "exp3-maxdiff", "exp4-close.vs-naive",
                "exp4-close.vs-official", "exp-s0-slower"):  # fmt: skip
        rows = full[(full["claim_id"] == cid) & (full["gpu"] == "h200")]
        assert len(rows) == 1, cid


def _memory_row(impl: str, n: int, mib: float, ms: float, status: str = "ok") -> dict:
    return _row(impl, experiment="memory", batch=1, seqlen_q=n, seqlen_k=n, causal=False, peak_mem_mib=mib,
                ms_median=ms, status=status)  # fmt: skip


def test_exp1_without_a_common_sequence_length_is_untestable(registry):
    rows = [
        _memory_row("naive", 1024, 64.0, 0.1),
        _memory_row("naive", 2048, 256.0, 0.3),
        _memory_row("ours-fa2", 4096, 16.0, 0.3),
        _memory_row("ours-fa2", 8192, 32.0, 1.2),
    ]
    for row in _part_rows(_audit_one(registry, "exp1-oom-16k", _ctx(rows))).values():
        assert row["verdict"] == "untestable"
        assert "no common sequence length" in row["note"]


def test_exp1_scaling_and_oom_on_fixture(registry):
    # naive memory ×4 per doubling (N²), ours ×2 (N); naive needs 16 GiB at 16K: fits an 80 GB card
    rows = [_memory_row("naive", n, 16384.0 * (n / 16384) ** 2, 1.0) for n in (4096, 8192, 16384)]
    rows += [_memory_row("ours-fa2", n, 64.0 * n / 16384, 0.5) for n in (4096, 8192, 16384)]
    rows.append(_memory_row("naive", 65536, float("nan"), float("nan"), status="oom"))
    parts = _part_rows(_audit_one(registry, "exp1-oom-16k", _ctx(rows)))
    # the scaling holds, the out-of-memory point at 16K does not; ours is 2× faster, "several times"
    assert {k: r["verdict"] for k, r in parts.items()} == {"oom": "fails", "scaling": "holds", "faster": "holds"}
    assert parts["scaling"]["observed"] == "memory grows as N^2.00 (naive), N^1.00 (ours)"
    assert parts["faster"]["observed"] == "2.0× faster at the largest N both finished"


def _traffic_frame(points: list[tuple[str, int, float]], resident: int | None = None) -> pd.DataFrame:
    """Traffic rows: one kernel per (impl, N, total bytes); ``resident``: the N whose tensors fit in L2."""
    from analysis import traffic

    rows = []
    for impl, n, total in points:
        row = dict.fromkeys(traffic.COLUMNS, float("nan"))
        row.update(experiment="traffic-scaling", impl=impl, kernel="k", kernel_index=0, kernel_role="attention",
                   dtype="float16", batch=1, heads=16, seqlen=n, head_dim=128, causal=False,
                   dram_read_bytes=0.75 * total, dram_write_bytes=0.25 * total, l2_resident=(n == resident),
                   status="ok", message="", gpu="h200")  # fmt: skip
        rows.append(row)
    return pd.DataFrame(rows, columns=traffic.COLUMNS)


def _traffic_ctx(points, resident=None) -> Context:
    return Context(traffic={"h200": _traffic_frame(points, resident)}, traffic_paths={"h200": "traffic.csv"})


@pytest.mark.parametrize(
    "n2_bytes, expected",
    [
        pytest.param(8, "fails", id="per-kernel-8N2"),  # what the three kernels must move
        pytest.param(6, "holds", id="article-6N2"),
    ],
)
def test_std_bytes_formula_measured_part(registry, n2_bytes, expected):
    # 16 heads × (c·N² + 8·N·128) bytes; N=1024 is marked L2-resident and must be ignored
    pts = [("naive", n, 16 * (n2_bytes * n * n + 8 * n * 128)) for n in (2048, 4096, 8192)]
    pts.append(("naive", 1024, 1.0))
    df = _audit_one(registry, "std-bytes-formula", _traffic_ctx(pts, resident=1024))
    assert df[df["gpu"] == audit.ANALYTIC]["verdict"].item() == "inconsistent"
    row = _measured_row(df)
    assert row["verdict"] == expected
    assert row["observed"].startswith(f"{n2_bytes:.2f}")


@pytest.mark.parametrize(
    "power, expected", [pytest.param(1, "holds", id="linear"), pytest.param(2, "fails", id="quadratic")]
)
def test_fa_hbm_on_measured_part(registry, power, expected):
    pts = [("ours-fa2", n, 16 * 4 * 128 * 2 * n**power / 1024 ** (power - 1)) for n in (2048, 4096, 8192)]
    row = _measured_row(_audit_one(registry, "fa-hbm-on", _traffic_ctx(pts)))
    assert row["verdict"] == expected
    assert f"N^{power:.2f}" in row["observed"]


# ---------------------------------------------------------------------------------------------------
# (4) The attention family's claims on fixture tables
# ---------------------------------------------------------------------------------------------------


def _fa1_rows(speed: dict[int, float], saving: float) -> list[dict]:
    """FA-1 setting rows: naive takes ``speed[N]`` × ours-fa1's time and ``saving`` × its memory."""
    rows = []
    for n, s in speed.items():
        common = dict(experiment="fa1-setting", mode="fwd+bwd", batch=8, heads=12, head_dim=64, seqlen_q=n,
                      seqlen_k=n, causal=False)  # fmt: skip
        rows += [
            _row("naive", ms_median=s, peak_mem_mib=100.0 * saving, **common),
            _row("ours-fa1", ms_median=1.0, peak_mem_mib=100.0, **common),
            _row("ours-fa2", ms_median=0.5, peak_mem_mib=100.0, **common),
        ]
    return rows


@pytest.mark.parametrize(
    "speed, saving, expected, fa2_span",
    [
        # every long point (N ≥ 1024) at 2× and 4× (the edges), memory 10×: holds; N=512 at 9× is not long.
        # Our FA-2 takes half of FA-1's time, so its speed-up over naive is twice FA-1's at the long points.
        pytest.param({512: 9.0, 1024: 2.0, 8192: 4.0}, 10.0, ("holds", "holds"), "4.0–8.0×", id="edges-hold"),
        pytest.param({1024: 1.9, 8192: 3.0}, 15.0, ("partly", "holds"), "3.8–6.0×", id="one-speedup-below"),
        pytest.param({1024: 3.0, 8192: 3.0}, 25.0, ("holds", "fails"), "6.0×", id="memory-above-range"),
        pytest.param({1024: 1.0, 8192: 5.0}, 2.0, ("fails", "fails"), "2.0–10.0×", id="nothing-inside"),
    ],
)
def test_fa1_speed_mem_on_fixture(registry, speed, saving, expected, fa2_span):
    """The compound claim's parts get their own verdicts: the speed-up against 2–4×, the saving 10–20×."""
    parts = _part_rows(_audit_one(registry, "fa1-speed-mem", _ctx(_fa1_rows(speed, saving))))
    assert (parts["speed"]["verdict"], parts["memory"]["verdict"]) == expected
    assert parts["memory"]["observed"] == f"{saving:.1f}× less extra peak memory"
    for row in parts.values():
        assert row["note"].endswith(
            f"our FA-2: {fa2_span}. Memory saving = naive's extra peak memory / ours (inputs "
            "excluded). The claim is about an A100: this is the same ratio measured on this GPU"
        )


def test_fa1_speed_mem_without_the_experiment_is_untestable(registry):
    for row in _part_rows(_audit_one(registry, "fa1-speed-mem", _ctx([_row("ours-fa2")]))).values():
        assert row["verdict"] == "untestable"
        assert "FA-1 setting" in row["note"]


@pytest.mark.parametrize(
    "naive_ms, expected",
    [
        pytest.param((2.0, 3.0), "holds", id="range-edges"),
        pytest.param((1.5, 3.0), "partly", id="one-below"),
        pytest.param((3.5, 4.0), "fails", id="all-above"),
    ],
)
def test_bwd_faster_range_edges(registry, naive_ms, expected):
    rows = []
    for n, naive in zip((1024, 8192), naive_ms, strict=True):
        rows += [_row(impl, mode="bwd", seqlen_q=n, seqlen_k=n, ms_median=ms)
                 for impl, ms in (("naive", naive), ("ours-fa2", 1.0), ("sdpa-flash", 1.2))]  # fmt: skip
    # forward rows must not count: a 10× forward speed-up
    rows += [_row("naive", ms_median=10.0), _row("ours-fa2", ms_median=1.0)]
    row = _measured_row(_audit_one(registry, "bwd-faster", _ctx(rows)))
    assert row["verdict"] == expected
    assert "vs SDPA flash backward: 1.20×" in row["note"]


@pytest.mark.parametrize(
    "ours_ms, expected",
    [
        pytest.param({256: 2.0, 512: 1.0, 4096: 0.5}, "holds", id="faster-from-512"),
        pytest.param({512: 1.2, 4096: 0.5}, "partly", id="slower-at-512"),
        pytest.param({512: 1.2, 4096: 1.5}, "fails", id="never-faster"),
    ],
)
def test_break_even_512_on_fixture(registry, ours_ms, expected):
    rows = []
    for n, ms in ours_ms.items():
        rows += [_row("naive", mode="bwd", seqlen_q=n, seqlen_k=n, ms_median=1.0),
                 _row("ours-fa2", mode="bwd", seqlen_q=n, seqlen_k=n, ms_median=ms)]  # fmt: skip
    row = _measured_row(_audit_one(registry, "break-even-512", _ctx(rows)))
    assert row["verdict"] == expected


@pytest.mark.parametrize(
    "fa1_ms, expected",
    [
        # ratios 1.5 and 2.5: median 2.0 (tolerance 25%: 1.5–2.5)
        pytest.param((1.5, 2.5), "holds", id="median-2"),
        pytest.param((1.2, 1.4), "fails", id="median-1.3"),
    ],
)
def test_fa2_vs_fa1_on_fixture(registry, fa1_ms, expected):
    rows = []
    for n, ms in zip((1024, 4096), fa1_ms, strict=True):
        rows += [_row("ours-fa1", seqlen_q=n, seqlen_k=n, ms_median=ms),
                 _row("ours-fa2", seqlen_q=n, seqlen_k=n, ms_median=1.0)]  # fmt: skip
    row = _measured_row(_audit_one(registry, "fa2-vs-fa1", _ctx(rows)))
    assert row["verdict"] == expected


def test_fa1_mfu_is_a_fraction_of_this_gpus_peak(registry):
    # H200 dense fp16 peak 989.4 TFLOP/s: 296.8 TF/s ≈ 30.0%, 445 ≈ 45.0%
    rows = [_row("ours-fa1", tflops=300.0), _row("ours-fa1", seqlen_q=4096, seqlen_k=4096, tflops=440.0)]
    parts = _part_rows(_audit_one(registry, "fa1-mfu", _ctx(rows)))
    assert parts["utilisation"]["verdict"] == "holds"
    assert parts["utilisation"]["observed"] == "30–44% of NVIDIA H200 SXM 141GB's peak"
    # the same shares of the A100's 312 TFLOP/s: 94.6 and 138.8, the first below "about 100–140"
    assert parts["tflops"]["verdict"] == "partly"
    assert parts["tflops"]["observed"] == "95–139 TFLOP/s at the same share of the A100's 312"


@pytest.mark.parametrize(
    "eager_ms, expected",
    [
        pytest.param((1.1, 1.0), "holds", id="lazy-never-slower"),
        pytest.param((1.1, 0.9), "partly", id="lazy-slower-once"),
        pytest.param((0.9, 0.8), "fails", id="eager-faster"),
    ],
)
def test_lazy_rescale_on_fixture(registry, eager_ms, expected):
    rows = []
    for n, ms in zip((1024, 4096), eager_ms, strict=True):
        common = dict(experiment="rescale-ablation", seqlen_q=n, seqlen_k=n)
        rows += [_row("ours-fa2-eager", ms_median=ms, **common), _row("ours-fa2", ms_median=1.0, **common)]
    row = _measured_row(_audit_one(registry, "lazy-rescale", _ctx(rows)))
    assert row["verdict"] == expected


def _surface(gain) -> list[dict]:
    rows = []
    for d in (64, 128, 256):
        for n in (256, 512, 4096):
            common = dict(experiment="gain-surface", head_dim=d, seqlen_q=n, seqlen_k=n, causal=False)
            rows += [_row("naive", ms_median=gain(d, n), **common), _row("ours-fa2", ms_median=1.0, **common)]
    return rows


@pytest.mark.parametrize(
    "gain, expected",
    [
        # grows with N, shrinks with d, 1.0 at (256, 512): every part holds
        pytest.param(lambda d, n: (n / 512) * (256 / d), "holds", id="textbook"),
        # same trends but 2× at (256, 512): the 'vanishes' part fails
        pytest.param(lambda d, n: 2 * (n / 512) * (256 / d), "partly", id="no-vanishing"),
        # shrinks with N and grows with d, 3× at (256, 512)
        pytest.param(lambda d, n: 3 * (512 / n) * (d / 256), "fails", id="reversed"),
    ],
)
def test_fa_gain_vanishes_on_fixture(registry, gain, expected):
    row = _measured_row(_audit_one(registry, "fa-gain-vanishes", _ctx(_surface(gain))))
    assert row["verdict"] == expected


def _decode_rows(fa2_ms: dict[int, float]) -> list[dict]:
    rows = []
    for nk, ms in fa2_ms.items():
        common = dict(experiment="decode", batch=1, heads=16, heads_kv=16, seqlen_q=1, seqlen_k=nk, causal=False)
        kv_bytes = 2 * 16 * nk * 128 * 2
        rows += [
            _row("ours-decode", ms_median=1.0, gbps=kv_bytes / 1e6, model_bytes=kv_bytes, **common),
            _row("ours-fa2", ms_median=ms, **common),
            _row("ours-decode-unsplit", ms_median=ms * 1.1, **common),
            _row("copy-kv", ms_median=0.5, gbps=2 * kv_bytes / 0.5e6, model_bytes=2 * kv_bytes, **common),
        ]
    return rows


@pytest.mark.parametrize(
    "fa2_ms, expected",
    [
        pytest.param({4096: 2.0, 32768: 8.0}, "holds", id="range-edges"),
        pytest.param({4096: 1.5, 32768: 6.0}, "partly", id="short-kv-below"),
        pytest.param({4096: 9.0, 32768: 12.0}, "fails", id="above"),
    ],
)
def test_flashdecoding_on_fixture(registry, fa2_ms, expected):
    row = _measured_row(_audit_one(registry, "flashdecoding", _ctx(_decode_rows(fa2_ms))))
    assert row["verdict"] == expected
    # ours moves the K/V bytes in 1 ms, the copy moves twice as many in 0.5 ms: a quarter of its bandwidth
    assert "25–25% of the measured copy bandwidth" in row["note"]


@pytest.mark.parametrize(
    "waste, varlen_ms, expected",
    [
        # 50% padding; varlen takes 0.6 of the padded time: saves 40% ≥ 0.75 × 50%
        pytest.param(0.5, 0.6, "holds", id="waste-removed"),
        # 50% padding but varlen saves only 10%
        pytest.param(0.5, 0.9, "partly", id="not-removed"),
        # 20% padding (outside 30–70%) and only 5% saved
        pytest.param(0.2, 0.95, "fails", id="little-waste"),
    ],
)
def test_varlen_waste_on_fixture(registry, waste, varlen_ms, expected):
    common = dict(experiment="varlen", batch=16, seqlen_q=4096, seqlen_k=4096, pad_waste=waste, tokens=20000)
    rows = [_row("ours-fa2-padded", ms_median=1.0, **common), _row("ours-varlen", ms_median=varlen_ms, **common)]
    row = _measured_row(_audit_one(registry, "varlen-waste", _ctx(rows)))
    assert row["verdict"] == expected
    assert f"wastes {100 * waste:.0f}%" in row["observed"]


@pytest.mark.parametrize(
    "times, expected",
    [
        pytest.param({"64,64": 1.0, "128,128": 1.5, "64,32": 2.0}, "holds", id="64x64-best"),
        pytest.param({"64,64": 1.2, "128,128": 1.0, "64,32": 2.0}, "fails", id="128x128-best"),
    ],
)
def test_block_64_on_fixture(registry, times, expected):
    rows = []
    for tile, ms in times.items():
        m, n = tile.split(",")
        cfg = f"BLOCK_M={m},BLOCK_N={n},num_warps=4,num_stages=2"
        rows.append(_row("ours-fa2", experiment="block-sweep", ms_median=ms, kernel_config=cfg))
    row = _measured_row(_audit_one(registry, "block-64", _ctx(rows)))
    assert row["verdict"] == expected
    assert "worst 64×32" in row["note"]


def test_fa3_util_compares_the_best_measured_kernel(registry):
    # without our FA-3: 791.5 / 989.4 = 80%, the best kernel (cuDNN) is inside 75–85%; ours at 50% alongside
    rows = [_row("sdpa-cudnn", tflops=791.5), _row("ours-fa2", tflops=494.7), _row("naive", mode="bwd", tflops=900.0)]
    parts = _part_rows(_audit_one(registry, "fa3-util", _ctx(rows)))
    assert parts["utilisation"]["verdict"] == "holds"
    assert parts["utilisation"]["observed"].startswith("80% of the 989.4 TFLOP/s peak (sdpa-cudnn")
    # 791.5 TFLOP/s is more than 5% above the asserted ≈750
    assert parts["tflops"]["verdict"] == "fails" and parts["tflops"]["observed"] == "792 TFLOP/s (sdpa-cudnn)"
    note = parts["tflops"]["note"]
    assert "ours-fa2 50%" in note and "has no rows here" in note


def test_fa3_util_judges_our_fa3_kernel_when_it_ran(registry):
    # 618.4 / 989.4 = 62.5% (printed 63%): our FA-3 below 75% fails, even where cuDNN is faster or inside the range
    rows = [_row("ours-fa3", tflops=618.4), _row("sdpa-cudnn", tflops=791.5), _row("ours-fa2", tflops=494.7)]
    parts = _part_rows(_audit_one(registry, "fa3-util", _ctx(rows)))
    assert parts["utilisation"]["verdict"] == "fails" and parts["tflops"]["verdict"] == "fails"
    assert parts["utilisation"]["observed"].startswith("63% of the 989.4 TFLOP/s peak (ours-fa3)")
    assert "sdpa-cudnn 80%" in parts["tflops"]["note"] and "ours-fa2 50%" in parts["tflops"]["note"]


def test_online_softmax_emulation_half_stands_without_tables(registry):
    df = _audit_one(registry, "online-softmax", Context())
    assert len(df) == 1
    row = df.iloc[0]
    assert row["gpu"] == audit.ANALYTIC
    # exact with the rescale; without it identical at one block but ~20% off from the second block on
    assert row["verdict"] == "partly"
    assert "online_softmax_attention" in row["evidence"]


@pytest.mark.parametrize("status, expected", [("ok", "holds"), ("mismatch", "fails")])
def test_online_softmax_measured_half_reads_our_rows(registry, status, expected):
    row = _measured_row(
        _audit_one(registry, "online-softmax", _ctx([_row("ours-fa2"), _row("ours-fa2", status=status)]))
    )
    assert row["verdict"] == expected


@pytest.mark.parametrize(
    "bwd_ms, a_verdict, b_verdict",
    [
        # recompute = bwd/5 = 0.6 ms: +0.6/3.4 = 17.6% over a step without it (a: 15–20%); 0.6/4 = 15% of it
        pytest.param(3.0, "holds", "fails", id="bwd-3x"),
        # bwd 9 ms: 1.8/8.2 = 22.0% (above a's range); 1.8/10 = 18% (below b's)
        pytest.param(9.0, "fails", "fails", id="bwd-9x"),
    ],
)
def test_recompute_measured_share_on_fixture(registry, bwd_ms, a_verdict, b_verdict):
    rows = [_row("ours-fa2", ms_median=1.0), _row("ours-fa2", mode="bwd", ms_median=bwd_ms)]
    rows.append(_row("ours-fa2", mode="bwd", seqlen_q=4096, seqlen_k=4096, ms_median=100.0))  # no forward: unused
    assert _measured_row(_audit_one(registry, "recompute-flops-a", _ctx(rows)))["verdict"] == a_verdict
    assert _measured_row(_audit_one(registry, "recompute-flops-b", _ctx(rows)))["verdict"] == b_verdict


def test_recompute_measured_share_needs_both_passes(registry):
    row = _measured_row(_audit_one(registry, "recompute-flops-a", _ctx([_row("ours-fa2")])))
    assert row["verdict"] == "untestable"
    assert "both forward and backward" in row["note"]


# ---------------------------------------------------------------------------------------------------
# FP8 attention claims
# ---------------------------------------------------------------------------------------------------


def _fp8_speed_rows(fp8_mm=1440.0, bf16_mm=790.0, ours_ms=0.65, fa2_ms=1.0):
    common = dict(experiment="fp8-speed", dtype="bfloat16", seqlen_q=4096, seqlen_k=4096, causal=False)
    return [_row("fp8-mm", tflops=fp8_mm, **common), _row("bf16-mm", tflops=bf16_mm, **common),
            _row("ours-fp8-block", ms_median=ours_ms, tflops=700.0, **common),
            _row("ours-fa2", ms_median=fa2_ms, tflops=470.0, **common)]  # fmt: skip


@pytest.mark.parametrize("fp8_mm, expected", [(1580.0, "holds"), (1440.0, "partly"), (700.0, "fails")])
def test_fp8_2pf_measured_gemm_ratio(registry, fp8_mm, expected):
    df = _audit_one(registry, "fp8-2pf", _ctx(_fp8_speed_rows(fp8_mm=fp8_mm)))
    assert df[df["gpu"] == audit.ANALYTIC].iloc[0]["verdict"] == "holds"  # the datasheet's 1979 ≈ 2000
    row = _measured_row(df)
    assert row["verdict"] == expected
    assert f"{fp8_mm / 790:.2f}×" in row["observed"]
    assert "1.54×" in row["note"]  # attention: 1.0 / 0.65


def _acc_row(impl, rms, inputs="normal", under=math.nan, mass=math.nan, n=8192):
    return _row(impl, experiment="fp8-accuracy", timed=False, ms_median=math.nan, tflops=math.nan, rms_err=rms,
                inputs=inputs, p_underflow=under, p_mass_lost=mass, seqlen_q=n, seqlen_k=n)  # fmt: skip


@pytest.mark.parametrize(
    "p1_rms, p1_under, expected",
    [(2.0e-2, 0.3, "holds"), (1.01e-2, 0.3, "partly"), (1.0e-2, 0.0, "fails")],
    ids=["costs-accuracy", "underflow-harmless", "no-underflow"],
)
def test_fp8_accuracy_measured(registry, p1_rms, p1_under, expected):
    rows = [
        _acc_row("ours-fa2", 1e-4),
        _acc_row("ours-fp8-block", 1.0e-2, under=0.0, mass=0.0),
        _acc_row("ours-fp8-block-p1", p1_rms, under=p1_under, mass=1e-4),
        _acc_row("ours-fp8-block-p1", 5e-1, under=0.0, mass=0.0, n=1024),
    ]  # fmt: skip  (smaller N: ignored)
    df = _audit_one(registry, "fp8-accuracy", _ctx(rows))
    assert df[df["gpu"] == audit.ANALYTIC].iloc[0]["verdict"] == "holds"  # 2⁻⁹
    assert _measured_row(df)["verdict"] == expected
    assert "N(0,1) inputs" in _measured_row(df)["note"]
    # with FlashAttention-3's outlier rows present, those are judged (here an underflow that costs accuracy)
    outliers = [dict(r, inputs="outliers") for r in rows[:2]]
    outliers.append(dict(_acc_row("ours-fp8-block-p1", 3.0e-2, under=0.4, mass=1e-2), inputs="outliers"))
    row = _measured_row(_audit_one(registry, "fp8-accuracy", _ctx(rows + outliers)))
    assert row["verdict"] == "holds" and "outlier" in row["note"]


def test_fp8_accuracy_without_rows_keeps_the_analytic_verdict_and_marks_gpu_untestable(registry):
    df = _audit_one(registry, "fp8-accuracy", _ctx([_row("ours-fa2")]))
    assert _measured_row(df)["verdict"] == "untestable"


@pytest.mark.parametrize(
    "normal, large, expected",
    [((3e-2, 1e-2), (5e-1, 1e-2), "holds"), ((1e-2, 1e-2), (5e-1, 1e-2), "partly"),
     ((1e-2, 1e-2), (1e-2, 1e-2), "fails")],
    ids=["always", "only-large", "never"],
)  # fmt: skip
def test_fp8_scales(registry, normal, large, expected):
    rows = [
        _acc_row("ours-fp8-none", normal[0]),
        _acc_row("ours-fp8-tensor", normal[1]),
        _acc_row("ours-fp8-none", large[0], inputs="large"),
        _acc_row("ours-fp8-tensor", large[1], inputs="large"),
    ]
    row = _measured_row(_audit_one(registry, "fp8-scales", _ctx(rows)))  # fmt: skip
    assert row["verdict"] == expected
    assert "large" in row["observed"]


def test_fp8_scales_untestable_without_large_inputs(registry):
    rows = [_acc_row("ours-fp8-none", 1e-2), _acc_row("ours-fp8-tensor", 1e-2)]
    assert _measured_row(_audit_one(registry, "fp8-scales", _ctx(rows)))["verdict"] == "untestable"


# ---------------------------------------------------------------------------------------------------
# (5) Borderline verdicts: the p20–p80 band of the timings
# ---------------------------------------------------------------------------------------------------


def _band_rows(spread_fp8: float, spread_bf16: float = 0.01):
    """The FP8/bf16 GEMM ratio 1940/1000 = 1.94× against the datasheet's 2.0× ± 2%: partly at the medians.
    ``spread``: how far p20 and p80 lie from the median time (a fraction of it)."""
    common = dict(experiment="fp8-speed", dtype="bfloat16", seqlen_q=4096, seqlen_k=4096, causal=False)
    return [
        _row("fp8-mm", tflops=1940.0, ms_median=1.0, ms_p20=1 - spread_fp8, ms_p80=1 + spread_fp8, **common),
        _row("bf16-mm", tflops=1000.0, ms_median=1.0, ms_p20=1 - spread_bf16, ms_p80=1 + spread_bf16, **common),
    ]


def test_a_verdict_that_flips_inside_the_band_is_borderline(registry):
    """The GEMM ratio moves from 1.94 towards 2.28 when the FP8 GEMM's time goes to its p20: it crosses
    the holds window (1.96–2.04) on the way, though both ends are partly; borderline, band both verdicts."""
    row = _measured_row(_audit_one(registry, "fp8-2pf", _ctx(_band_rows(spread_fp8=0.15))))
    assert row["verdict"] == "partly"
    assert bool(row["borderline"])
    assert row["band"] == "holds, partly"


def test_a_verdict_that_stays_inside_the_band_is_not_borderline(registry):
    row = _measured_row(_audit_one(registry, "fp8-2pf", _ctx(_band_rows(spread_fp8=0.001, spread_bf16=0.001))))
    assert row["verdict"] == "partly" and not row["borderline"] and row["band"] == "partly"


def test_the_band_needs_no_evaluator_of_its_own(registry):
    """The same generic re-judging flags a ratio of two implementations when only their spreads (not
    their medians) differ, and leaves a verdict that reads no timing alone, however wide the band."""
    common = dict(experiment="fp8-speed", dtype="bfloat16", seqlen_q=4096, seqlen_k=4096, causal=False)
    rows = _band_rows(spread_fp8=0.001, spread_bf16=0.15)  # now the bf16 GEMM is the noisy one
    row = _measured_row(_audit_one(registry, "fp8-2pf", _ctx(rows)))
    assert row["borderline"] and row["band"] == "holds, partly"
    wide = [_row(i, ms_p20=0.1, ms_p80=10.0, dtype="float16", **{k: v for k, v in common.items() if k != "dtype"})
            for i in ("ours-fa2", "sdpa-flash")]  # fmt: skip
    wide = [{**r, "experiment": "fa2-setting"} for r in wide]
    tol = _measured_row(_audit_one(registry, "fp16-tolerance", _ctx(wide)))
    assert not tol["borderline"] and tol["band"] == tol["verdict"]


def test_analytic_and_untestable_rows_have_no_band(registry):
    df = audit.audit([registry["std-flops"], registry["fp8-2pf"]], Context())
    assert (df["band"] == "").all() and not df["borderline"].any()


def test_same_data_same_verdicts_and_bands(registry):
    ctx = _ctx(_band_rows(spread_fp8=0.15))
    claims = [registry["fp8-2pf"], registry["fa2-mfu.utilisation"], registry["fa2-mfu.tflops"], registry["std-mfu"]]
    first, second = audit.audit(claims, ctx), audit.audit(claims, ctx)
    pd.testing.assert_frame_equal(first, second)


def test_the_shipped_fp8_ratio_is_borderline(full):
    """H200 runs have put fp8-2pf on both sides of its 2% tolerance (1.94×, 1.96× against 1.97×): whichever
    side the shipped medians fall on, the band says the verdict sits on the edge. Most verdicts do not move."""
    row = full[(full["claim_id"] == "fp8-2pf") & (full["gpu"] == "h200")].iloc[0]
    assert row["borderline"] and row["band"] == "holds, partly" and row["verdict"] in ("holds", "partly")
    measured = full[full["gpu"] == "h200"]
    assert 1 <= int(measured["borderline"].sum()) < len(measured) // 4
    assert (full.loc[~full["borderline"], "band"].isin(["", *audit.VERDICTS])).all()


def test_band_levels_cover_p20_to_p80():
    df = pd.DataFrame({"impl": ["a"], "ms_median": [2.0], "ms_p20": [1.0], "ms_p80": [4.0], "tflops": [10.0],
                       "gbps": [5.0]})  # fmt: skip
    lows = audit._at_levels(df, pd.Series([0.0]).to_numpy())
    highs = audit._at_levels(df, pd.Series([1.0]).to_numpy())
    mid = audit._at_levels(df, pd.Series([0.5]).to_numpy())
    assert lows["ms_median"].iloc[0] == 1.0 and highs["ms_median"].iloc[0] == 4.0 and mid["ms_median"].iloc[0] == 2.0
    assert lows["tflops"].iloc[0] == 20.0 and highs["gbps"].iloc[0] == 2.5  # per median time: scaled with it
    assert audit.BAND_LEVELS[0] == 0.0 and audit.BAND_LEVELS[-1] == 1.0
