"""The cross-GPU comparison: one figure over several GPUs' tables, and its section in the report."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from analysis import pipeline, registry
from analysis.core.paths import ROOT
from analysis.families.attention import fa2_figures as figures

ATTENTION = registry.table("attention")
H200 = ROOT / "reports" / "reference" / "h200" / "attention.csv"


@pytest.fixture
def two_gpus(tmp_path) -> dict[str, Path]:
    """The shipped H200 table and a copy relabelled as an A100 at 40% of its throughput."""
    a = ATTENTION.read_rows([H200])
    b = a.assign(gpu="a100-sxm4-80gb", gpu_name="NVIDIA A100-SXM4-80GB", tflops=a["tflops"] * 0.4)
    path = tmp_path / "a100.csv"
    b.to_csv(path, index=False)
    return {"h200": H200, "a100-sxm4-80gb": path}


def test_comparison_table_uses_each_gpus_peak(two_gpus, tmp_path):
    df = pd.concat([ATTENTION.read_rows([p]) for p in two_gpus.values()], ignore_index=True)
    t = figures.gpu_comparison(df, tmp_path / "cmp.png")
    assert (tmp_path / "cmp.png").stat().st_size > 0
    assert set(t["gpu"]) == set(two_gpus)
    # only the largest N of each setting, per GPU
    assert set(t["seqlen_q"]) == {16384}
    peaks = t.groupby("gpu")["peak_tflops"].first().to_dict()
    assert peaks["a100-sxm4-80gb"] == pytest.approx(312.0)
    assert peaks["h200"] == pytest.approx(989.4, abs=1)
    row = t[(t["gpu"] == "a100-sxm4-80gb") & (t["impl"] == "ours-fa2")].iloc[0]
    assert row["fraction_of_peak"] == pytest.approx(row["tflops"] / 312.0)


def test_single_gpu_figures_still_refuse_mixed_tables(two_gpus, tmp_path):
    df = pd.concat([ATTENTION.read_rows([p]) for p in two_gpus.values()], ignore_index=True)
    with pytest.raises(ValueError, match="one GPU at a time"):
        figures.attention_tflops(df, tmp_path / "x.png")


def test_report_shows_the_comparison(two_gpus, tmp_path):
    manifest = pipeline.render_comparison("attention", two_gpus, tmp_path / "compare")
    assert [e["name"] for e in manifest] == ["gpu_comparison"]
    assert json.loads((tmp_path / "compare" / "manifest.json").read_text())[0]["png"]
    gpus = []
    shipped_env = json.loads((ROOT / "reports" / "reference" / "h200" / "environment.json").read_text())
    for slug, table in two_gpus.items():
        pipeline.render_figures("attention", table, tmp_path / slug)
        env = tmp_path / f"{slug}-environment.json"  # each GPU type's own environment (the report checks)
        env.write_text(json.dumps({**shipped_env, "gpu": slug}))
        gpus.append(
            {
                "slug": slug,
                "source": "fixture",
                "tables": {"attention": table},
                "figures": [tmp_path / slug],
                "environment": env,
            }
        )
    html = pipeline.render_report(gpus, None, tmp_path / "r.html", None, [tmp_path / "compare"]).read_text()
    assert 'id="gpu-comparison"' in html
    assert "GPU types side by side" in html
