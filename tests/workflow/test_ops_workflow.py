"""The W4A16 and MoE rules: one GPU job per ops shard, nothing measured without a GPU."""

from __future__ import annotations

import re
from pathlib import Path

from snakemake_helpers import job_counts, snakemake

from analysis.experiments import grid, ops_grid

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "workflow" / "config.yaml"


def test_dry_run_for_a_named_gpu_plans_one_ops_job_per_shard(tmp_path):
    r = snakemake("-n", "--cores", "1", "--config", "gpus=[h200]", f"results_dir={tmp_path}",
                  f"report={tmp_path}/report.html")  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    counts = job_counts(r.stdout)
    shards = ops_grid.ops_shards(grid.load_config([CONFIG]))
    assert counts["ops_benchmark"] == len(shards) == 7
    assert set(re.findall(r"wildcards: gpu=h200, opshard=(\S+)", r.stdout)) == set(shards)
    assert counts["ops_collect"] == 1 and counts["ops_figures"] == 1
    # the audit and the report read the ops table and its figures
    audit_job = r.stdout[r.stdout.index("rule audit:") :].split("\n\n")[0]
    assert f"{tmp_path}/h200/ops.csv" in audit_job
    report_job = r.stdout[r.stdout.index("rule report:") :].split("\n\n")[0]
    assert f"{tmp_path}/report/ops/h200" in report_job


def test_disabled_ops_sections_plan_no_ops_jobs(tmp_path):
    off = tmp_path / "off.yaml"
    off.write_text("quant: {enabled: false}\nmoe: {enabled: false}\n")
    r = snakemake("-n", "--cores", "1", "--configfile", str(off), "--config", "gpus=[h200]",
                  f"results_dir={tmp_path}", f"report={tmp_path}/report.html")  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    counts = job_counts(r.stdout)
    assert "ops_benchmark" not in counts and "ops_figures" not in counts


def test_cpu_dry_run_measures_no_ops(tmp_path):
    r = snakemake("-n", "--cores", "1", "--profile", "workflow/profiles/cpu", "--config", f"results_dir={tmp_path}",
                  f"report={tmp_path}/report.html")  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    counts = job_counts(r.stdout)
    assert "ops_benchmark" not in counts and "ops_collect" not in counts
    assert counts["audit"] == 1 and counts["report"] == 1
