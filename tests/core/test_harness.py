"""The harness: failure statuses, progress lines and telemetry, the GPU-only timing and memory helpers (faked
or skipped without a GPU), and the host-side cost of one eager call."""

from __future__ import annotations

import math
import re
import time

import pytest
import torch

from analysis.core import harness
from analysis.core.provenance import nvml_gpu

HAS_CUDA = torch.cuda.is_available()
cpu_only = pytest.mark.skipif(HAS_CUDA, reason="asserts what SDPA backends do on a CPU; a CUDA GPU is present")

NO_VIABLE_BACKEND = (
    "No viable backend for scaled_dot_product_attention was found. "
    "This is likely due to turning off both the math kernel and the fused kernels."
)


# ---------------------------------------------------------------------------------------------------
# harness.classify
# ---------------------------------------------------------------------------------------------------


def _out_of_resources():
    from triton.runtime.errors import OutOfResources

    return OutOfResources(262144, 232448, "shared memory")


@pytest.mark.parametrize(
    "make_exc, status, prefix",
    [
        pytest.param(
            lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has ..."),
            "oom",
            "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
            id="torch-oom",
        ),
        pytest.param(
            lambda: RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be reported later"),
            "oom",
            "RuntimeError: CUDA error: out of memory",
            id="runtime-out-of-memory",
        ),
        pytest.param(
            lambda: RuntimeError("Triton Error [CUDA]: Out Of Memory"),
            "oom",
            "RuntimeError: Triton Error",
            id="runtime-out-of-memory-capitalised",
        ),
        pytest.param(
            lambda: RuntimeError("out of resource: shared memory, Required: 262144, Hardware limit: 232448"),
            "error",
            "RuntimeError: out of resource: shared memory",
            id="runtime-shared-memory",
        ),
        pytest.param(
            lambda: RuntimeError("out of memory: shared memory exceeds the limit"),
            "error",
            "RuntimeError: out of memory: shared memory",
            id="runtime-shared-memory-out-of-memory",
        ),
        pytest.param(_out_of_resources, "error", "OutOfResources: out of resource: shared memory", id="triton-smem"),
        pytest.param(
            lambda: ValueError("head_dim 300 is not supported"), "unsupported", "ValueError: head_dim", id="value-error"
        ),
        pytest.param(lambda: TypeError("bfloat16 needs sm80"), "unsupported", "TypeError: bfloat16", id="type-error"),
        pytest.param(
            lambda: NotImplementedError("no backward pass"), "unsupported", "NotImplementedError: no", id="not-impl"
        ),
        pytest.param(
            lambda: RuntimeError("No available kernel. Aborting execution."),
            "unsupported",
            "RuntimeError: No available kernel. Aborting execution.",
            id="sdpa-no-available-kernel",
        ),
        pytest.param(lambda: RuntimeError("illegal memory access"), "error", "RuntimeError: illegal", id="runtime"),
        pytest.param(lambda: KeyError("BLOCK_M"), "error", "KeyError: 'BLOCK_M'", id="key-error"),
        pytest.param(lambda: ZeroDivisionError("division by zero"), "error", "ZeroDivisionError: div", id="zero-div"),
        pytest.param(lambda: RuntimeError(""), "error", "RuntimeError: ", id="empty-message"),
    ],
)
def test_classify(make_exc, status, prefix):
    got_status, message = harness.classify(make_exc())
    assert got_status == status
    assert message.startswith(prefix)


def test_classify_sdpa_cpu_refusal_is_unsupported():
    assert harness.classify(RuntimeError(NO_VIABLE_BACKEND))[0] == "unsupported"


def test_classify_message_first_line_only():
    _, message = harness.classify(ValueError("\n  first line\nsecond line\nthird"))
    assert message == "ValueError: first line"


@pytest.mark.parametrize(
    "exc",
    [
        pytest.param(ValueError("x" * 1000), id="value-error"),
        pytest.param(torch.OutOfMemoryError("CUDA out of memory. " + "y" * 1000), id="oom"),
    ],
)
def test_classify_truncates(exc):
    _, message = harness.classify(exc)
    assert len(message) == 300
    assert message.startswith(type(exc).__name__ + ": ")


@pytest.mark.parametrize(
    "exc, expected",
    [
        pytest.param(torch.OutOfMemoryError("anything"), True, id="torch-oom-any-text"),
        pytest.param(RuntimeError("CUDA out of memory"), True, id="text"),
        pytest.param(RuntimeError("out of memory (shared memory)"), False, id="shared-memory"),
        pytest.param(MemoryError(), False, id="host-memory-error-no-text"),
        pytest.param(RuntimeError("memory"), False, id="memory-word"),
    ],
)
def test_is_oom(exc, expected):
    assert harness.is_oom(exc) is expected


# ---------------------------------------------------------------------------------------------------
# Progress, telemetry, GPU-only measurement helpers
# ---------------------------------------------------------------------------------------------------


def test_progress_lines():
    lines: list[str] = []
    progress = harness.Progress(3, lines.append)
    progress.step("ours-fa2 N=1024", "ok 120.5 TFLOP/s")
    progress.step("naive N=1024", "oom")
    progress.step("sdpa-flash N=1024", "unsupported")
    assert len(lines) == 3
    assert re.fullmatch(r"\[1/3\] ours-fa2 N=1024: ok 120\.5 TFLOP/s \(\d+\.\d s\)", lines[0])
    assert re.fullmatch(r"\[2/3\] naive N=1024: oom \(\d+\.\d s\)", lines[1])
    assert lines[2].startswith("[3/3] sdpa-flash N=1024: unsupported (")
    assert progress.done == 3


@pytest.mark.skipif(nvml_gpu() is not None, reason="NVML sees a GPU here; this checks the no-GPU fallback")
def test_telemetry_without_nvml_is_nan():
    with harness.Telemetry(interval_s=0.001) as tel:
        torch.ones(16).sum()
    summary = tel.summary()
    assert set(summary) == set(harness.Telemetry.FIELDS)
    assert all(math.isnan(x) for x in summary.values())
    assert tel.samples == []


def test_telemetry_summary_from_samples():
    tel = harness.Telemetry.__new__(harness.Telemetry)  # no NVML needed to summarise samples
    tel.samples = [(1500.0, 2600.0, 50.0, 300.0), (1700.0, 2600.0, 55.0, 500.0)]
    assert tel.summary() == {"sm_clock_mhz": 1600.0, "mem_clock_mhz": 2600.0, "temp_c": 55.0, "power_w": 400.0}


@pytest.mark.gpu
def test_time_gpu_quantiles_ordered():
    x = torch.randn(1024, 1024, device="cuda")
    timing = harness.time_gpu(lambda: x @ x, warmup_ms=5, rep_ms=20)
    assert 0 < timing.ms_p20 <= timing.ms_median <= timing.ms_p80


def _host_then_gpu(seconds: float):
    """A call that busy-waits ``seconds`` on the host, then launches a few µs of GPU work."""
    x = torch.zeros(1024, device="cuda")

    def call():
        t = time.perf_counter()
        while time.perf_counter() - t < seconds:
            pass
        x.add_(1.0)

    return call


@pytest.mark.gpu
def test_time_gpu_leaves_out_the_host_side():
    """A call that spends 50 µs on the host before launching a few µs of GPU work is timed at the GPU work
    (the GPU-side wait before each start event covers the host side), and far below the host time."""
    call = _host_then_gpu(50e-6)
    assert harness.time_gpu(call, warmup_ms=2, rep_ms=10).ms_median < 0.02


@pytest.mark.gpu
def test_time_gpu_leaves_out_a_host_side_longer_than_the_shortest_wait():
    """A call that spends 2 ms on the host (20 times the shortest wait, as FP8 attention's end-to-end call
    does about 1 ms) before a few µs of GPU work: the wait grows with the host side, so the timing is
    still the GPU work's. A fixed 100 µs wait would let most of the 2 ms into it."""
    call = _host_then_gpu(2e-3)
    timing = harness.time_gpu(call, warmup_ms=10, rep_ms=40)
    assert timing.host_ms >= 2.0 and timing.ms_median < 0.05


def test_the_wait_covers_the_host_side():
    """The wait's cycles: HOST_MARGIN × host_ms at the highest clock, bounded below and above."""
    khz = 1_980_000  # an H200's highest SM clock, in kHz
    assert harness.wait_cycles(0.01, khz) == harness.GPU_WAIT_CYCLES  # short host side: the shortest wait
    assert harness.wait_cycles(math.nan, khz) == harness.GPU_WAIT_CYCLES
    assert harness.wait_cycles(1.0, khz) == math.ceil(harness.HOST_MARGIN * khz)  # 1 ms: 1.5 ms of cycles
    assert harness.wait_cycles(1.0, 1_000_000) < harness.wait_cycles(1.0, khz)  # cycles, not time
    assert harness.wait_cycles(1e4, khz) == math.ceil(harness.MAX_WAIT_MS * khz)
    assert harness.wait_cycles(1.0, 0) == math.ceil(harness.HOST_MARGIN * 2_000_000)  # no clock reported


@pytest.mark.gpu
def test_host_ms_is_what_the_gpu_time_leaves_out():
    """The same call: 50 µs on the host, a few µs on the GPU; host_ms sees the 50 µs. A call that
    synchronises pays the GPU work before it on the host too."""
    call = _host_then_gpu(50e-6)

    timing = harness.time_gpu(call, warmup_ms=2, rep_ms=10)
    assert 0.05 <= timing.host_ms < 1.0 and timing.host_ms > 2 * timing.ms_median
    a = torch.randn(4096, 4096, device="cuda")

    def synchronising():
        a @ a
        return (a[0, 0] > 0).item()  # a host synchronisation: waits for the product

    product = harness.time_gpu(lambda: a @ a, warmup_ms=2, rep_ms=10)
    assert harness.host_time(synchronising) >= 0.8 * product.ms_median
    metrics = harness.measure(lambda: a @ a, warmup_ms=2, rep_ms=10)
    assert 0 < metrics["host_ms"] < metrics["ms_median"]  # launching a 4096³ product is quick


@pytest.mark.gpu
def test_peak_extra_memory_counts_the_call():
    mib = harness.peak_extra_memory_mib(lambda: torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda"))
    assert 64.0 <= mib < 80.0


def test_host_time_is_the_median_host_time_of_a_call(monkeypatch):
    monkeypatch.setattr(harness.torch.cuda, "synchronize", lambda *a, **k: None)  # no GPU here
    calls = []

    def call():
        calls.append(1)
        time.sleep(0.002 if len(calls) % 7 else 0.05)  # one slow call in seven: the median ignores it

    ms = harness.host_time(call, reps=21)
    assert len(calls) == 21
    assert 1.9 <= ms < 10


# ---------------------------------------------------------------------------------------------------
# Repeat rounds (step 6), with the fake timer of tests/fake_harness.py
# ---------------------------------------------------------------------------------------------------


def _point(fake_timing, rounds: int, names=("a", "b"), agains=None, warmup_ms=4.0, rep_ms=8.0):
    """One point's rows: each name's callable measured inside ``Rounds(rounds)``, then the rounds run; the
    names of the callables in the order they were called."""
    called: list[str] = []
    rows: list[dict] = []
    spread = harness.Rounds(rounds, rows)
    for name in names:
        call = lambda n=name: called.append(n)
        again = (agains or {}).get(name)
        rows.append({"impl": name, "status": "ok", "message": "", **harness.measure(call, warmup_ms, rep_ms, again)})
    spread.run()
    return rows, called


def test_repeat_rounds_interleave_the_implementations_of_a_point(fake_timing):
    """Round after round, each implementation once in turn (a, b, a, b, a, b), each round a quarter of the
    point's warm-up and repetition time; each row gets its round count and lowest and highest round median."""
    import fake_harness

    rows, called = _point(fake_timing, 3)
    # measuring calls each twice (peak memory, then the fake timing), then the rounds one each
    assert called == ["a", "a", "b", "b", "a", "b", "a", "b", "a", "b"]
    assert [(w, r) for _, w, r in fake_timing.rounds] == [(1.0, 2.0)] * 6
    low, high = min(fake_harness.ROUND_MS), max(fake_harness.ROUND_MS)
    for row in rows:
        assert (row["spread_rounds"], row["ms_round_min"], row["ms_round_max"]) == (3, low, high)
        assert row["ms_median"] == fake_harness.MS  # the main timing is the row's median, alone


def test_no_rounds_no_spread_columns(fake_timing):
    rows, called = _point(fake_timing, 0)
    assert called == ["a", "a", "b", "b"] and fake_timing.rounds == []
    assert not any(set(harness.SPREAD_COLUMNS) & set(row) for row in rows)  # a row's maker leaves them empty
    outside = harness.measure(lambda: None, 1.0, 1.0)  # no Rounds made: no spread columns at all
    assert not set(harness.SPREAD_COLUMNS) & set(outside)


def test_a_round_builds_its_callable_with_again(fake_timing):
    """``again`` makes the callable of each round (a backward pass builds its forward graph anew in each)."""
    built: list[int] = []

    def again():
        built.append(1)
        return lambda: None

    rows, called = _point(fake_timing, 2, names=("a",), agains={"a": again})
    assert len(built) == 2 and called == ["a", "a"]  # the rounds time what again() made, not the first callable
    assert rows[0]["spread_rounds"] == 2


def test_rows_that_did_not_finish_get_no_rounds(fake_timing):
    called: list[str] = []
    rows: list[dict] = []
    spread = harness.Rounds(3, rows)
    metrics = harness.measure(lambda: called.append("x"), 4.0, 8.0)
    rows.append({"impl": "x", "status": "error", "message": "failed after timing", **metrics})
    spread.run()
    assert called == ["x", "x"] and fake_timing.rounds == []
    assert all(math.isnan(rows[0][c]) for c in harness.SPREAD_COLUMNS)


def test_a_failing_round_keeps_the_rounds_before_it_and_says_why(fake_timing):
    count = [0]

    def call():
        count[0] += 1
        if count[0] == 4:  # peak memory, the timing, the first round; then the second round fails
            raise RuntimeError("illegal memory access")

    rows: list[dict] = []
    spread = harness.Rounds(3, rows)
    rows.append({"impl": "x", "status": "ok", "message": "note", **harness.measure(call, 4.0, 8.0)})
    spread.run()
    row = rows[0]
    assert row["spread_rounds"] == 1 and row["ms_round_min"] == row["ms_round_max"]
    assert row["message"] == "note; repeat round 2 of 3 failed: RuntimeError: illegal memory access"
    assert count[0] == 4  # no further round of it


def test_rounds_left_by_an_exception_leave_no_placeholder(fake_timing):
    rows: list[dict] = []
    with pytest.raises(ZeroDivisionError), harness.Rounds(3, rows):
        rows.append({"impl": "x", "status": "ok", "message": "", **harness.measure(lambda: None, 4.0, 8.0)})
        raise ZeroDivisionError("the point's loop failed")
    assert fake_timing.rounds == [] and all(math.isnan(rows[0][c]) for c in harness.SPREAD_COLUMNS)
    assert not set(harness.SPREAD_COLUMNS) & set(harness.measure(lambda: None, 1.0, 1.0))  # closed


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_rounds_must_be_a_whole_number(bad):
    with pytest.raises(ValueError, match="rounds must be a whole number >= 0"):
        harness.Rounds(bad, [])


def test_the_round_scale_is_the_cost_models():
    from analysis.core import costs

    assert costs.ROUND_SCALE == harness.ROUND_SCALE


@pytest.mark.gpu
def test_a_round_times_what_the_main_timing_times():
    x = torch.randn(2048, 2048, device="cuda")
    timing = harness.time_gpu(lambda: x @ x, warmup_ms=5, rep_ms=20)
    rounds = [harness.time_round(lambda: x @ x, timing, 2, 5) for _ in range(3)]
    assert all(0.8 * timing.ms_median < r < 1.25 * timing.ms_median for r in rounds)
    assert timing.rep_estimate_ms > timing.ms_median and timing.wait >= harness.GPU_WAIT_CYCLES
