"""The rendered report in a real headless browser (Debian's Chromium): it loads without errors, every
figure decodes, and the verdict table has a row for every claim of the registry.

The report is rendered from the shipped reference results through the same functions the workflow's
rules call. Chromium runs with --dump-dom: the page's own load handler writes what it saw (images
decoded, load errors) onto <body>, and the dumped DOM is read back here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from analysis import audit, pipeline, registry

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
        gpus.append({"slug": g, "source": f"shipped reference results (reports/reference/{g}/)", "tables": tables,
                     "environment": folder / "environment.json", "figures": figures})  # fmt: skip
        for t, path in tables.items():
            audited.setdefault(t, {})[g] = path
    pipeline.run_audit(audited, out / "verdicts.csv")
    html = pipeline.render_report(gpus, None, out / "report.html", out / "verdicts.csv")
    return html, out


def dump_dom(html: Path) -> str:
    args = [
        browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={html.parent / 'chromium-profile'}", "--virtual-time-budget=15000", "--dump-dom",
        html.as_uri(),
    ]  # fmt: skip
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
    assert int(body_attr(dom, "data-images")) == figures
    assert int(body_attr(dom, "data-images-rendered")) == figures


def test_verdict_table_has_every_claim(rendered):
    html, _ = rendered
    dom = dump_dom(html)
    ids = set(re.findall(r'<tr [^>]*class="claim-row" data-claim="([^"]+)"', dom))
    claims = {c.id for c in audit.load_claims(registry.evaluators(), registry.claim_files())}
    assert ids == claims
