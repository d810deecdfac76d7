"""The lines of a GPU's measured summary (``reports/reference/<gpu>/summary.md``, the README's table): what a
family's ``summary.py`` returns, and the words they share (``span``, a range, is the verdicts' too).

A ``Line`` says what was measured, the value computed from the shipped tables (ranges as ``lo–hi``), the target
it is held against where there is one, and whether it is met (``yes``, ``no``, ``partly``: at some points).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import pandas as pd


@dataclasses.dataclass(frozen=True)
class Line:
    what: str
    measured: str
    target: str = ""
    met: str = ""


def met(flags: Iterable[bool]) -> str:
    """``yes`` when every point meets the target, ``no`` when none does, else ``partly``."""
    flags = [bool(f) for f in flags]
    if not flags:
        return ""
    return "yes" if all(flags) else "no" if not any(flags) else "partly"


def span(values, fmt: str = ".2f", unit: str = "×", empty: str = "—") -> str:
    """``lo–hi<unit>`` of the values that are numbers (one value when they round alike; ``empty`` when there
    are none): the one way a range is written, in the summaries and in the verdicts."""
    values = [float(v) for v in values if not pd.isna(v)]
    if not values:
        return empty
    lo, hi = min(values), max(values)
    return f"{lo:{fmt}}{unit}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}–{hi:{fmt}}{unit}"


def kilo(n: float) -> str:
    """A sequence length as people write it: 32768 → 32K."""
    n = int(n)
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)
