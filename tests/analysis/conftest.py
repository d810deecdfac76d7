"""Fixtures of the experiment tests: this machine's environment record, and the harness's GPU timing faked."""

from __future__ import annotations

import fake_harness
import pytest

from analysis.core.provenance import environment


@pytest.fixture(scope="module")
def env() -> dict:
    return environment()


@pytest.fixture
def fake_timing(monkeypatch) -> list[tuple[float, float]]:
    """Harness timing and peak memory without a GPU (``fake_harness``); the timing calls' (warmup, rep)."""
    return fake_harness.install(monkeypatch)
