"""What the operator-like families (W4A16, MoE; rows in the operator table ``ops.csv``) plan alike: the timing
fields of a shard, as a config section sets them, and the cost model of their estimates.

Torch-free, like every plan. The cost model is a planning aid, not a measurement (the real cost is in each
shard's log): a new process per shard (``SHARD_S``), a fixed setup per point (``POINT_S``: inputs, the float64
reference on sampled rows, the gate), the harness's warm-up and repetitions, and about ``CALLS`` untimed calls
per point at nominal H200 rates (``BANDWIDTH`` bytes/s for memory-bound calls, ``TFLOPS`` for products; a call
costs the larger of the two, ``call_s``), and each timed point's repeat rounds
(``analysis.core.costs.rounds_seconds``). Each family adds its own setup per shape and its compile costs.
"""

from __future__ import annotations

SHARD_S = 4.5  # a new Python process: imports, CUDA context, environment check
POINT_S = 0.1  # inputs, the float64 reference on sampled rows, the gate
CALLS = 9  # untimed calls of a point: the gate, peak memory, the harness's estimate
BANDWIDTH = 4.0e12  # bytes/s, a nominal H200 stream rate
TFLOPS = 600e12  # a nominal bf16 dense rate


def call_s(flops: float, nbytes: float) -> float:
    """Seconds of one call at the nominal rates: the larger of its product and its bytes."""
    return max(flops / TFLOPS, nbytes / BANDWIDTH)


def timing(section: dict) -> dict:
    """The harness's warm-up, repetitions and repeat rounds and the gate's sampled rows, as a section of the
    config sets them."""
    return dict(
        warmup_ms=section["warmup_ms"],
        rep_ms=section["rep_ms"],
        spread_rounds=section["spread_rounds"],
        check_rows=section["check_rows"],
    )
