"""The Snakemake workflow: it parses, lints, formats, plans the right jobs, and runs end to end on a CPU."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from snakemake_helpers import interpreter_blocker, job_counts, snakemake

from analysis import budget, configuration, registry

ROOT = Path(__file__).resolve().parents[2]
MINI = Path(__file__).with_name("mini.yaml")
CONFIG = ROOT / "workflow" / "config.yaml"


def test_dry_run_cpu_plans_interpreter_checks_and_report(tmp_path):
    r = snakemake(
        "-n",
        "--cores",
        "1",
        "--profile",
        "workflow/profiles/cpu",
        "--config",
        f"results_dir={tmp_path}",
        f"report={tmp_path}/report.html",
    )
    assert r.returncode == 0, r.stderr + r.stdout
    counts = job_counts(r.stdout)
    assert counts["interpreter_check"] == 2 * 4 * 2  # dtypes × head dims × causal of the default config
    assert counts["report"] == 1
    assert "benchmark" not in counts


def test_cpu_profile_measures_nothing_whatever_config_says(tmp_path):
    """The profile's zero GPUs survive --config (a profile's own config entries would be dropped by it),
    even one naming a GPU type."""
    r = snakemake(
        "-n",
        "--cores",
        "1",
        "--profile",
        "workflow/profiles/cpu",
        "--config",
        "gpus=[h200]",
        f"results_dir={tmp_path}",
        f"report={tmp_path}/report.html",
    )
    assert r.returncode == 0, r.stderr + r.stdout
    counts = job_counts(r.stdout)
    assert "benchmark" not in counts and "environment" not in counts
    assert counts["interpreter_check"] == 2 * 4 * 2


def test_nested_config_values_keep_their_types(tmp_path):
    """`--config` with nested keys: numbers inside mappings and lists are numbers (the schema refused
    them as strings), and the keys not named keep the config file's values."""
    nested = "attention={interpreter_check: {head_dims: [16], seqlens: [33, 65], seqlen_k: [33, 80]}, warmup_ms: 12.5}"
    types = "gpu_types={h200: {gres: '', partition: gpu}}"  # strings stay strings, the empty one too
    r = snakemake(
        "-n",
        "--cores",
        "1",
        "--profile",
        "workflow/profiles/cpu",
        "--config",
        nested,
        types,
        f"results_dir={tmp_path}",
        f"report={tmp_path}/report.html",
    )
    assert r.returncode == 0, r.stderr + r.stdout
    assert job_counts(r.stdout)["interpreter_check"] == 2 * 1 * 2  # dtypes and causal from the config file
    assert set(re.findall(r"check=check_\w+_d(\d+)_", r.stdout)) == {"16"}


def _planned_shards(stdout: str, family: str = "attention") -> set[str]:
    return set(re.findall(rf"wildcards: gpu=h200, family={family}, shard=(\S+)", stdout))


def _shards(*configs) -> dict[str, dict[str, dict]]:
    """Family -> its shards, of the config files given (after workflow/config.yaml)."""
    config = configuration.load_config([CONFIG, *configs])
    return {name: f.shards(config) for name, f in registry.FAMILIES.items() if f.scope == "gpu"}


def test_dry_run_for_a_named_gpu_plans_one_job_per_shard(tmp_path):
    r = snakemake(
        "-n", "--cores", "1", "--config", "gpus=[h200]", f"results_dir={tmp_path}", f"report={tmp_path}/report.html"
    )
    assert r.returncode == 0, r.stderr + r.stdout
    counts = job_counts(r.stdout)
    planned = _shards()
    assert counts["benchmark"] == sum(map(len, planned.values())) == 45
    for family, shards in planned.items():
        assert _planned_shards(r.stdout, family) == set(shards), family
    shards = planned["attention"]
    per_experiment = Counter(f["experiment"] for f in [*shards.values(), *planned["fp8"].values()])
    assert per_experiment == {
        "fa2-setting": 12,
        "fa1-setting": 1,
        "gain-surface": 4,
        "block-sweep": 1,
        "rescale-ablation": 1,
        "memory": 2,
        "decode": 2,
        "varlen": 2,
        "fp8-speed": 2,
        "fp8-accuracy": 8,
        "fa3-ablation": 1,
        "fp8-ablation": 1,
    }
    # the forward shards keep the names they had before modes existed (their results are reused)
    assert {"fa2-setting_float16_d128_full", "memory_float16_d128_full"} <= set(shards)
    assert {
        "fa2-setting_bfloat16_d128_causal_bwd",
        "memory_float16_d128_full_fwdbwd",
        "decode_float16_d128_full_hkv2_q1",
        "varlen_float16_d128_causal_fwdbwd",
    } <= set(shards)
    assert counts["environment"] == 1
    assert counts["collect"] == len({f.table for f in registry.FAMILIES.values() if f.scope == "gpu"})
    assert counts["figures"] == sum(1 for f in registry.FAMILIES.values() if f.scope == "gpu" and f.has("figures"))
    assert "interpreter_check" not in counts
    # the audit and the report read every table and its figures
    audit_job = r.stdout[r.stdout.index("rule audit:") :].split("\n\n")[0]
    assert all(f"{tmp_path}/h200/{t}.csv" in audit_job for t in ("attention", "ops", "traffic"))
    report_job = r.stdout[r.stdout.index("rule report:") :].split("\n\n")[0]
    assert f"{tmp_path}/report/h200/moe" in report_job


def test_full_config_plans_the_bigger_grids(tmp_path):
    full = ROOT / "workflow" / "config-full.yaml"
    r = snakemake(
        "-n",
        "--cores",
        "1",
        "--configfile",
        str(full),
        "--config",
        "gpus=[h200]",
        f"results_dir={tmp_path}",
        f"report={tmp_path}/report.html",
    )
    assert r.returncode == 0, r.stderr + r.stdout
    planned = _shards(full)
    shards = {**planned["attention"], **planned["fp8"]}
    assert len(shards) == 93
    assert job_counts(r.stdout)["benchmark"] == sum(map(len, planned.values()))
    assert _planned_shards(r.stdout, "attention") | _planned_shards(r.stdout, "fp8") == set(shards)
    assert "decode_float16_d128_full_hkv16_q16" in shards and "fa1-setting_float16_d64_full" in shards
    fp8_speed = [f for f in shards.values() if f["experiment"] == "fp8-speed"]
    assert len(fp8_speed) == 6 and {f["head_dim"] for f in fp8_speed} == {64, 128, 256}
    fp8_ablation = [f for f in shards.values() if f["experiment"] == "fp8-ablation"]
    assert len(fp8_ablation) == 6 and {f["head_dim"] for f in fp8_ablation} == {64, 128, 256}


def test_default_budget_is_the_one_quoted_in_the_config():
    """The point counts and seconds quoted in workflow/config.yaml, under each family's section, are what the
    families' plans compute now, and the default grid stays within its budget (warm cache): under 7 minutes of
    attention points (FA-3's forward and backward included), under 2.5 more for fp8-speed and fp8-accuracy, and
    under 9.5 minutes for both (with the other families and the first-run compiles, about 15 on a fresh H200)."""
    config = configuration.load_config([CONFIG])
    quoted = budget.quoted(CONFIG.read_text())
    estimated = [f for f in registry.FAMILIES.values() if budget.estimates(f)]
    assert set(quoted) == {f.name for f in estimated}
    for fam in estimated:
        assert quoted[fam.name] == budget.budget_table(fam, config), fam.name
    seconds = {
        name: sum(e["seconds"] for e in budget.budget(registry.family(name), config).values())
        for name in ("attention", "fp8")
    }
    assert seconds["attention"] <= 420 and seconds["fp8"] <= 150
    assert seconds["attention"] + seconds["fp8"] <= 570


def test_disabled_sections_plan_no_jobs_of_theirs(tmp_path):
    off = tmp_path / "off.yaml"
    off.write_text("w4a16: {enabled: false}\nmoe: {enabled: false}\n")
    r = snakemake(
        "-n",
        "--cores",
        "1",
        "--configfile",
        str(off),
        "--config",
        "gpus=[h200]",
        f"results_dir={tmp_path}",
        f"report={tmp_path}/report.html",
    )
    assert r.returncode == 0, r.stderr + r.stdout
    assert not _planned_shards(r.stdout, "w4a16") and not _planned_shards(r.stdout, "moe")
    assert f"{tmp_path}/h200/ops.csv" not in r.stdout and f"{tmp_path}/report/h200/moe" not in r.stdout


def test_gpu_types_map_gpu_jobs_to_the_cluster(tmp_path):
    """Each GPU job gets its type's partition, GRES and constraint; unlisted types get the defaults."""
    types = "gpu_types={h200: {partition: gpu, gres: 'gpu:h200:1', constraint: h200}}"
    r = snakemake(
        "-n",
        "--cores",
        "1",
        "--config",
        "gpus=[h200,a100]",
        types,
        f"results_dir={tmp_path}",
        f"report={tmp_path}/report.html",
    )
    assert r.returncode == 0, r.stderr + r.stdout
    jobs = r.stdout.split("\nrule ")
    for rule in ("environment", "benchmark"):
        h200 = next(j for j in jobs if j.startswith(f"{rule}:") and "wildcards: gpu=h200" in j)
        assert "slurm_partition=gpu, slurm_extra=--gres=gpu:h200:1, constraint=h200" in h200
        a100 = next(j for j in jobs if j.startswith(f"{rule}:") and "wildcards: gpu=a100" in j)
        assert "slurm_partition=, slurm_extra=--gres=gpu:1" in a100 and "constraint=" not in a100


def test_config_is_validated(tmp_path):
    r = snakemake("-n", "--cores", "1", "--config", "gpus=H200!", f"results_dir={tmp_path}")
    assert r.returncode != 0
    assert "validating config" in (r.stdout + r.stderr).lower()


def test_lint_is_clean():
    r = snakemake("--lint", "--cores", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Lints for" not in r.stdout + r.stderr


def test_snakefmt_clean():
    exe = shutil.which("snakefmt")
    if exe is None:
        pytest.skip("snakefmt is not installed (it comes with the test extras)")
    files = ["Snakefile", *map(str, sorted((ROOT / "workflow" / "rules").glob("*.smk")))]
    r = subprocess.run([exe, "--check", *files], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory) -> Path:
    """A copy of the workflow, run once on the mini config (the tests below read it, then break its inputs)."""
    blocker = interpreter_blocker()
    if blocker:  # a GPU node's own numpy (./suite keeps it there)
        pytest.skip(blocker)
    work = tmp_path_factory.mktemp("cpu") / "repo"
    work.mkdir()
    for name in ("Snakefile", "workflow", "kernels", "analysis", "reports", "envs"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, work / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, work / name)
    r = snakemake("--cores", "2", "--configfile", str(MINI), cwd=work, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    return work


def test_snakemakes_own_report_has_every_figure_with_its_caption(cpu_run, tmp_path):
    """`snakemake --report`: the figures registered with report() are in it, each with its own caption."""
    out = tmp_path / "snakemake-report.html"
    r = snakemake("--cores", "1", "--configfile", str(MINI), "--report", str(out), cwd=cpu_run, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    html = out.read_text(encoding="utf-8")
    drawn = sorted({p.stem for p in (cpu_run / "results" / "report").glob("**/*.png")})
    assert len(drawn) > 5
    for name in drawn:
        (file,) = ROOT.glob(f"analysis/families/*/captions/{name}.rst")  # its family's caption
        caption = " ".join(file.read_text(encoding="utf-8").split())
        assert f"{name}.png" in html, name
        assert caption.split(". ")[0][:60] in html, name  # its own caption, not a shared one


def test_cpu_pipeline_end_to_end(cpu_run):
    """Run the workflow on the mini config, and check what it produced."""
    work = cpu_run

    checks = pd.read_csv(work / "results" / "cpu" / "checks.csv")
    assert len(checks) == 2
    assert set(checks["status"]) == {"ok"}
    assert (checks["timed"].astype(str) == "False").all()
    assert (checks["max_abs_err"] <= checks["err_bound"]).all()
    assert set(checks["head_dim"]) == {59, 128}

    log = (work / "results" / "logs" / "cpu" / "checks" / "check_float16_d59_causal.log").read_text()
    assert "[1/1] ours-fa2" in log  # progress per point

    compiled = pd.read_csv(work / "results" / "compiled" / "kernels.csv")
    assert sorted(compiled["target"]) == ["sm_80", "sm_90"] and set(compiled["status"]) == {"ok"}
    verdicts = pd.read_csv(work / "results" / "audit" / "verdicts.csv").set_index("claim_id")
    assert verdicts.loc["wgmma-issue", "verdict"] != "untestable"  # judged from the compiled table
    assert verdicts.loc["tma-registers", "verdict"] == "untestable"  # its experiment was not in the mini config

    html = (work / "results" / "report.html").read_text()
    assert "Correctness" in html or "correctness" in html
    shipped = sorted(p.parent.name for p in (work / "reports" / "reference").glob("*/attention.csv"))
    for gpu in shipped:  # the report renders the shipped reference results of every GPU type
        assert json.loads((work / "reports" / "reference" / gpu / "environment.json").read_text())["gpu"] == gpu
        assert "shipped reference results" in html
        assert "data:image/png;base64" in html
    assert "No shipped results are included" not in html
    verdicts = pd.read_csv(work / "results" / "audit" / "verdicts.csv", keep_default_na=False)
    borderline = int(verdicts["borderline"].sum())
    assert borderline >= 1 and f'<span class="borderline borderline-count">{borderline} borderline</span>' in html


class _Broken:
    """Overwrite a file for one run, then put its bytes and time stamp back (so nothing reruns for it)."""

    def __init__(self, path: Path, data: bytes):
        self.path, self.data = path, data

    def __enter__(self):
        self.saved, self.stat = self.path.read_bytes(), self.path.stat()
        self.path.write_bytes(self.data)
        return self

    def __exit__(self, *exc):
        self.path.write_bytes(self.saved)
        os.utime(self.path, ns=(self.stat.st_atime_ns, self.stat.st_mtime_ns))


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_truncated_shard_fails_collect_and_keeps_the_last_table(cpu_run):
    work = cpu_run
    shard = work / "results" / "cpu" / "checks" / "check_float16_d59_causal.csv"
    table, report = work / "results" / "cpu" / "checks.csv", work / "results" / "report.html"
    before = _digest(table), _digest(report)
    with _Broken(shard, shard.read_bytes()[:-40]):
        r = snakemake("--cores", "1", "--configfile", str(MINI), cwd=work)
    assert r.returncode != 0
    named = r"check_float16_d59_causal.csv, line 2: (\d+ fields where the header has \d+|malformed CSV)"
    assert re.search(named, r.stdout + r.stderr), (r.stdout + r.stderr)[-3000:]
    assert (_digest(table), _digest(report)) == before


def test_a_corrupted_verdict_file_fails_the_report_and_keeps_the_last_one(cpu_run):
    """It used to fail the report step and delete the previous report."""
    work = cpu_run
    verdicts, report = work / "results" / "audit" / "verdicts.csv", work / "results" / "report.html"
    before = _digest(report)
    with _Broken(verdicts, verdicts.read_bytes().replace(b",holds,", b",banana,", 1)):
        r = snakemake("--cores", "1", "--configfile", str(MINI), cwd=work)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert re.search(r"verdicts.csv, line \d+, column 'verdict': 'banana' is not one of", out), out[-3000:]
    assert "Restored previous version of results/report.html" in out
    assert _digest(report) == before


def test_a_damaged_shipped_set_stops_the_plan(cpu_run):
    work = cpu_run
    ops = work / "reports" / "reference" / "h200" / "ops.csv"
    lines = ops.read_bytes().splitlines(keepends=True)
    with _Broken(ops, b"".join(lines[: len(lines) // 2])):  # cut at a row boundary: still valid CSV
        r = snakemake("-n", "--cores", "1", "--configfile", str(MINI), cwd=work)
    assert r.returncode != 0
    assert "h200: ops.csv differs from the file that was published" in r.stdout + r.stderr
    r = snakemake("-n", "--cores", "1", "--configfile", str(MINI), "--config", "reference_dir=gone", cwd=work)
    assert r.returncode != 0 and "reference_dir 'gone' is not a folder" in r.stdout + r.stderr


def test_reference_dir_null_renders_a_report_that_says_so(cpu_run):
    work = cpu_run
    r = snakemake(
        "--cores",
        "1",
        "--configfile",
        str(MINI),
        "--config",
        "reference_dir=null",
        "report=results/no-reference.html",
        cwd=work,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    html = (work / "results" / "no-reference.html").read_text()
    assert "No shipped results are included: the configuration sets reference_dir: null." in html
    assert 'id="gpu-h200"' not in html  # no shipped GPU section


def test_ruff_clean():
    exe = shutil.which("ruff")
    if exe is None:
        pytest.skip("ruff is not installed (it comes with the test extras)")
    r = subprocess.run([exe, "check", "--output-format", "concise", "."], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_formatted():
    """The code is formatted as ``ruff format`` leaves it (pyproject.toml's settings), so a change shows only
    what it changes."""
    exe = shutil.which("ruff")
    if exe is None:
        pytest.skip("ruff is not installed (it comes with the test extras)")
    r = subprocess.run([exe, "format", "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
