"""Shared by the setup and install tests: whether this interpreter can build the project's editable install
without a package index."""

from __future__ import annotations

import os

import pytest
from snakemake_helpers import suite_requirements


@pytest.fixture
def build_backend() -> None:
    """Skips the test where ``[build-system]``'s setuptools is missing or too old here (pip would fetch it
    from an index), except under CI, where ./suite installs it and the test must run."""
    requirements = suite_requirements()
    lacking = [n for n in requirements.needs("run", gpu=False, ci=False, build=True) if n["group"] == "build"]
    lacking = [n for n in lacking if not n["ok"]]
    if lacking and not os.environ.get("CI"):
        pytest.skip(
            f"the editable install needs {requirements.describe(lacking)} to build without an index "
            "(a .venv made by ./suite has it; under CI it is installed)"
        )
