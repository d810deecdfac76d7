"""The one benchmark harness. Every timed number in the project comes from here.

Method, per benchmark point:

1. Inputs are built (and the float64 reference computed) before anything is timed.
2. Correctness gates speed: the implementation runs once, which also compiles and autotunes it, and its
   output is compared with the float64 reference under the tolerance policy (``kernels.tolerance``).
   A point that fails the check is recorded as ``mismatch`` and never timed.
3. Peak extra memory: after a synchronise and ``reset_peak_memory_stats``, one call runs;
   ``max_memory_allocated`` minus what was allocated before the call is the memory the call itself
   needed (workspace, intermediates such as the N×N scores, and the output).
4. Timing: once per process and device, about 200 ms of back-to-back matrix products first (the first
   point of an H200 shard, timed without it, drew 124 W against 175-215 W for the next ones, and its
   median was 1.6× the same kernel's at the next M, its 20th and 80th percentiles 1.4× apart); then per
   point about ``warmup_ms`` of untimed repetitions, then repetitions for about ``rep_ms``, each timed
   with CUDA events. Every repetition is preceded by overwriting a 256 MB buffer, so that the L2 cache
   holds none of the inputs, and by a GPU-side wait (``torch.cuda._sleep``), so that the host has queued
   the call before the start event fires; we report the median and the 20th/80th percentiles. The wait
   makes the number GPU time even for a call whose host side (argument handling, launches) takes longer
   than overwriting the buffer: without it (as with ``triton.testing.do_bench``) such a call's timings
   include part of its host side, varying from run to run. It lasts ``HOST_MARGIN`` times the call's
   host side (``host_ms``, below; at the GPU's highest clock, so at least that long), and never less than
   ``GPU_WAIT_CYCLES`` (about 100 µs): a fixed 100 µs let the host side of FP8 attention's end-to-end
   call (about 1 ms on an H200) into its timings. A call that synchronises inside still shows the host's
   share after the synchronisation: no wait before it can hide that.
   Because the wait hides the host side, that is measured on its own (``host_ms``): before the timed
   repetitions, ``HOST_REPS`` calls, each timed with the host's clock from a synchronised, idle GPU to the
   call's return (its launches queued, not finished), the median kept. That is what one eager call costs
   the host: argument checks, allocations, launches, and any synchronisation the call makes (then the GPU
   work before it too). A call issued back to back costs about the larger of ``host_ms`` and
   ``ms_median``; where the two differ by more than 20% the operator figures show both.
5. Telemetry: while the point is timed, a thread samples NVML every 10 ms (SM and memory clock,
   temperature, power), so that a throttled measurement can be recognised in the tables.
6. Run-to-run spread: between two runs a median moves by more than its own p20-p80 band, which is the
   spread of single calls within one block of repetitions (clocks, temperature and power differ from one
   run, and one moment, to the next). So, where an experiment asks for it (``spread_rounds``; 3 in the
   default grid), each point is timed again in repeat rounds once every implementation of it was measured
   (``Rounds``): round after round, each implementation's callable in turn, interleaved with its baselines
   (A, B, C, A, B, C, ...), each round step 4 again at ``ROUND_SCALE`` (a quarter) of the point's warm-up
   and repetition time (as many warm-up calls as fit in it, none for a call that outlasts it, and at least
   one timed call), with the wait and the repetition estimate of the point's own timing; each round's
   median is kept. Spacing: between an implementation's main timing and its first round lie the gates,
   compiles and timings of the point's other implementations (seconds on an H200), between two of its
   rounds one round of each other implementation, so the rounds meet other clock and thermal states than
   the main timing did, while the ratios between the point's implementations are taken close in time. A
   row records how many rounds it was timed in (``spread_rounds``) and the lowest and highest round
   median (``ms_round_min``, ``ms_round_max``); its median and p20/p80 stay the main timing's. The audit's
   borderline band widens each row's p20-p80 to them (``analysis.audit.band``). What the rounds cannot
   see: what is fixed for a whole process (an autotuner's choice, the memory layout) and GPU states no
   round met; ``analysis.compare_verdicts`` compares two result sets' verdicts. A round that fails leaves
   the row the rounds before it, and its message says why.

What is timed is a callable the experiment builds (``analysis.families._shared.attention_measure``): the forward call;
for the backward alone, ``torch.autograd.grad`` on a forward graph built beforehand; or both. Steps 2-5
apply to it unchanged, and the gradients are gated against float64 like the output.

Failures become statuses, never crashes: out of memory → ``oom``; an implementation that refuses the
input (our kernels' TypeError/ValueError/NotImplementedError, SDPA's "no available kernel") →
``unsupported``; anything else → ``error``; each with its message.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable

import torch

DEFAULT_WARMUP_MS = 25
DEFAULT_REP_MS = 100


GPU_WAIT_CYCLES = 200_000  # the shortest GPU-side wait: about 100 µs at the H200's 1.98 GHz


@dataclasses.dataclass(frozen=True)
class Timing:
    ms_median: float
    ms_p20: float
    ms_p80: float
    host_ms: float = math.nan  # the host-side cost of one eager call (module docstring, step 4)
    wait: int = GPU_WAIT_CYCLES  # the GPU-side wait before each repetition, in clock cycles (step 4)
    rep_estimate_ms: float = math.nan  # one repetition with its flush and wait: how many fit in a time


_WARMED: set[int] = set()


def warm_device(ms: float = 200.0) -> None:
    """About ``ms`` of back-to-back 4096² matrix products on the current GPU, once per process and device
    (nothing without a GPU)."""
    if not torch.cuda.is_available():
        return
    device = torch.cuda.current_device()
    if device in _WARMED:
        return
    _WARMED.add(device)
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    start = time.perf_counter()
    while time.perf_counter() - start < ms / 1e3:
        for _ in range(8):
            a @ a
        torch.cuda.synchronize()
    del a


HOST_MARGIN = 1.5  # the wait against the call's host time (module docstring, step 4)
MAX_WAIT_MS = 50.0  # (a call that spends longer on the host is mostly synchronising, which no wait hides)
HOST_REPS = 21  # eager calls timed on the host for host_ms
FLUSH_BYTES = 256 * 2**20
_FLUSH: dict[int, torch.Tensor] = {}


def _flush_buffer() -> torch.Tensor:
    device = torch.cuda.current_device()
    flush = _FLUSH.get(device)
    if flush is None:
        flush = _FLUSH[device] = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    return flush


def _repetitions(fn: Callable[[], object], wait: int, warmup: int, reps: int) -> torch.Tensor:
    """``warmup`` untimed then ``reps`` timed calls of ``fn``, each after the L2 flush and the GPU-side wait of
    ``wait`` cycles (step 4); the times in ms."""
    flush = _flush_buffer()
    event = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731

    def prepare():  # before every repetition: the L2 flushed, then the wait that covers the host side
        flush.zero_()
        torch.cuda._sleep(wait)

    for _ in range(warmup):  # warm-up repetitions like the timed ones
        prepare()
        fn()
    starts, ends = [event() for _ in range(reps)], [event() for _ in range(reps)]
    for i in range(reps):
        prepare()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return torch.tensor([s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)], dtype=torch.float64)


def time_gpu(fn: Callable[[], object], warmup_ms: float = DEFAULT_WARMUP_MS, rep_ms: float = DEFAULT_REP_MS) -> Timing:
    """Median and 20th/80th percentile time of ``fn`` in ms (method in the module docstring, step 4)."""
    warm_device()
    device = torch.cuda.current_device()
    flush = _flush_buffer()
    event = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    host_ms = host_time(fn)
    wait = wait_cycles(host_ms, torch.cuda.get_device_properties(device).clock_rate)

    # the number of repetitions, from 5 calls with their flushes and waits (so that rep_ms is the wall time)
    start, end = event(), event()
    start.record()
    for _ in range(5):
        flush.zero_()
        torch.cuda._sleep(wait)
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)  # ms of one repetition, flush and wait included
    times = _repetitions(fn, wait, max(1, int(warmup_ms / estimate)), max(1, int(rep_ms / estimate)))
    med, p20, p80 = torch.quantile(times, torch.tensor([0.5, 0.2, 0.8], dtype=torch.float64)).tolist()
    return Timing(float(med), float(p20), float(p80), host_ms, wait, estimate)


ROUND_SCALE = 0.25  # a repeat round's warm-up and repetition time against the point's (step 6)


def time_round(fn: Callable[[], object], timing: Timing, warmup_ms: float, rep_ms: float) -> float:
    """The median time of ``fn`` in ms over one repeat round (step 6): step 4's repetitions for about
    ``warmup_ms`` (none where one outlasts it: the previous round kept the GPU busy) and ``rep_ms`` (at least
    one), with the wait and the repetition estimate of the point's main ``timing`` (no host timing, no
    estimate of its own)."""
    estimate = timing.rep_estimate_ms if timing.rep_estimate_ms > 0 else 1.0
    times = _repetitions(fn, timing.wait, int(warmup_ms / estimate), max(1, int(rep_ms / estimate)))
    return float(torch.quantile(times, 0.5))


def wait_cycles(host_ms: float, clock_khz: int) -> int:
    """GPU clock cycles of the wait before each timed call: ``HOST_MARGIN`` × ``host_ms`` at the GPU's
    highest clock ``clock_khz`` (so at least that long at any clock), no fewer than ``GPU_WAIT_CYCLES``, no
    longer than ``MAX_WAIT_MS`` (step 4)."""
    ms = min(HOST_MARGIN * host_ms, MAX_WAIT_MS) if math.isfinite(host_ms) else 0.0
    clock_khz = clock_khz if clock_khz > 0 else 2_000_000  # (a device that reports no clock: 2 GHz)
    return max(GPU_WAIT_CYCLES, math.ceil(ms * clock_khz))


def host_time(fn: Callable[[], object], reps: int = HOST_REPS) -> float:
    """Median host time of one call of ``fn`` in ms, from a synchronised GPU to the call's return (step 4)."""
    host = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        host.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    host.sort()
    return 1e3 * host[len(host) // 2]


def measure(
    call: Callable[[], object],
    warmup_ms: float,
    rep_ms: float,
    again: Callable[[], Callable[[], object]] | None = None,
) -> dict:
    """Steps 3-5 for one point: peak extra memory of one call, then its timing with NVML telemetry sampled
    while it is timed (the once-per-process warm-up runs before the sampling starts). Inside ``Rounds``
    (step 6) the call is also registered for the point's repeat rounds: ``again()`` gives the callable each
    round times (for one that holds much memory, such as a retained autograd graph, a new one per round;
    by default ``call`` itself, kept until the rounds)."""
    warm_device()
    metrics = {"peak_mem_mib": peak_extra_memory_mib(call)}
    with Telemetry() as tel:
        t = time_gpu(call, warmup_ms, rep_ms)
    metrics.update(tel.summary())
    metrics.update(ms_median=t.ms_median, ms_p20=t.ms_p20, ms_p80=t.ms_p80, host_ms=t.host_ms)
    if _OPEN is not None:
        metrics.update(_OPEN.register(again or (lambda: call), t, warmup_ms, rep_ms))
    return metrics


# A row's columns of step 6: the rounds it was timed in, the lowest and the highest round median (ms).
SPREAD_COLUMNS = ("spread_rounds", "ms_round_min", "ms_round_max")


@dataclasses.dataclass
class _Entry:
    """One callable registered for repeat rounds, and what its rounds gave."""

    again: Callable[[], Callable[[], object]]
    timing: Timing
    warmup_ms: float
    rep_ms: float
    medians: list[float] = dataclasses.field(default_factory=list)
    failure: str = ""


@dataclasses.dataclass(frozen=True, eq=False)
class _Pending:
    """What the spread columns of a registered row hold until its rounds ran (never left in a row)."""

    owner: Rounds
    index: int


class Rounds:
    """Step 6 for one point. From when it is made until ``run``, ``measure`` registers every callable it times
    with it, and the metrics it returns hold placeholders in the spread columns (``SPREAD_COLUMNS``), which the
    point's rows carry into ``rows`` (the list they are appended to). ``run`` then times ``rounds`` repeat
    rounds of every callable whose row finished (``ok``), in the order they were registered, one round of
    each in turn, and gives each such row the number of rounds it was timed in and the lowest and highest
    round median (NaN without a round). ``rounds`` 0: nothing is registered and the columns stay empty. One
    point at a time: making a new one drops one that an exception left open (its rows are gone with it). As
    a context manager, leaving it runs it (after an exception: only fills the rows, no rounds)."""

    def __init__(self, rounds: int, rows: list[dict], scale: float = ROUND_SCALE):
        global _OPEN
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
            raise ValueError(f"rounds must be a whole number >= 0, got {rounds!r}")
        self.rounds, self.rows, self.scale = rounds, rows, scale
        self.entries: list[_Entry] = []
        _OPEN = self if rounds else None

    def __enter__(self) -> Rounds:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.run()
        else:
            self._close()
            self._fill()
        return False

    def register(self, again: Callable[[], Callable[[], object]], timing: Timing, warmup_ms: float, rep_ms: float):
        """Register one timed callable (``measure`` does); returns the placeholders of its row's spread columns."""
        token = _Pending(self, len(self.entries))
        self.entries.append(_Entry(again, timing, warmup_ms, rep_ms))
        return dict.fromkeys(SPREAD_COLUMNS, token)

    def run(self) -> None:
        """Stop registering, time the rounds, and fill the spread columns of the rows."""
        self._close()
        try:
            self._time()
        finally:
            self._fill()

    def _close(self) -> None:
        global _OPEN
        if _OPEN is self:
            _OPEN = None

    def _placed(self) -> dict[int, list[dict]]:
        """Registered entry → the rows that carry its placeholders."""
        out: dict[int, list[dict]] = {}
        for row in self.rows:
            token = row.get(SPREAD_COLUMNS[0])
            if isinstance(token, _Pending) and token.owner is self:
                out.setdefault(token.index, []).append(row)
        return out

    def _time(self) -> None:
        placed = self._placed()
        live = [self.entries[i] for i in sorted(placed) if any(r.get("status") == "ok" for r in placed[i])]
        for _ in range(self.rounds):
            for e in live:
                if e.failure:
                    continue
                try:
                    fn = e.again()
                    e.medians.append(time_round(fn, e.timing, self.scale * e.warmup_ms, self.scale * e.rep_ms))
                    del fn
                except Exception as exc:  # the rounds before it stand; the row says why there are no more
                    e.failure = classify(exc)[1]
                    release_memory()

    def _fill(self) -> None:
        for i, rows in self._placed().items():
            e = self.entries[i]
            for row in rows:
                done = e.medians if row.get("status") == "ok" else []
                row.update(
                    spread_rounds=len(done) if done else math.nan,
                    ms_round_min=min(done) if done else math.nan,
                    ms_round_max=max(done) if done else math.nan,
                )
                if e.failure and row.get("status") == "ok":
                    why = f"repeat round {len(done) + 1} of {self.rounds} failed: {e.failure}"
                    row["message"] = f"{row['message']}; {why}" if row.get("message") else why
        self.entries.clear()


_OPEN: Rounds | None = None  # the point's Rounds while it registers


def peak_extra_memory_mib(fn: Callable[[], object], device: torch.device | None = None) -> float:
    """Peak memory allocated during one call of ``fn`` beyond what was allocated before it, in MiB."""
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    del out
    return (peak - before) / 2**20


class Telemetry:
    """NVML sampler used as a context manager; ``summary()`` gives means (clocks, power) and max (temp)."""

    FIELDS = ("sm_clock_mhz", "mem_clock_mhz", "temp_c", "power_w")

    def __init__(self, index: int = 0, interval_s: float = 0.01):
        self.index = index
        self.interval_s = interval_s
        self.samples: list[tuple[float, float, float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:  # no NVML (CPU machine, or a driver without it): telemetry stays empty
            self._nvml = None

    def _sample(self):
        n, h = self._nvml, self._handle
        return (
            float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
            float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)),
            float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
            n.nvmlDeviceGetPowerUsage(h) / 1000.0,
        )

    def _run(self):
        while not self._stop.is_set():
            try:
                self.samples.append(self._sample())
            except Exception:
                return
            self._stop.wait(self.interval_s)

    def __enter__(self):
        if self._handle is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        return False

    def summary(self) -> dict:
        if not self.samples:
            return {k: math.nan for k in self.FIELDS}
        cols = list(zip(*self.samples, strict=True))
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        return {
            "sm_clock_mhz": mean(cols[0]),
            "mem_clock_mhz": mean(cols[1]),
            "temp_c": max(cols[2]),
            "power_w": mean(cols[3]),
        }


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return "out of memory" in text and "shared memory" not in text


def classify(exc: BaseException) -> tuple[str, str]:
    """Map an exception from an implementation to a (status, message) pair for its row."""
    message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]
    if is_oom(exc):
        return "oom", message
    if isinstance(exc, (TypeError, ValueError, NotImplementedError)):
        return "unsupported", message
    text = str(exc)
    # SDPA refuses a pinned backend with "No available kernel" on CUDA and "No viable backend" on CPU
    if any(s in text for s in ("No available kernel", "No viable backend")) or "not supported" in text.lower():
        return "unsupported", message
    return "error", message


def release_memory() -> None:
    """Return cached blocks after an OOM so the next point starts clean."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class Progress:
    """``[done/total] description`` lines with elapsed time, for each rule's log."""

    def __init__(self, total: int, log: Callable[[str], None]):
        self.total = total
        self.done = 0
        self.log = log
        self.start = time.monotonic()

    def step(self, description: str, status: str) -> None:
        self.done += 1
        self.log(f"[{self.done}/{self.total}] {description}: {status} ({time.monotonic() - self.start:.1f} s)")
