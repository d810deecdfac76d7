"""Provenance: GPU slugs, the commit, and the environment record every result row carries."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import torch
import triton

from analysis.core import provenance
from analysis.core.provenance import ROW_FIELDS, detect_gpu_slug, environment, gpu_slug, row_provenance

HAS_GPU = torch.cuda.is_available() or provenance.nvml_gpu() is not None
cpu_machine_only = pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU; the assertion is about CPU-only hosts")
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@pytest.mark.parametrize(
    "name, slug",
    [
        pytest.param("NVIDIA H200", "h200", id="h200"),
        pytest.param("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb", id="a100"),
        pytest.param("NVIDIA GeForce RTX 4090", "rtx-4090", id="rtx-4090"),
        pytest.param("Tesla V100-SXM2-16GB", "v100-sxm2-16gb", id="v100"),
        pytest.param("NVIDIA H100 80GB HBM3", "h100-80gb-hbm3", id="h100"),
        pytest.param("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada-generation", id="rtx-6000-ada"),
        pytest.param("  NVIDIA   L40S ", "l40s", id="extra-spaces"),
    ],
)
def test_gpu_slug(name, slug):
    assert gpu_slug(name) == slug
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", slug)


@pytest.mark.parametrize(
    "name",
    [pytest.param("", id="empty"), pytest.param("NVIDIA", id="vendor-only"), pytest.param(" -/ ", id="punctuation")],
)
def test_gpu_slug_rejects_names_without_a_model(name):
    with pytest.raises(ValueError, match="cannot derive a GPU slug"):
        gpu_slug(name)


def test_git_sha_honours_env(monkeypatch):
    monkeypatch.setenv(provenance.GIT_SHA_ENV, "0123456789abcdef0123456789abcdef01234567")
    assert provenance.git_sha() == "0123456789abcdef0123456789abcdef01234567"
    assert environment()["git_sha"] == "0123456789abcdef0123456789abcdef01234567"


@needs_git
def test_git_sha_of_a_repository(tmp_path, monkeypatch):
    monkeypatch.delenv(provenance.GIT_SHA_ENV, raising=False)
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        monkeypatch.delenv(var, raising=False)

    def git(*args):
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-c", "commit.gpgsign=false", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    git("init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    git("add", "a.txt")
    git("commit", "-q", "-m", "first")
    head = git("rev-parse", "HEAD")
    assert re.fullmatch(r"[0-9a-f]{40}", head)
    assert provenance.git_sha(tmp_path) == head
    (tmp_path / "untracked.txt").write_text("not part of the commit\n")
    assert provenance.git_sha(tmp_path) == head  # untracked files do not make it dirty
    (tmp_path / "a.txt").write_text("two\n")
    assert provenance.git_sha(tmp_path) == head + "-dirty"


@pytest.mark.parametrize(
    "path, measured",
    [
        ("kernels/attention/fa3.py", True),
        ("kernels/attention/README.md", False),
        ("kernels.py", False),
        ("analysis/families/fp8/run.py", True),
        ("analysis/families/fp8/sub/run.py", False),
        ("analysis/families/fp8/claims.py", False),
        ("analysis/families/_shared/attention_measure.py", True),
        ("analysis/families/_shared/operator_rows.py", True),
        ("analysis/families/_shared/attention_plots.py", False),
        ("analysis/core/harness.py", True),
        ("analysis/core/harness_notes.py", False),
        ("workflow/scripts/benchmark.py", True),
    ],
)
def test_measured_code_is_the_python_files_the_patterns_name(path, measured):
    assert provenance.is_measured(path) is measured


@needs_git
def test_measured_code_on_disk_matches_git_and_names_an_edit(tmp_path, monkeypatch):
    """The record a run writes without git (blob ids of the files on disk) equals ``git ls-tree``'s for the
    commit it came from, and an edit after the commit shows as that file's change."""
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        monkeypatch.delenv(var, raising=False)

    def git(*args):
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-c", "commit.gpgsign=false", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    files = {
        "kernels/attention/k.py": "x = 1\n",
        "kernels/notes.md": "not code\n",
        "analysis/families/fp8/run.py": "RUN = 'é'\n",
        "analysis/families/fp8/claims.py": "pass\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    on_disk = provenance.measured_code(tmp_path)
    assert sorted(on_disk) == ["analysis/families/fp8/run.py", "kernels/attention/k.py"]
    assert on_disk == provenance.measured_code_at("HEAD", tmp_path)
    (tmp_path / "kernels/attention/k.py").write_text("x = 2\n")
    (tmp_path / "kernels/attention/new.py").write_text("y = 1\n")
    changed = provenance.code_changes(provenance.measured_code(tmp_path), provenance.measured_code_at("HEAD", tmp_path))
    assert changed == ["kernels/attention/k.py", "kernels/attention/new.py"]


def test_a_job_refuses_code_edited_after_the_environment_step(tmp_path):
    """A job's rows carry its result set's provenance, so it does not measure code that environment.json
    did not record; a set recorded before the record existed runs as before."""
    import json

    from analysis import pipeline

    env = environment()
    recorded = {**env, "measured_code": {**env["measured_code"], "kernels/attention/fa3.py": "0" * 40}}
    env_json = tmp_path / "environment.json"
    env_json.write_text(json.dumps(recorded))
    with pytest.raises(RuntimeError, match=r"measured code changed since .*\(kernels/attention/fa3.py\)"):
        pipeline.run_shard("attention", {}, tmp_path / "shard.csv", env_json=env_json)
    assert not (tmp_path / "shard.csv").exists()
    pipeline._same_measured_code({k: v for k, v in recorded.items() if k != "measured_code"}, env, env_json)


@needs_git
def test_git_sha_outside_a_repository(tmp_path, monkeypatch):
    monkeypatch.delenv(provenance.GIT_SHA_ENV, raising=False)
    monkeypatch.delenv("GIT_DIR", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert provenance.git_sha(tmp_path) == "unknown"


def test_environment_fields():
    env = environment()
    missing = [k for k in ROW_FIELDS if k not in env]
    assert not missing
    assert env["torch"] == torch.__version__
    assert env["triton"] == triton.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", env["python"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", env["timestamp"])
    assert env["git_sha"]
    assert "kernels/attention/fa3.py" in env["measured_code"]


@cpu_machine_only
def test_environment_on_cpu_machine():
    env = environment()
    assert env["gpu"] == "cpu"
    assert env["gpu_name"] == "none (CPU)"
    assert env["driver"] == ""
    assert env["triton_interpret"] == "1"  # set by tests/conftest.py before triton was imported


@cpu_machine_only
def test_detect_gpu_slug_on_cpu_machine():
    assert detect_gpu_slug() == "cpu"


def test_row_provenance_keeps_row_fields_only():
    env = {"gpu_name": "NVIDIA H200", "gpu": "h200", "torch": "2.11.0", "numpy": "2.2.6", "timestamp": "t"}
    row = row_provenance(env)
    assert tuple(row) == ROW_FIELDS
    assert row["gpu"] == "h200" and row["torch"] == "2.11.0"
    assert row["driver"] == "" and row["git_sha"] == ""


def test_installed_packages_snapshot_lists_what_runs():
    from importlib import metadata

    from analysis.core.provenance import installed_packages

    pkgs = installed_packages()
    names = [p.split("==")[0].lower() for p in pkgs]
    assert names == sorted(names) and len(names) == len(set(names))
    assert f"torch=={metadata.version('torch')}" in pkgs  # the distribution's version (no local +cu tag)
    assert all("==" in p for p in pkgs)
