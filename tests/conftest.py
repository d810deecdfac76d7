"""Shared test setup: Triton's interpreter on machines without a GPU, the repo on sys.path, GPU markers.

Triton decides at import time whether ``@triton.jit`` functions run compiled or interpreted, and
``kernels._runtime`` reads ``TRITON_INTERPRET`` once when it is imported, so the variable is set here,
at conftest import time, before any test module can import triton or the kernels. Importing torch to
ask whether a GPU exists is safe: torch does not import triton on its own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()

if not HAS_CUDA:
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        raise RuntimeError(
            "triton was imported before tests/conftest.py could set TRITON_INTERPRET=1; kernels would not "
            "run in the interpreter on this CPU-only machine (set TRITON_INTERPRET=1 in the environment)"
        )
    os.environ["TRITON_INTERPRET"] = "1"

else:
    # One small configuration that fits every head dim on any recent GPU: without it, each test shape
    # would first autotune over the whole space (7 compilations), which made the GPU suite take minutes.
    # Tests of the tuner itself remove the variable (see test_autotuned_path_on_gpu).
    os.environ.setdefault("KERNELS_FA2_CONFIG", "BLOCK_M=64,BLOCK_N=32,num_warps=4,num_stages=2")

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tests"):  # the packages, and the tests' shared helpers (snakemake_helpers)
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

GPU_SKIP_REASON = "needs a CUDA GPU (this machine runs kernels in Triton's interpreter on the CPU)"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"gpu: the test {GPU_SKIP_REASON}; it is skipped without one")
    # Triton 3.6's interpreter converts 1-element arrays to ints the way NumPy ≥ 1.25 deprecates;
    # thousands of identical third-party warnings would bury the ones that matter
    config.addinivalue_line(
        "filterwarnings",
        "ignore:Conversion of an array with ndim > 0 to a scalar is deprecated:DeprecationWarning:triton.*",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip every test (or parametrised case) marked ``gpu`` when no CUDA GPU is available."""
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason=GPU_SKIP_REASON)
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip_gpu)


@pytest.fixture
def device() -> str:
    """Where kernel tests put their tensors: the GPU if there is one, else the CPU (interpreter)."""
    return "cuda" if HAS_CUDA else "cpu"


@pytest.fixture(scope="session")
def claims() -> dict:
    """Every claim (the articles' registry and the families' own), by id (``audit_helpers``)."""
    import audit_helpers

    return audit_helpers.all_claims()


@pytest.fixture(scope="module")
def env() -> dict:
    """This machine's environment record, as a job writes it beside its rows."""
    from analysis.core.provenance import environment

    return environment()


@pytest.fixture
def fake_timing(monkeypatch):
    """Harness timing and peak memory without a GPU (``fake_harness``); the timing calls' (warmup, rep), and
    in ``.rounds`` the repeat rounds'."""
    import fake_harness

    return fake_harness.install(monkeypatch)
