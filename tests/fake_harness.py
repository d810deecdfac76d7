"""The harness's GPU-only parts (CUDA-event timing, CUDA peak memory) faked for the experiment tests.

Each fake still calls the timed callable once for real, so an experiment's whole path runs on the CPU.
"""

from __future__ import annotations

from analysis.core import harness

MS = 2.0  # the fake median time of every timed point
ROUND_MS = (0.95 * MS, 1.1 * MS, 1.0 * MS)  # the fake repeat rounds' medians, in turn, round after round


class Calls(list):
    """Each timing call's ``(warmup_ms, rep_ms)``; ``rounds``: each repeat round's ``(callable, warmup_ms,
    rep_ms)``, in the order they were timed."""

    def __init__(self):
        super().__init__()
        self.rounds: list[tuple] = []


def install(monkeypatch) -> Calls:
    """Replace ``harness.time_gpu``, ``harness.time_round`` and ``harness.peak_extra_memory_mib``; returns the
    list that records each timing call (and, in ``rounds``, each repeat round)."""
    calls = Calls()

    def time_gpu(fn, warmup_ms, rep_ms):
        fn()
        calls.append((warmup_ms, rep_ms))
        return harness.Timing(MS, 0.9 * MS, 1.2 * MS)

    def time_round(fn, timing, warmup_ms, rep_ms):
        fn()
        calls.rounds.append((fn, warmup_ms, rep_ms))
        return ROUND_MS[(len(calls.rounds) - 1) % len(ROUND_MS)]

    def peak(fn, device=None):
        fn()
        return 1.5

    monkeypatch.setattr(harness, "time_gpu", time_gpu)
    monkeypatch.setattr(harness, "time_round", time_round)
    monkeypatch.setattr(harness, "peak_extra_memory_mib", peak)
    return calls
