"""The harness's GPU-only parts (CUDA-event timing, CUDA peak memory) faked for the experiment tests.

Each fake still calls the timed callable once for real, so an experiment's whole path runs on the CPU.
"""

from __future__ import annotations

from analysis.core import harness

MS = 2.0  # the fake median time of every timed point


def install(monkeypatch) -> list[tuple[float, float]]:
    """Replace ``harness.time_gpu`` and ``harness.peak_extra_memory_mib``; returns the list that records each
    timing call's ``(warmup_ms, rep_ms)``."""
    calls = []

    def time_gpu(fn, warmup_ms, rep_ms):
        fn()
        calls.append((warmup_ms, rep_ms))
        return harness.Timing(MS, 0.9 * MS, 1.2 * MS)

    def peak(fn, device=None):
        fn()
        return 1.5

    monkeypatch.setattr(harness, "time_gpu", time_gpu)
    monkeypatch.setattr(harness, "peak_extra_memory_mib", peak)
    return calls
