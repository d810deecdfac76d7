"""The claims as the report shows them: display fields from the claim files (the same Claim objects the audit
judges), rows by topic, the first screen, the filters, the embedded font for the quotes, and where each
section's rows come from."""

from __future__ import annotations

import copy

import pandas as pd
import pytest
import yaml

from analysis import audit, registry
from analysis.report import claims as claims_view
from analysis.report import provenance as section_provenance
from analysis.report import quote_font


@pytest.fixture(scope="module")
def registry_data() -> dict:
    return yaml.safe_load(audit.REGISTRY.read_text(encoding="utf-8"))


def _write(tmp_path, data) -> str:
    path = tmp_path / "registry.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return str(path)


def test_every_claim_has_a_topic_quote_and_english_section():
    claims = registry.claims()
    for c in claims:
        assert c.topic in claims.topics and c.topic_title == claims.topics[c.topic] and c.quotes and c.where
        assert all(q.text and q.title for q in c.quotes)
    assert set(claims.topics) == {c.topic for c in claims}  # no topic is left empty
    headline_topics = {c.topic for c in claims if c.headline}
    assert headline_topics == set(claims.topics)  # the first screen answers for every topic


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("topic", "'topic' is a required property"),
        ("quote", "'quote' is a required property"),
        ("section_en", "'section_en' is a required property"),
    ],
)
def test_a_claim_missing_a_display_field_is_named(tmp_path, registry_data, field, message):
    data = copy.deepcopy(registry_data)
    claim = data["claims"][3]
    if field == "section_en":
        del claim["source"]["section_en"]
    else:
        del claim[field]
    with pytest.raises(ValueError, match=f"claim '{claim['id']}'.*{message}"):
        audit.load_claims(registry.evaluators(), path=_write(tmp_path, data))


def test_an_undeclared_topic_is_named(tmp_path, registry_data):
    data = copy.deepcopy(registry_data)
    data["claims"][3]["topic"] = "no-such-topic"
    with pytest.raises(ValueError, match=f"claim '{data['claims'][3]['id']}': topic 'no-such-topic' is not one of"):
        audit.load_claims(registry.evaluators(), path=_write(tmp_path, data))


def _verdicts(rows: list[dict]) -> pd.DataFrame:
    base = {c: "" for c in audit.COLUMNS}
    return pd.DataFrame([{**base, "kind": "measured", "tolerance": "t", "borderline": False, **r} for r in rows])


def test_rows_come_in_topic_order_and_unknown_claims_are_refused():
    texts = registry.claims()
    df = _verdicts(
        [
            {"claim_id": "w4-bandwidth", "verdict": "holds", "gpu": "h200", "figure": "w4a16_speedup"},
            {"claim_id": "mem-64k.standard", "verdict": "holds", "gpu": "-", "evidence": "model"},
            {"claim_id": "flashinfer", "verdict": "untestable", "gpu": "-", "evidence": claims_view.NO_EXPERIMENT},
        ]
    )
    rows = claims_view.claim_rows(df, texts, {"h200"})
    assert [r["claim_id"] for r in rows] == ["mem-64k.standard", "flashinfer", "w4-bandwidth"]
    assert rows[2]["link"] == "#fig-h200-w4a16_speedup" and rows[0]["link"] == ""
    assert claims_view.claim_rows(df, texts, set())[2]["link"] == ""  # no figure of that GPU in the report
    # a claim without an experiment says so in words, not with the audit's token
    assert rows[1]["evidence"] == "" and rows[1]["observed"] == "no experiment measures it"
    assert rows[0]["gpu"] == "any (analytic)"
    with pytest.raises(ValueError, match="verdict row 0: claim 'no-such-claim' is not in the registry"):
        claims_view.claim_rows(_verdicts([{"claim_id": "no-such-claim", "verdict": "holds", "gpu": "-"}]), texts, set())


def test_headlines_prefer_the_measured_row_and_carry_thumbnails(tmp_path):
    from PIL import Image

    png = tmp_path / "fig.png"
    Image.new("RGB", (1200, 600), "white").save(png)
    texts = registry.claims()
    by_id = texts.by_id()
    assert by_id["fa1-speed-mem.speed"].headline and not by_id["fa1-blocks"].headline
    df = _verdicts(
        [
            {"claim_id": "fa1-speed-mem.speed", "verdict": "holds", "gpu": "-"},
            {"claim_id": "fa1-speed-mem.speed", "verdict": "fails", "gpu": "h200", "figure": "fa1_figure3"},
            {"claim_id": "fa1-blocks", "verdict": "holds", "gpu": "-"},
            {"claim_id": "mem-64k.standard", "verdict": "holds", "gpu": "-"},
        ]
    )
    groups = claims_view.headlines(claims_view.claim_rows(df, texts, {"h200"}), {("h200", "fa1_figure3"): png})
    assert [g["topic"] for g in groups] == ["memory", "fa1"]
    (fa1,) = groups[1]["rows"]
    assert fa1["verdict"] == "fails" and fa1["thumb"].startswith("data:image/png;base64,")
    assert groups[0]["rows"][0]["thumb"] == ""  # no figure behind an analytic claim
    with Image.open(png) as im:
        assert im.width == 1200
    small = claims_view.thumbnail(png)
    import base64
    import io

    with Image.open(io.BytesIO(base64.b64decode(small.split(",", 1)[1]))) as im:
        assert im.size == (claims_view.THUMB_WIDTH, claims_view.THUMB_WIDTH // 2)


def test_filters_offer_the_values_present():
    texts = registry.claims()
    df = _verdicts(
        [
            {"claim_id": "fa2-mfu.utilisation", "verdict": "partly", "gpu": "h200", "kind": "measured, transfer"},
            {"claim_id": "std-flops", "verdict": "holds", "gpu": "-", "kind": "analytic"},
        ]
    )
    f = claims_view.filters(claims_view.claim_rows(df, texts, set()))
    assert f == {
        "verdict": ["holds", "partly"],
        "topic": ["fa2", "arithmetic"],
        "kind": ["analytic", "measured", "transfer"],
    }


def test_the_committed_font_holds_every_quoted_wide_character():
    text = quote_font.quoted_text()
    wide = {ch for ch in quote_font.characters(text) if quote_font.needs_font(ch)}
    assert len(wide) > 100  # the quotes are Chinese
    assert quote_font.missing(text) == set(), "regenerate the font: python -m analysis.report.quote_font --source ..."
    assert "龘" not in text and quote_font.missing("龘") == {"龘"}  # the subset holds the quotes' characters only
    assert not quote_font.needs_font("x") and quote_font.needs_font("显") and quote_font.needs_font("，")
    face = quote_font.css_face()
    assert face.startswith("@font-face") and quote_font.FAMILY in face and "data:font/woff;base64," in face


def test_an_absent_font_file_embeds_nothing_and_misses_every_wide_character(tmp_path):
    absent = tmp_path / "none.woff"
    assert quote_font.css_face(absent) == ""
    assert quote_font.missing("显存 ok", absent) == {"显", "存"}


def test_section_provenance_counts_rows_per_commit_and_names_the_recorded_changes():
    a, b = "a" * 40, "b" * 7 + "c" * 33
    att = pd.DataFrame({"experiment": ["fp8-speed"] * 3 + ["decode"], "git_sha": [a, b, b, a]})
    ops = pd.DataFrame({"experiment": ["w4a16"], "family": ["quant"], "git_sha": [None]})
    manifest = {"measured_code_changes": {f"{a[:12]}..{b[:12]}": ["kernels/x.py", "analysis/y.py"]}}
    got = section_provenance.describe([att, ops], "fp8-speed", manifest)
    assert got["commits"] == [(b[:12], 2), (a[:12], 1)] and got["remark"] == ""
    assert got["changes"] == [(a[:12], b[:12], "analysis/y.py, kernels/x.py")]
    short = pd.DataFrame({"experiment": ["fp8-speed", "fp8-speed"], "git_sha": [a, b[:7]]})  # a short hash
    assert section_provenance.describe([short], "fp8-speed", manifest)["changes"]
    assert section_provenance.describe([att], "decode", manifest)["remark"] == "all rows from one commit"
    assert "not recorded" in section_provenance.describe([att], "fp8-speed", None)["remark"]
    assert section_provenance.describe([att, ops], "quant", None)["commits"] == [("unknown", 1)]
    assert section_provenance.describe([att], "moe", manifest) is None


def test_a_compound_claim_shows_as_its_parts_under_the_whole_statement():
    claims = registry.claims()
    by_id = claims.by_id()
    assert "fa1-speed-mem" not in by_id
    speed, memory = by_id["fa1-speed-mem.speed"], by_id["fa1-speed-mem.memory"]
    assert speed.whole is memory.whole and speed.whole.id == "fa1-speed-mem"
    assert "10–20×" in speed.whole.statement
    assert "2–4×" in speed.statement and "10–20×" in memory.statement and speed.quotes == memory.quotes
    df = _verdicts([{"claim_id": "fa1-speed-mem.speed", "verdict": "holds", "gpu": "-"}])
    (row,) = claims_view.claim_rows(df, claims, set())
    assert row["parent"] == "fa1-speed-mem" and row["parent_statement"] == speed.whole.statement


def test_the_first_screen_counts_claims_parts_and_rows_from_the_rows():
    claims = registry.claims()
    df = _verdicts(
        [
            {"claim_id": "fa1-speed-mem.speed", "verdict": "holds", "gpu": "-"},
            {"claim_id": "fa1-speed-mem.speed", "verdict": "fails", "gpu": "h200"},
            {"claim_id": "fa1-speed-mem.speed", "verdict": "holds", "gpu": "h100"},
            {"claim_id": "fa1-speed-mem.memory", "verdict": "holds", "gpu": "h200"},
            {"claim_id": "fa1-speed-mem.memory", "verdict": "holds", "gpu": "h100"},
            {"claim_id": "std-flops", "verdict": "holds", "gpu": "-"},
        ]
    )
    got = claims_view.counting(claims_view.claim_rows(df, claims, set()))
    assert {k: v for k, v in got.items() if k != "text"} == {
        "claims": 2,
        "compound": 1,
        "parts": 3,
        "rows": 6,
        "analytic": 2,
        "measured": 4,
        "gpus": 2,
        "both": 1,
    }
    assert got["text"] == (
        "2 claims (1 of them compound, each judged as its parts: 3 parts in all) give 6 verdict rows: 2 recomputed "
        "from the models, one per part, and 4 measured, one per part and GPU type (2 GPU types in this report); "
        "1 part has rows of both kinds."
    )
    one = claims_view.counting(claims_view.claim_rows(df.iloc[[5]], claims, set()))
    assert one["text"] == (
        "1 claim (0 of them compound, each judged as its parts: 1 part in all) give 1 verdict row: 1 recomputed "
        "from the models, one per part, and 0 measured, one per part and GPU type (0 GPU types in this report)."
    )


def test_the_first_screen_counts_the_borderline_rows_of_the_measured_ones_and_says_what_that_means():
    df = _verdicts(
        [
            {"claim_id": "fa1-speed-mem.speed", "verdict": "holds", "gpu": "-"},
            {"claim_id": "fa1-speed-mem.speed", "verdict": "fails", "gpu": "h200", "band": "holds, fails"},
            {"claim_id": "fa1-speed-mem.memory", "verdict": "holds", "gpu": "h200", "band": "holds"},
            {"claim_id": "fa2-mfu.utilisation", "verdict": "untestable", "gpu": "h200", "note": "no rows"},
        ]
    )
    df["borderline"] = [False, True, False, False]
    got = claims_view.borderline(claims_view.claim_rows(df, registry.claims(), set()))
    assert (got["count"], got["judged"]) == (1, 2)  # the analytic and the untestable rows are not judged
    assert got["text"].startswith("1 of 2 measured verdict rows is borderline: judged again with every time")
    assert "p20–p80, widened to the lowest and highest median of its repeat rounds" in got["text"]


def test_the_first_screen_says_whether_a_gpu_type_was_shipped_or_measured_by_this_run():
    a, b = "a" * 40, "b" * 40
    rows = pd.DataFrame(
        {
            "experiment": ["decode"] * 3,
            "git_sha": [a, a, b],
            "timestamp": ["2026-12-02T22:13:03Z", "2026-12-02T23:00:00Z", "2026-12-04T01:00:00Z"],
        }
    )
    other = pd.DataFrame({"experiment": ["traffic"], "git_sha": [a], "timestamp": ["2026-12-03T00:00:00Z"]})
    shipped = section_provenance.origin([rows, other, None], {"published": "2026-12-05T10:00:00Z"})
    assert shipped == {
        "shipped": True,
        "rows": 4,
        "commits": [(a[:12], 3), (b[:12], 1)],
        "days": ("2026-12-02", "2026-12-04"),
        "published": "2026-12-05",
    }
    assert section_provenance.origin_text(shipped) == (
        f"the shipped result set, not measured by this run: 4 rows measured at commits {a[:12]} (3 rows), "
        f"{b[:12]} (1 row) from 2026-12-02 to 2026-12-04, published 2026-12-05"
    )
    fresh = section_provenance.origin([rows.iloc[:2]], None)
    assert (
        section_provenance.origin_text(fresh)
        == f"measured by this run: 2 rows measured at commit {a[:12]} on 2026-12-02"
    )
    unknown = section_provenance.origin([pd.DataFrame({"experiment": ["x"], "git_sha": [None]})], None)
    assert section_provenance.rows_text(unknown, "checked") == "1 row checked at an unrecorded commit"
    assert section_provenance.origin_text(section_provenance.origin([], {})) == (
        "the shipped result set, not measured by this run: no rows"
    )
