"""The project as a library: the CPU example of docs/kernels.md runs as written, a script outside the
repository imports the kernels from a venv the project is installed into (editable, without its
dependencies: nothing is downloaded), and `import analysis` stops when another `kernels` comes first."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from snakemake_helpers import suite_requirements

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "kernels.md"


def cpu_example() -> str:
    """The Python block under docs/kernels.md's `<!-- cpu-example -->` marker."""
    found = re.search(r"<!-- cpu-example -->\n```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert found, f"{DOC} has no ```python block after <!-- cpu-example -->"
    return found.group(1)


def run_script(python, script: Path, **env) -> subprocess.CompletedProcess:
    """``script`` run from its own folder, outside the repository, in an environment that says nothing of
    Triton's interpreter (the tests' own process set TRITON_INTERPRET) nor of where the kernels are."""
    clean = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    return subprocess.run(
        [str(python), script.name], cwd=script.parent, env={**clean, **env}, capture_output=True, text=True, timeout=600
    )


def test_the_cpu_example_runs_as_written(tmp_path):
    """The example sets TRITON_INTERPRET itself and checks its output with the tolerance policy."""
    script = tmp_path / "example.py"
    script.write_text(cpu_example())
    assert 'os.environ["TRITON_INTERPRET"] = "1"' in script.read_text()
    r = run_script(sys.executable, script, PYTHONPATH=str(ROOT))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    first, paged, shape = r.stdout.strip().splitlines()
    assert first.startswith("out: max-abs error") and paged.startswith("paged: max-abs error")
    assert shape == "torch.Size([2, 96])"


def test_a_script_outside_the_repository_imports_the_installed_kernels(tmp_path, build_backend):
    """A venv that sees this interpreter's packages (made as ./suite makes its own: on a plain Python
    `--system-site-packages` does the same), the project installed into it with `pip install --no-deps
    -e` and no index, then the CPU example from another folder, with no PYTHONPATH."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, repo / name)
    for name in ("kernels", "analysis"):
        shutil.copytree(ROOT / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    python = suite_requirements().layer(tmp_path / "venv")
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index"]
    subprocess.run([*pip, "--no-deps", "--no-build-isolation", "--editable", repo], check=True, timeout=600)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = elsewhere / "my_script.py"
    script.write_text(cpu_example() + "import kernels\nprint(kernels.__file__)\n")
    r = run_script(python, script)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("out: max-abs error") and lines[-1] == str(repo / "kernels" / "__init__.py")


def test_import_analysis_names_another_kernels_that_comes_first(tmp_path):
    """PyPI's `kernels` (Hugging Face's) in the way: `import analysis` says where it is and what to do,
    instead of a family failing later on `No module named 'kernels.attention'`."""
    other = tmp_path / "site" / "kernels"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    script = tmp_path / "uses_analysis.py"
    script.write_text("import analysis\n")
    r = run_script(sys.executable, script, PYTHONPATH=os.pathsep.join([str(other.parent), str(ROOT)]))
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ImportError: `import kernels` finds {other / '__init__.py'}, not this project's")
    assert "Hugging Face" in last and "pip uninstall kernels" in last and f"PYTHONPATH={ROOT}" in last
    # with this project's first, the same import is quiet
    r = run_script(sys.executable, script, PYTHONPATH=os.pathsep.join([str(ROOT), str(other.parent)]))
    assert r.returncode == 0, r.stderr[-3000:]
