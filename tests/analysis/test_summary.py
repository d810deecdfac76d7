"""The measured summaries: ``reports/reference/<gpu>/summary.md`` and the README's measured table are what the
shipped tables give now (``analysis.summary``), so no measured number is typed into the prose."""

from __future__ import annotations

import shutil

import pytest

from analysis import registry, summary
from analysis.core.paths import ROOT

REFERENCE = ROOT / "reports" / "reference"
SHIPPED = sorted(p.parent for p in REFERENCE.glob("*/environment.json"))
README = ROOT / "README.md"


@pytest.mark.parametrize("folder", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_summary_is_generated_from_its_tables(folder):
    assert (folder / "summary.md").read_text(encoding="utf-8") == summary.markdown(folder), (
        f"{folder / 'summary.md'} is stale: python -m analysis.summary {folder.relative_to(ROOT)} > it "
        "(or snakemake summaries)"
    )


def test_the_readme_table_is_the_generated_one():
    text = README.read_text(encoding="utf-8")
    assert summary.measured_blocks(text), "the README has no measured table (<!-- measured: <folder> -->)"
    assert summary.readme(text, ROOT) == text, "the README's measured table is stale: snakemake readme"


def test_a_typed_in_number_is_replaced_by_the_measured_one():
    folder = SHIPPED[0].relative_to(ROOT)
    text = f"intro\n<!-- measured: {folder} -->\n| x | 9.99× |\n<!-- /measured -->\nafter\n"
    out = summary.readme(text, ROOT)
    assert "9.99×" not in out and out.startswith("intro\n") and out.endswith("<!-- /measured -->\nafter\n")
    assert summary.readme_block(ROOT / folder) in out


def test_the_summary_follows_the_tables(tmp_path):
    """Another table gives another summary: a set whose attention rows are all 10% slower reports lower
    throughput."""
    src = SHIPPED[0]
    for name in ("environment.json", "attention.csv"):
        shutil.copy(src / name, tmp_path / name)
    table = registry.table("attention")
    df = table.read_rows([tmp_path / "attention.csv"])
    slower = df.assign(
        ms_median=df["ms_median"] * 1.1, ms_p20=df["ms_p20"] * 1.1, ms_p80=df["ms_p80"] * 1.1, tflops=df["tflops"] / 1.1
    )
    table.write_rows(slower.to_dict("records"), tmp_path / "attention.csv")
    before, after = summary.markdown(src), summary.markdown(tmp_path)
    assert after != before and "## Attention" in after and "## W4A16" not in after
