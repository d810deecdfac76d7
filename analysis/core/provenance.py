"""Provenance: which GPU, driver and software produced a result, and from which commit.

Every result row carries these fields, and each result set writes them once to ``environment.json``.
The GPU is read through NVML (nvidia-ml-py), which also names it when PyTorch is not yet initialised;
the slug derived from its name (``NVIDIA H200`` → ``h200``) is the GPU-type wildcard of the workflow.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import platform
import re
import subprocess
from fnmatch import fnmatchcase
from functools import lru_cache
from pathlib import Path

from analysis.core.paths import ROOT

GIT_SHA_ENV = "KERNELS_AUDIT_GIT_SHA"  # set where the checkout has no .git (e.g. a copied tree)
CPU_SLUG = "cpu"

# what a result row depends on: a difference here between two commits can change a measurement (the kernels,
# the harness and the models it uses, the families' measuring code and the measuring code they share, the
# benchmark script); folders or '/'-separated patterns, of Python files
MEASURED_CODE = [
    "kernels",
    "analysis/core/harness.py",
    "analysis/core/flops.py",
    "analysis/core/models.py",
    "analysis/core/points.py",
    "analysis/families/*/run.py",
    "analysis/families/*/measure.py",
    "analysis/families/*/varlen.py",
    "analysis/families/*/rows.py",
    "analysis/families/*/target.py",
    "analysis/families/_shared/attention_measure.py",
    "analysis/families/_shared/peers.py",
    "analysis/families/_shared/operator_rows.py",
    "workflow/scripts/benchmark.py",
    # where the same code lived before the families had folders (rows of older commits)
    "analysis/experiments",
    "analysis/harness.py",
    "analysis/flops.py",
    "analysis/models.py",
    "workflow/scripts/attention_benchmark.py",
    "workflow/scripts/ops_benchmark.py",
]


def gpu_slug(name: str) -> str:
    """A short, path-safe name for a GPU model: ``NVIDIA A100-SXM4-80GB`` → ``a100-sxm4-80gb``."""
    text = name.lower()
    for word in ("nvidia", "geforce", "tesla"):
        text = re.sub(rf"\b{word}\b", " ", text)
    text = re.sub(r"[^a-z0-9]+", "-", text).strip("-")
    if not text:
        raise ValueError(f"cannot derive a GPU slug from {name!r}")
    return text


@lru_cache(maxsize=1)
def nvml_gpu() -> dict | None:
    """Name, slug, driver, memory and index of the first visible GPU through NVML, or None."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            return None
        index = _visible_index()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else name
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle).total
        return {
            "gpu_name": name,
            "gpu": gpu_slug(name),
            "driver": driver,
            "memory_gib": round(mem / 2**30, 1),
            "nvml_index": index,
        }
    except pynvml.NVMLError:
        return None


def _visible_index() -> int:
    # NVML ignores CUDA_VISIBLE_DEVICES; honour its first entry when it is a plain index
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


def detect_gpu_slug() -> str:
    """The GPU type of this machine, or ``cpu`` when there is no usable NVIDIA GPU."""
    gpu = nvml_gpu()
    return gpu["gpu"] if gpu else CPU_SLUG


def git_sha(repo: str | Path | None = None) -> str:
    """Commit of the code that ran (with ``-dirty`` if the tree had uncommitted changes)."""
    pinned = os.environ.get(GIT_SHA_ENV, "").strip()
    if pinned:
        return pinned
    cwd = Path(repo) if repo else ROOT
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "")


def is_measured(path: str) -> bool:
    """Whether the repository file ``path`` ('/'-separated, from the root) is measured code: a Python file
    that one of ``MEASURED_CODE``'s patterns names, or under one of its folders."""
    if not path.endswith(".py"):
        return False
    parts = path.split("/")
    for pattern in MEASURED_CODE:
        segments = pattern.split("/")
        folder = not pattern.endswith(".py")
        deep_enough = len(parts) > len(segments) if folder else len(parts) == len(segments)
        head = parts[: len(segments)]
        if deep_enough and all(fnmatchcase(part, seg) for part, seg in zip(head, segments, strict=True)):
            return True
    return False


def blob_id(data: bytes) -> str:
    """git's object id of a file with these contents (the SHA-1 of a blob), computed without git."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def measured_code(root: Path = ROOT) -> dict[str, str]:
    """{path: blob id} of the measured code as it is on disk under ``root``: what a run imports, with or
    without a ``.git`` beside it."""
    tops = {pattern.split("/")[0] for pattern in MEASURED_CODE}
    files = (f for top in sorted(tops) if (root / top).is_dir() for f in (root / top).rglob("*.py"))
    found = {f.relative_to(root).as_posix(): f for f in files if f.is_file()}
    return {path: blob_id(found[path].read_bytes()) for path in sorted(found) if is_measured(path)}


def measured_code_at(sha: str, repo: str | Path | None = None) -> dict[str, str]:
    """{path: blob id} of the measured code in commit ``sha`` (``git ls-tree``)."""
    listing = subprocess.run(
        ["git", "ls-tree", "-r", "--full-tree", sha],
        cwd=Path(repo) if repo else ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    out = {}
    for line in listing.splitlines():
        meta, path = line.split("\t", 1)
        _, kind, obj = meta.split()
        if kind == "blob" and is_measured(path):
            out[path] = obj
    return out


def code_changes(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """The paths whose blob differs between two ``measured_code`` records (or that only one has), sorted."""
    return sorted(path for path in set(a) | set(b) if a.get(path) != b.get(path))


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def environment() -> dict:
    """Everything a result needs to be reproduced: GPU, driver, CUDA, libraries, commit, time."""
    import numpy
    import pandas
    import torch
    import triton

    gpu = nvml_gpu()
    env = {
        "gpu_name": gpu["gpu_name"] if gpu else "none (CPU)",
        "gpu": gpu["gpu"] if gpu else CPU_SLUG,
        "driver": gpu["driver"] if gpu else "",
        "cuda": torch.version.cuda or "",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "git_sha": git_sha(),
        "measured_code": measured_code(),
        "timestamp": now_utc(),
        "numpy": numpy.__version__,
        "pandas": pandas.__version__,
        "platform": platform.platform(terse=True),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0"),
    }
    if gpu:
        env["memory_gib"] = gpu["memory_gib"]
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["sm_count"] = props.multi_processor_count
        env["compute_capability"] = f"{props.major}.{props.minor}"
        env["cudnn"] = str(torch.backends.cudnn.version())
    return env


def installed_packages() -> list[str]:
    """``name==version`` of every Python distribution importable here (what actually ran), sorted."""
    from importlib import metadata

    seen = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and name.lower() not in seen:
            seen[name.lower()] = f"{name}=={dist.version}"
    return [seen[k] for k in sorted(seen)]


ROW_FIELDS = ("gpu_name", "gpu", "driver", "cuda", "torch", "triton", "python", "git_sha")


def row_provenance(env: dict) -> dict:
    """The provenance columns every result row carries (the timestamp is per row)."""
    return {k: env.get(k, "") for k in ROW_FIELDS}
