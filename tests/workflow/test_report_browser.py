"""The rendered report in a real headless browser (Debian's Chromium): it loads without errors, every
figure decodes, the verdict table has a row for every claim of the registry, the first screen says where the
numbers come from, the articles' math is drawn as MathML, and no table cell breaks a word at 1280 px.

The report is rendered from the shipped reference results through the same functions the workflow's
rules call. Chromium runs with --dump-dom: the page's own load handler writes what it saw (images
decoded, load errors, formulas laid out, and with #check-layout the words broken across lines) onto <body>,
and the dumped DOM is read back here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from analysis import pipeline, registry
from analysis.report import quote_math

ROOT = Path(__file__).resolve().parents[2]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def browser() -> str:
    for name in BROWSERS:
        exe = shutil.which(name)
        if exe:
            return exe
    if os.environ.get("CI"):
        pytest.fail("CI must run this test: install Debian's chromium (.ci/run does)")
    pytest.skip("no Chromium on this machine (apt-get install chromium)")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    shipped = sorted(p.parent.name for p in (ROOT / "reports" / "reference").glob("*/attention.csv"))
    assert shipped, "no shipped reference results to render"
    gpus, audited = [], {}
    for g in shipped:
        folder = ROOT / "reports" / "reference" / g
        tables = {t: folder / f"{t}.csv" for t in registry.tables() if (folder / f"{t}.csv").is_file()}
        figures = []
        for fam in registry.FAMILIES.values():  # every family's figures of the tables the set has
            if fam.scope == "gpu" and fam.has("figures") and fam.table in tables:
                pipeline.render_figures(fam.name, tables[fam.table], out / "figures" / g / fam.name)
                figures.append(out / "figures" / g / fam.name)
        gpus.append(
            {
                "slug": g,
                "source": f"shipped reference results (reports/reference/{g}/)",
                "tables": tables,
                "environment": folder / "environment.json",
                "figures": figures,
            }
        )
        for t, path in tables.items():
            audited.setdefault(t, {})[g] = path
    pipeline.run_audit(audited, out / "verdicts.csv")
    html = pipeline.render_report(gpus, None, out / "report.html", out / "verdicts.csv")
    return html, out


def dump_dom(html: Path, fragment: str = "", width: int = 1280) -> str:
    """The DOM after load, in a window ``width`` pixels wide, with ``fragment`` appended to the address."""
    args = [
        browser(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={html.parent / 'chromium-profile'}",
        "--virtual-time-budget=15000",
        f"--window-size={width},900",
        "--dump-dom",
        html.as_uri() + fragment,
    ]
    r = subprocess.run(args, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def body_attr(dom: str, name: str) -> str:
    m = re.search(rf'<body[^>]*\b{name}="([^"]*)"', dom)
    assert m, f"the page's load handler did not set {name} (did the page finish loading?)"
    return m.group(1)


def test_report_loads_and_every_figure_renders(rendered):
    html, out = rendered
    dom = dump_dom(html)
    figures = sum(1 for _ in out.glob("figures/*/*/*.png"))
    assert figures > 0
    assert int(body_attr(dom, "data-load-errors")) == 0
    thumbs = len(re.findall(r'<img class="thumb"', dom))  # the first screen's thumbnails of those figures
    assert thumbs > 0
    assert int(body_attr(dom, "data-images")) == figures + thumbs
    assert int(body_attr(dom, "data-images-rendered")) == figures + thumbs


def test_verdict_table_has_every_claim(rendered):
    html, _ = rendered
    dom = dump_dom(html)
    ids = set(re.findall(r'<tr [^>]*class="claim-row" data-claim="([^"]+)"', dom))
    assert ids == {c.id for c in registry.claims()}


def test_nothing_is_wider_than_a_1280_pixel_window(rendered):
    html, _ = rendered
    dom = dump_dom(html, width=1280)
    inner = int(body_attr(dom, "data-inner-width"))
    assert inner == 1280
    assert int(body_attr(dom, "data-scroll-width")) <= inner


def page_text(dom: str) -> str:
    """The DOM's text: tags removed (a word kept whole is in a <span>), entities decoded."""
    import html as html_lib

    return html_lib.unescape(re.sub(r"<[^>]*>", "", dom))


def test_every_claim_shows_its_statement_and_the_quotes_render_in_the_embedded_font(rendered):
    page, _ = rendered
    dom = dump_dom(page)
    text = page_text(dom)
    for claim in registry.claims():
        assert claim.statement in text, claim.id
        assert all(q.text in text for q in claim.quotes), claim.id  # a formula's LaTeX is folded beside it
    # the page's load handler found the embedded faces, loaded them, and they cover every quote's characters
    assert body_attr(dom, "data-quote-font") == "loaded"
    assert body_attr(dom, "data-math-font") == "loaded"


def test_every_quote_holding_latex_is_drawn_as_mathml(rendered):
    html, out = rendered
    dom = dump_dom(html)
    by_id = registry.claims().by_id()
    verdicts = pd.read_csv(out / "verdicts.csv", keep_default_na=False)
    # one claims-table row per verdict row, each with its claim's quotes
    want = sum(quote_math.holds_latex(q.text) for c in verdicts["claim_id"] for q in by_id[c].quotes)
    assert want > 0
    assert int(body_attr(dom, "data-tex-quotes")) == want
    # each laid out by the browser's MathML (a math box, fractions stacked), none left as LaTeX text
    assert int(body_attr(dom, "data-tex-quotes-math")) == want
    shown = re.sub(r'<details class="tex">.*?</details>', "", dom, flags=re.S)  # the LaTeX source folded beside
    assert dom.count("<math ") >= want and "\\frac" not in shown and "\\text{" not in shown


def test_the_first_screen_says_where_each_gpu_types_numbers_come_from(rendered):
    html, _ = rendered
    dom = dump_dom(html)
    top = dom[: dom.index('id="summary"')]
    for g in sorted(p.parent.name for p in (ROOT / "reports" / "reference").glob("*/attention.csv")):
        folder = ROOT / "reports" / "reference" / g
        files = [folder / f"{t}.csv" for t in registry.tables() if (folder / f"{t}.csv").is_file()]
        rows = pd.concat([pd.read_csv(f) for f in files], ignore_index=True)
        line = re.search(rf'<li class="origin-gpu" data-gpu="{g}" data-shipped="true">(.*?)</li>', top)
        assert line, f"no first-screen line for {g}"
        text = page_text(line.group(1))
        assert "the shipped result set, not measured by this run" in text, text
        sha, day = rows["git_sha"].mode()[0], str(rows["timestamp"].min())[:10]
        assert f"{len(rows)} rows measured at commit {sha[:12]}" in text and day in text, text


def test_no_table_cell_breaks_a_word_at_1280_px(rendered):
    """Every table (figure tables, summaries, failures, claims) with every folded part open: no word of a
    cell is split across lines or sticks out of its cell (a wide formula scrolls in its own box)."""
    html, _ = rendered
    dom = dump_dom(html, fragment="#check-layout", width=1280)
    assert int(body_attr(dom, "data-layout-words")) > 10000  # the figure tables' cells were open and measured
    bad = int(body_attr(dom, "data-layout-bad"))
    assert bad == 0, f"{bad} words broken or outside their cell, e.g. {body_attr(dom, 'data-layout-examples')}"


@pytest.mark.parametrize("preset", ["verdict:fails", "topic:fa3,kind:measured"])
def test_the_filter_shows_exactly_the_matching_rows(rendered, preset):
    html, out = rendered
    verdicts = pd.read_csv(out / "verdicts.csv", keep_default_na=False)
    texts = registry.claims().by_id()
    want = pd.Series(True, index=verdicts.index)
    for kv in preset.split(","):
        key, value = kv.split(":")
        if key == "topic":
            want &= verdicts["claim_id"].map(lambda c: texts[c].topic) == value
        elif key == "kind":
            want &= verdicts["kind"].str.split(", ").map(lambda ks, v=value: v in ks)
        else:
            want &= verdicts[key] == value
    assert 0 < int(want.sum()) < len(verdicts)
    dom = dump_dom(html, fragment=f"#filter={preset}")
    assert int(body_attr(dom, "data-claims-shown")) == int(want.sum())
    assert int(body_attr(dom, "data-claims-shown")) < len(verdicts)
