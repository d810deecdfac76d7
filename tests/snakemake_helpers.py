"""Running Snakemake from tests: one subprocess helper, the parser of a dry run's job table, and ./suite's
requirements module (envs/requirements.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def snakemake(*args, cwd=ROOT, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snakemake", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def job_counts(stdout: str) -> dict[str, int]:
    """Parse the 'Job stats' table of a dry run."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Job stats"))
    counts = {}
    for line in lines[start + 3 :]:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            break
        counts[parts[0]] = int(parts[1])
    return counts


@lru_cache(maxsize=1)
def suite_requirements():
    """envs/requirements.py as a module (it is a script in a folder that is not a package)."""
    spec = importlib.util.spec_from_file_location("suite_requirements", ROOT / "envs" / "requirements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def interpreter_blocker() -> str | None:
    """Why Triton's interpreter cannot run the kernels with this environment's packages (a GPU node keeps
    a numpy that the interpreter of its Triton refuses), or None."""
    req = suite_requirements()
    lacking = [n for n in req.needs("run", gpu=False, ci=False) if not n["ok"] and n["found"]]
    return f"Triton's interpreter here needs {req.describe(lacking)}" if lacking else None
