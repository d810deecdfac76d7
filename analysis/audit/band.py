"""Borderline verdicts: every measured verdict judged again across the band of the timings it reads.

A measured verdict rests on median times, and a rerun's medians fall elsewhere; a verdict that another run
could flip should say so. Each timed row's band runs from its p20 to its p80 (the spread of single calls in
its block of repetitions), widened where the row carries repeat rounds (the harness's step 6: the point's
implementations timed again in turn after all were measured, ``ms_round_min`` and ``ms_round_max``, the
lowest and highest round median) to cover them: from the lower of p20 and the lowest round median to the
higher of p80 and the highest. That is the run-to-run spread the run measured and no more; rows without
rounds (the shipped tables before them) keep p20-p80. So a verdict whose value lies within its rows' spread
of an edge is borderline in the run on either side of the edge, and a rerun that changes it was flagged in
both (``analysis.compare_verdicts`` checks that between two result sets).

Every verdict that reads the timings (found generically: the claim is re-judged with every time blanked
out, and one whose verdict, observed value or note changes depends on them) is judged again across the
band: every timed row's time moved from its median towards its band's lower or upper end (and its TFLOP/s
and GB/s with it, which are per median time), at ``BAND_LEVELS`` along the way, along ``band_paths`` (every
row the same way; and, so that a ratio of two implementations reaches both its extremes, one set of
implementations one way and the rest the other, for partitions of the implementations that separate every
pair; a split that leaves all the rows a claim reads on one side is recognised at its ends and not walked).
A verdict that changes anywhere on the way is **borderline**: ``band`` lists the verdicts reached,
``borderline`` is True. Nothing is random: the same tables give the same verdicts and bands. The levels are
eight steps from the lower end to the upper: a verdict whose window lies inside the band but is narrower
than a step can be missed.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np
import pandas as pd

from analysis.audit.claims import Claim
from analysis.audit.context import ANALYTIC, Context, Results
from analysis.audit.verdicts import Verdict

# Where in its band each timed row's time is put: 0 = its lower end (p20, or a lower round median), 0.5 = its
# median, 1 = its upper end (p80, or a higher round median); linear in between, on each side of the median.
# Eight steps: a verdict whose "holds" window spans more than an eighth of the way from the median to an end
# is not stepped over.
BAND_LEVELS = (0.0, 0.125, 0.25, 0.375, 0.625, 0.75, 0.875, 1.0)


TIMED = "ms_median"


PER_TIME = ("tflops", "gbps")  # per median time: scaled with it


ROUNDS = ("ms_round_min", "ms_round_max")  # the lowest and highest repeat-round median (harness, step 6)


def _column(df: pd.DataFrame, col: str) -> np.ndarray:
    if col not in df.columns:
        return np.full(len(df), math.nan)
    return pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=float)


def ends(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each row's band: from the lower of its p20 and its lowest round median to the higher of its p80 and its
    highest round median (NaN rounds: p20 to p80)."""
    low, high = (_column(df, c) for c in ROUNDS)
    return np.fmin(_column(df, "ms_p20"), low), np.fmax(_column(df, "ms_p80"), high)


def _at_levels(df: pd.DataFrame, level: np.ndarray) -> pd.DataFrame:
    """``df`` with each row's time at ``level`` of its band (``ends``; rows without one keep their median)."""
    med = pd.to_numeric(df[TIMED], errors="coerce").to_numpy(dtype=float)
    lo, hi = ends(df)
    t = np.where(level < 0.5, lo + (med - lo) * (2 * level), med + (hi - med) * (2 * level - 1))
    t = np.where(np.isfinite(t) & (t > 0), t, med)
    out = df.copy()
    out[TIMED] = t
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = med / t
    for col in PER_TIME:
        if col in out.columns:
            out[col] = pd.to_numeric(out[col], errors="coerce").to_numpy(dtype=float) * factor
    return out


def _blanked(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    for col in (TIMED, *PER_TIME):
        if col in out.columns:
            out[col] = math.nan
    return out


def _with_tables(ctx: Context, change: Callable[[pd.DataFrame], pd.DataFrame]) -> Context:
    """``ctx`` with ``change`` applied to every table of every GPU whose rows carry timings (``Results.timed``:
    the traffic and compiled-kernel tables have none)."""
    moved = {
        name: Results({g: change(d) for g, d in r.frames.items()}, r.paths) if r.timed else r
        for name, r in ctx.tables.items()
    }
    return Context(moved)


def band_paths(ctx: Context) -> list[Callable[[float], Context]]:
    """The ways through the band: ``path(level)`` is the context with the timings at ``level``. The first
    moves every row alike; then, for each bit of the implementations' index (all tables' implementation
    names, sorted), the implementations with that bit set go to ``level`` and the others to 1 − level.
    Two implementations differ in some bit, so every pair is pulled apart along some path."""
    frames = [d for r in ctx.tables.values() if r.timed for d in r.frames.values()]
    impls = sorted({str(i) for d in frames for i in d["impl"].dropna().unique()})
    index = {name: i for i, name in enumerate(impls)}
    bits = max(1, math.ceil(math.log2(len(impls)))) if len(impls) > 1 else 0

    def together(level: float) -> Context:
        return _with_tables(ctx, lambda d: _at_levels(d, np.full(len(d), level)))

    def apart(bit: int) -> Callable[[float], Context]:
        def path(level: float) -> Context:
            def change(d: pd.DataFrame) -> pd.DataFrame:
                ones = d["impl"].astype(str).map(index).fillna(0).astype(int).to_numpy() >> bit & 1
                return _at_levels(d, np.where(ones == 1, level, 1.0 - level))

            return _with_tables(ctx, change)

        return path

    return [together] + [apart(b) for b in range(bits)]


def _fingerprint(verdicts: list[Verdict]) -> list[tuple[str, str, str, str]]:
    return [(v.gpu, v.verdict, v.observed, v.note) for v in verdicts]


class Band:
    """The band's contexts (built when first needed, once per audit) and the re-judging of one claim."""

    def __init__(self, ctx: Context, judge: Callable[[Claim, Context], list[Verdict]]):
        self.ctx = ctx
        self.judge = judge
        self._paths: list[Callable[[float], Context]] | None = None
        self._at: dict[tuple[int, float], Context] = {}
        self._blank: Context | None = None

    def paths(self) -> list[Callable[[float], Context]]:
        if self._paths is None:
            self._paths = band_paths(self.ctx)
        return self._paths

    def at(self, path: int, level: float) -> Context:
        if (path, level) not in self._at:
            self._at[path, level] = self.paths()[path](level)
        return self._at[path, level]

    def blank(self) -> Context:
        if self._blank is None:
            self._blank = _with_tables(self.ctx, _blanked)
        return self._blank

    def reached(self, claim: Claim, base: list[Verdict]) -> list[set[str]]:
        """The verdicts each of ``base`` (the claim's verdicts at the medians) reaches across the band; a
        verdict that does not read the timings reaches only itself, an untestable or analytic one nothing.

        The every-row-alike path is walked at every level; each implementation-split path is first tried
        at its two ends, and walked only when they differ from the every-row-alike path's two ends (in the
        same or the mirrored order): when they do not, the rows the claim reads are all on one side of the
        split, and the path is the every-row-alike one again (or it mirrored)."""
        reached = [{v.verdict} if v.gpu != ANALYTIC and v.verdict != "untestable" else set() for v in base]
        if not any(reached) or not any(r.frames for r in self.ctx.tables.values() if r.timed):
            return reached
        try:
            with warnings.catch_warnings():  # pandas on all-NaN columns: expected here, not news
                warnings.simplefilter("ignore")
                blank = self.judge(claim, self.blank())
            if _fingerprint(blank) == _fingerprint(base):
                return reached  # the same without any timing: the verdicts do not rest on them
        except Exception:  # an evaluator that cannot work without timings reads them
            pass

        def judge(path: int, level: float) -> list[tuple[str, str, str, str]]:
            moved = self.judge(claim, self.at(path, level))
            _collect(base, moved, reached)
            return _fingerprint(moved)

        low, high = judge(0, 0.0), judge(0, 1.0)
        for level in BAND_LEVELS[1:-1]:
            judge(0, level)
        for path in range(1, len(self.paths())):
            if (judge(path, 0.0), judge(path, 1.0)) in ((low, high), (high, low)):
                continue
            for level in BAND_LEVELS[1:-1]:
                judge(path, level)
        return reached


def _collect(base: list[Verdict], moved: list[Verdict], reached: list[set[str]]) -> None:
    """Add to ``reached`` the verdicts of ``moved`` (a re-judging), matched to ``base`` by GPU and order."""
    by_gpu: dict[str, list[str]] = {}
    for v in moved:
        by_gpu.setdefault(v.gpu, []).append(v.verdict)
    seen: dict[str, int] = {}
    for i, v in enumerate(base):
        k = seen.get(v.gpu, 0)
        seen[v.gpu] = k + 1
        others = by_gpu.get(v.gpu, [])
        if reached[i] and k < len(others) and others[k] != "untestable":
            reached[i].add(others[k])
