"""The slurm profile, on a real single-node SLURM cluster started for this module (tests/slurm/cluster.py).

(a) The CPU configuration (tests/workflow/mini.yaml) runs through ``--profile workflow/profiles/slurm``,
    every job as a SLURM job, and its checks table equals that of a local run bit for bit.
(b) A job that fails (a GPU type requested on this GPU-less machine) fails the workflow with the job's
    own message.

Skipped where SLURM cannot be set up (not root, no apt-get) or its executor plugin is not installed, unless
the ``CI`` variable is set: CI must run it, so there the missing prerequisite is a failure.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import cluster as slurm_cluster  # tests/slurm/cluster.py (pytest puts this folder on sys.path)
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
MINI = ROOT / "tests" / "workflow" / "mini.yaml"
PROFILE = "workflow/profiles/slurm"
# columns that legitimately differ between two runs of the same check: when and from which tree it ran
PROVENANCE = {"timestamp", "git_sha"}
SUBMITTED = re.compile(r"submitted with SLURM jobid (\d+)")


def snakemake(*args, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    cmd = ["timeout", "-k", "10", str(timeout), sys.executable, "-m", "snakemake", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)


def copy_repo(dest: Path) -> Path:
    dest.mkdir(parents=True)
    for name in ("Snakefile", "workflow", "kernels", "analysis", "reports", "envs"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"), symlinks=True)
        else:
            shutil.copy(src, dest / name)
    return dest


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """A running single-node cluster for the whole session; its daemons are always stopped afterwards."""
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        reason = "the SLURM executor plugin is not installed (the slurm extra; ./suite test adds it under CI)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the SLURM tests, but {reason}")
        pytest.skip(reason)
    try:
        c = slurm_cluster.start(tmp_path_factory.mktemp("slurm-cluster"))
    except slurm_cluster.ClusterUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the SLURM tests, but SLURM cannot be set up: {exc}")
        pytest.skip(f"no SLURM test cluster on this machine: {exc}")
    try:
        yield c
    finally:
        c.stop()


def test_cpu_workflow_runs_as_slurm_jobs_and_matches_a_local_run(cluster, tmp_path):
    local = copy_repo(tmp_path / "local")  # the local side only needs the table compared (not the report)
    r = snakemake("results/cpu/checks.csv", "--cores", "2", "--configfile", str(MINI), cwd=local)
    assert r.returncode == 0, r.stderr[-4000:]

    work = copy_repo(tmp_path / "slurm")
    # the plugin deletes the SLURM logs of successful jobs unless told to keep them
    r = snakemake("--profile", PROFILE, "--configfile", str(MINI), "--slurm-keep-successful-logs", cwd=work)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:] + "\n" + cluster.logs()

    # every job except the target rule `all` (run inside Snakemake) went through sbatch
    ids = SUBMITTED.findall(out)
    n_jobs = int(re.search(r"(\d+) of (\d+) steps \(100%\) done", out).group(2))
    assert len(ids) == len(set(ids)) == n_jobs - 1, out[-4000:]
    # ... and SLURM ran each of them to completion (its job-completion records and squeue agree)
    done = cluster.finished_jobs()
    for jobid in ids:
        assert re.search(rf"JobId={jobid} .*JobState=COMPLETED", done), f"job {jobid} not COMPLETED:\n{done}"
    states = dict(line.split() for line in cluster.squeue("-h", "-t", "all", "-o", "%i %T").splitlines())
    assert all(states.get(jobid) == "COMPLETED" for jobid in ids), states
    # the plugin's per-job SLURM logs exist, one per job id
    logs = {p.stem for p in (work / ".snakemake" / "slurm_logs").rglob("*.log")}
    assert set(ids) <= logs, (ids, logs)

    got = pd.read_csv(work / "results" / "cpu" / "checks.csv")
    want = pd.read_csv(local / "results" / "cpu" / "checks.csv")
    cols = [c for c in want.columns if c not in PROVENANCE]
    assert list(got.columns) == list(want.columns)
    assert len(got) == len(want) == 2
    assert set(got["status"]) == {"ok"}
    key = ["dtype", "head_dim", "causal", "seqlen_q", "seqlen_k"]
    got = got.sort_values(key).reset_index(drop=True)[cols]
    want = want.sort_values(key).reset_index(drop=True)[cols]
    pd.testing.assert_frame_equal(got, want, check_exact=True)  # errors to the last bit, shapes, statuses
    assert (work / "results" / "report.html").is_file()


def test_failing_job_fails_the_workflow_with_its_message(cluster, tmp_path):
    work = copy_repo(tmp_path / "repo")
    # Ask for H200 results on this GPU-less node. The h200 type maps to the cluster's second partition and
    # requests no GRES (the node has no GPUs), so sbatch accepts the job and the job's GPU check must fail it.
    types = f"gpu_types={{h200: {{partition: {slurm_cluster.GPU_PARTITION}, gres: ''}}}}"
    r = snakemake(
        "results/h200/environment.json",
        "--profile",
        PROFILE,
        "--configfile",
        str(MINI),
        "--config",
        "gpus=[h200]",
        types,
        cwd=work,
    )
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-4000:]
    ids = SUBMITTED.findall(out)
    assert len(ids) == 1, out[-4000:]  # it did run as a SLURM job ...
    # ... in the partition the GPU type maps to, and SLURM saw it fail
    assert cluster.squeue("-h", "-t", "all", "-j", ids[0], "-o", "%P %T").split() == [
        slurm_cluster.GPU_PARTITION,
        "FAILED",
    ]
    assert "Error in rule environment" in out, out[-4000:]
    message = "results for GPU type 'h200' were requested, but this job runs on"
    job_log = (work / "results" / "logs" / "h200" / "environment.log").read_text()
    assert message in job_log
    assert message in out  # show-failed-logs puts the job's log in Snakemake's own output
    assert not (work / "results" / "h200" / "environment.json").exists()
