"""Setting up: ./suite and envs/requirements.py (reuse the interpreter's packages, install only what is
missing and say what and why, nothing from an index when nothing is missing, the project itself into the
venv it makes and never into an interpreter it did not make, no word of conflicts it did not bring, a stop
when another `kernels` would be imported), pyproject.toml's requirements and tested versions, and the conda
environments pinned to them."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from snakemake_helpers import suite_requirements

ROOT = Path(__file__).resolve().parents[2]
requirements = suite_requirements()

DATA = requirements.project()
TESTED = requirements.tested_versions(DATA)
TEST_TOOLS = {"pytest", "snakefmt", "ruff", "snakemake-executor-plugin-slurm"}


def versions(**found):
    """A fake interpreter's installed versions: the tested ones, changed or removed (None) by ``found``."""
    have = dict(TESTED, **{canonicalize_name(k): v for k, v in found.items()})
    return lambda name: have.get(canonicalize_name(name))


def names(result):
    return {n["name"] for n in result}


def test_the_tested_versions_meet_every_requirement():
    for purpose in requirements.PURPOSES:
        for gpu in (True, False):
            for ci in (True, False):
                result = requirements.needs(purpose, gpu=gpu, ci=ci, version=versions())
                assert all(n["ok"] for n in result), [n for n in result if not n["ok"]]
    assert TESTED["torch"] == "2.11.0" and TESTED["triton"] == "3.6.0"  # the shipped H200 run's


def test_running_needs_no_test_tools():
    run = names(requirements.needs("run", gpu=False, ci=False, version=versions()))
    test = names(requirements.needs("test", gpu=False, ci=False, version=versions()))
    assert not run & TEST_TOOLS and {"torch", "triton", "snakemake"} <= run
    assert test - run == TEST_TOOLS - {"snakemake-executor-plugin-slurm"}
    # under CI every test must run, the SLURM one included
    ci = requirements.needs("test", gpu=False, ci=True, version=versions())
    assert "snakemake-executor-plugin-slurm" in names(ci)


def test_numpy_bound_only_where_the_interpreter_needs_it():
    def numpy(gpu, **found):
        result = requirements.needs("run", gpu=gpu, ci=False, version=versions(**found))
        return next(n for n in result if n["name"] == "numpy")

    assert numpy(True, numpy="2.5.2")["ok"]  # a GPU node keeps its numpy
    cpu = numpy(False, numpy="2.5.2")
    assert not cpu["ok"] and cpu["install"] == f"numpy=={TESTED['numpy']}"
    assert numpy(False, numpy="2.5.2", triton="3.7.1")["ok"]  # fixed in Triton 3.7 (triton-lang/triton#9171)
    assert not numpy(False, numpy="2.5.2", triton=None)["ok"]  # Triton to be installed: the tested 3.6
    assert numpy(False, numpy="2.3.5")["ok"]


def test_what_is_installed_is_said_by_group_and_why():
    result = requirements.needs(
        "test",
        gpu=False,
        ci=False,
        build=True,
        version=versions(torch=None, numpy="2.5.2", pandas="1.5.3", pytest=None, setuptools="65.5.0"),
    )
    assert requirements.by_group([n for n in result if not n["ok"]]) == [
        "to run the pipeline: torch==2.11.0 (not installed), "
        "numpy==2.2.6 (2.5.2 installed; without a GPU, Triton 3.6.0's interpreter needs numpy<2.4), "
        "pandas==2.3.3 (1.5.3 installed; pandas>=2.0 needed)",
        "to run the tests: pytest==9.2.0 (not installed)",
        "to install this project editable (its build backend): "
        "setuptools==81.0.0 (65.5.0 installed; setuptools>=77 needed)",
    ]
    result = requirements.needs(
        "test", gpu=True, ci=True, version=versions(torch="2.10.0", **{"snakemake-executor-plugin-slurm": None})
    )
    assert requirements.by_group([n for n in result if not n["ok"]]) == [
        "to run the pipeline: torch==2.11.0 (2.10.0 installed; CI tests torch==2.11.0)",
        "for the SLURM test, which CI runs: snakemake-executor-plugin-slurm==2.6.1 (not installed)",
    ]
    # under CI the tests need the build backend (the install test builds the project without an index)
    assert "setuptools" in names(requirements.needs("test", gpu=False, ci=True, version=versions()))
    assert "setuptools" not in names(requirements.needs("test", gpu=False, ci=False, version=versions()))


def test_hidden_gpus_count_as_none(monkeypatch):
    for hidden in ("", "-1"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        assert not requirements.has_gpu()  # the kernels then run in the interpreter, which needs its numpy


def test_what_is_missing_is_installed_at_the_tested_version_and_ci_requires_it_exactly():
    result = requirements.needs("run", gpu=True, ci=False, version=versions(torch=None, triton="3.8.0"))
    missing = [n for n in result if not n["ok"]]
    assert [n["install"] for n in missing] == ["torch==2.11.0"]  # triton 3.8 is fine outside CI
    result = requirements.needs("run", gpu=True, ci=True, version=versions(torch="2.11.0+cu130", triton="3.8.0"))
    assert [n["install"] for n in result if not n["ok"]] == ["triton==3.6.0"]  # a local label is the same torch


def test_conda_environments_pin_the_tested_versions():
    requires_python = SpecifierSet(DATA["project"]["requires-python"])
    ranges = {
        n["name"]: SpecifierSet(n["spec"]) for n in requirements.needs("test", gpu=False, ci=True, version=versions())
    }
    for name in ("kernels", "analysis"):
        env = yaml.safe_load((ROOT / "envs" / f"{name}.yaml").read_text())
        assert env["name"] == f"kernels-audit-{name}" and "conda-forge" in env["channels"]
        conda = [d for d in env["dependencies"] if isinstance(d, str)]
        (python,) = [d.split("=", 1)[1] for d in conda if d.startswith("python=")]
        assert requires_python.contains(python + ".0")
        assert any(d.startswith("pip=") for d in conda)
        (pip,) = [d["pip"] for d in env["dependencies"] if isinstance(d, dict)]
        for line in pip:
            req = Requirement(line)
            (spec,) = req.specifier
            package = canonicalize_name(req.name)
            assert spec.operator == "==" and spec.version == TESTED[package], (name, line)
            assert ranges[package].contains(spec.version), (name, line)
        pinned = {canonicalize_name(Requirement(line).name) for line in pip}
        assert {"numpy", "pandas", "nvidia-ml-py", "jinja2", "pyyaml"} <= pinned
        if name == "kernels":
            assert {"torch", "triton"} <= pinned


def test_license_is_an_spdx_expression():
    assert DATA["project"]["license"] == "MIT"
    (setuptools,) = [Requirement(r) for r in DATA["build-system"]["requires"] if r.startswith("setuptools")]
    assert not setuptools.specifier.contains("76.9")  # the string form needs setuptools >= 77


@pytest.mark.skipif(not os.environ.get("CI"), reason="CI only: there ./suite installs the tested versions")
def test_ci_tests_with_the_gpus_versions():
    import torch
    import triton

    assert torch.__version__.split("+")[0] == TESTED["torch"]
    assert triton.__version__ == TESTED["triton"]
    assert all(n["ok"] for n in requirements.needs("test"))


def repo_copy(dest: Path, pyproject: str | None = None) -> Path:
    dest.mkdir()
    for name in (
        "Snakefile",
        "workflow",
        "kernels",
        "analysis",
        "reports",
        "envs",
        "tests",
        "profiles",
        "suite",
        "pyproject.toml",
    ):
        src = ROOT / name
        if src.is_symlink():
            os.symlink(os.readlink(src), dest / name)
        elif src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"), symlinks=True)
        else:
            shutil.copy2(src, dest / name)
    if pyproject is not None:
        (dest / "pyproject.toml").write_text(pyproject)
    return dest


def offline(python_dir: Path, **extra) -> dict:
    """An environment where ``python3`` is ``python_dir``'s and no package index can be reached."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "SUITE_", "VIRTUAL_ENV"))}
    env.update(
        PATH=f"{python_dir}:{env['PATH']}",
        PIP_CONFIG_FILE=os.devnull,
        PIP_NO_INDEX="1",
        PIP_INDEX_URL="http://127.0.0.1:9/simple",  # nothing listens there
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        **extra,
    )
    return env


def test_suite_run_reuses_an_interpreter_that_has_everything_without_an_index(tmp_path):
    """`./suite run -n` from a python3 whose virtualenv has the requirements: no venv, no install, no index."""
    work = repo_copy(tmp_path / "repo")
    env = offline(Path(sys.executable).parent, SUITE_VENV=str(tmp_path / "venv"))
    r = subprocess.run(
        ["./suite", "run", "-n", "--config", f"results_dir={tmp_path}/out"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "This was a dry-run" in r.stdout
    assert "suite:" not in r.stderr  # nothing missing, nothing said, nothing installed
    assert not (tmp_path / "venv").exists() and not (work / ".venv").exists()


def tiny_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A pure-Python wheel with one module, built by hand (no build tools, no index)."""
    folder.mkdir(exist_ok=True)
    dist = f"{name.replace('-', '_')}-{version}"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    files = {
        f"{name.replace('-', '_')}.py": "VALUE = 1\n",
        f"{dist}.dist-info/METADATA": metadata + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = "\n".join(record) + "\n"
    wheel = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel


def test_suite_installs_only_what_is_missing_on_top_of_the_interpreter(tmp_path, build_backend):
    """A requirement this interpreter lacks (a made-up one, from a folder of wheels): ./suite layers a venv on
    the interpreter, installs just that package there, and the project itself (editable, so that the venv's
    python imports kernels from anywhere), and runs with the interpreter's own torch."""
    text = (ROOT / "pyproject.toml").read_text()
    text = text.replace('  "jsonschema>=4",\n', '  "jsonschema>=4",\n  "suite-probe==1.0",\n')
    assert "suite-probe" in text
    work = repo_copy(tmp_path / "repo", pyproject=text)
    tiny_wheel(tmp_path / "wheels", "suite-probe", "1.0")
    venv = tmp_path / "venv"
    env = offline(Path(sys.executable).parent, SUITE_VENV=str(venv), PIP_FIND_LINKS=str(tmp_path / "wheels"))
    r = subprocess.run(
        ["./suite", "run", "-n", "--config", f"results_dir={tmp_path}/out"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    said = [line for line in r.stderr.splitlines() if line.startswith("suite:")]
    assert said[0].startswith(f"suite: {Path(sys.executable).parent}/python3 lacks some of what ./suite run needs")
    assert f"installing it into {venv}, on top of" in said[0]
    assert said[1] == "suite:   to run the pipeline: suite-probe==1.0 (not installed)"  # what, and why
    assert said[2].startswith(f"suite: installing this project into {venv}, editable")
    assert len(said) == 3 and "ERROR" not in r.stderr, r.stderr[-3000:]
    assert "This was a dry-run" in r.stdout
    python = venv / "bin" / "python"
    code = "import suite_probe, torch, numpy, kernels\nfor m in (suite_probe, torch, numpy, kernels): print(m.__file__)"
    probe, torch_file, numpy_file, kernels_file = subprocess.run(
        [python, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.split()
    import numpy
    import torch

    assert probe.startswith(str(venv))
    assert torch_file == torch.__file__ and numpy_file == numpy.__file__  # the interpreter's own, not a copy
    assert kernels_file == str(work / "kernels" / "__init__.py")  # outside the repository too
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert not (site / "torch").exists() and not list(site.glob("torch-*")) and not (site / "numpy").exists()
    # a second call finds everything and says nothing
    r = subprocess.run(
        ["./suite", "run", "-n", "--config", f"results_dir={tmp_path}/out"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0 and "suite:" not in r.stderr, r.stderr[-3000:]


def test_suite_says_no_conflict_it_did_not_bring_and_each_that_touches_it(tmp_path, build_backend):
    """pip's own check after an install blames every package it can see, the interpreter's included: a
    newcomer's first ./suite printed an ERROR about awscli, which the suite never imports. Here the
    interpreter below has two packages that require suite-dep < 2: bystander, which the suite does not use,
    and suite-user, which it does; installing suite-probe brings suite-dep 2.0. Only suite-user is said,
    as a warning. A `kernels` on PYTHONPATH, which a script outside the repository would import instead of
    the venv's, is said too."""
    wheels = tmp_path / "wheels"
    tiny_wheel(wheels, "suite-dep", "1.0")
    tiny_wheel(wheels, "suite-dep", "2.0")
    tiny_wheel(wheels, "bystander", "1.0", requires=("suite-dep<2",))
    tiny_wheel(wheels, "suite-user", "1.0", requires=("suite-dep<2",))
    tiny_wheel(wheels, "suite-probe", "1.0", requires=("suite-dep>=2",))
    base = requirements.layer(tmp_path / "base")  # an interpreter with the suite's packages and those three
    pip = [base, "-m", "pip", "install", "-q", "--no-index", "--find-links", wheels, "--disable-pip-version-check"]
    subprocess.run([*pip, "suite-dep==1.0", "bystander", "suite-user"], check=True)
    text = (ROOT / "pyproject.toml").read_text()
    text = text.replace('  "jsonschema>=4",\n', '  "jsonschema>=4",\n  "suite-user>=1",\n  "suite-probe==1.0",\n')
    work = repo_copy(tmp_path / "repo", pyproject=text)
    other = tmp_path / "other"
    (other / "kernels").mkdir(parents=True)
    (other / "kernels" / "__init__.py").write_text("")
    venv = tmp_path / "venv"
    env = offline(base.parent, SUITE_VENV=str(venv), PIP_FIND_LINKS=str(wheels), PYTHONPATH=str(other))
    r = subprocess.run(
        ["./suite", "test", "--collect-only", "-q", "tests/core/test_flops.py"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "suite:   to run the pipeline: suite-probe==1.0 (not installed)" in r.stderr
    warnings = [line for line in r.stderr.splitlines() if "warning" in line.lower()]
    assert (
        warnings[0] == "suite: warning: after this install, suite-user 1.0 requires suite-dep<2, but 2.0 is installed"
    )
    assert warnings[1].startswith(
        f"suite: warning: outside the repository, `import kernels` finds {other}/kernels/__init__.py, "
        f"not this project's {work}/kernels"
    )
    assert "Hugging Face" in warnings[1] and len(warnings) == 2
    assert "ERROR" not in r.stderr and "bystander" not in r.stderr


def test_offline_with_something_missing_one_message_lists_it(tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", bare], check=True)
    work = repo_copy(tmp_path / "repo")
    env = offline(bare / "bin", SUITE_VENV=str(tmp_path / "venv"))
    r = subprocess.run(["./suite", "run", "-n"], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("suite: could not install"), r.stderr[-3000:]
    for package in ("torch", "triton", "snakemake", "pandas"):
        assert package in last
    assert "PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR" in last


def test_suite_never_installs_into_an_interpreter_it_did_not_make(tmp_path):
    """A venv of one's own where ./suite would put its own (python3 is that venv's, lacking everything):
    ./suite stops instead of installing into it."""
    own = tmp_path / "own"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", own], check=True)
    before = sorted(p.relative_to(own) for p in own.rglob("*"))
    work = repo_copy(tmp_path / "repo")
    env = offline(own / "bin", SUITE_VENV=str(own))
    r = subprocess.run(["./suite", "run", "-n"], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"suite: {own} was not made by ./suite, which installs only into a venv it made; ")
    assert sorted(p.relative_to(own) for p in own.rglob("*")) == before


def test_suite_stops_when_the_pipeline_would_import_another_kernels(tmp_path):
    """Another package named kernels that the interpreter imports before anything else (here at start-up,
    from a sitecustomize): the pipeline would get it, so ./suite stops and names it."""
    other = tmp_path / "other"
    (other / "kernels").mkdir(parents=True)
    (other / "kernels" / "__init__.py").write_text("")
    (other / "sitecustomize.py").write_text("import kernels\n")
    env = offline(Path(sys.executable).parent, SUITE_VENV=str(tmp_path / "venv"), PYTHONPATH=str(other))
    r = subprocess.run(["./suite", "run", "-n"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("suite: in ") and f"`import kernels` finds {other}/kernels/__init__.py" in last
    assert "Hugging Face" in last and "pip uninstall kernels" in last
    assert not (tmp_path / "venv").exists()


def test_suite_test_runs_only_the_given_path(tmp_path):
    env = offline(Path(sys.executable).parent, SUITE_VENV=str(tmp_path / "venv"))
    r = subprocess.run(
        ["./suite", "test", "--collect-only", "-q", "tests/core/test_flops.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ids = [line for line in r.stdout.splitlines() if "::" in line]
    assert ids and all(line.startswith("tests/core/test_flops.py::") for line in ids)
