"""What the evaluators judge from: every result table of the report, per GPU type, and the file each came from.

``Context.table(name)`` is one table's ``Results`` (``{}`` frames where no GPU has it): ``frames[gpu]`` the
rows (typed by the table's reader: ``causal`` a bool, shapes integers), ``paths[gpu]`` the file (for the
evidence), ``ok(gpu, ...)`` the timed rows that finished, filtered by column values (``tables.finished``),
``rows(gpu, ...)`` every row so filtered. A GPU-independent table (compiled kernels) is keyed
by ``ANALYTIC`` ("-"), as its verdicts are.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from analysis.core.tables import finished, matching

ANALYTIC = "-"  # the gpu column of verdicts (and the key of tables) that do not depend on a GPU


@dataclasses.dataclass
class Results:
    """One table's rows per GPU type (``frames``) and the file each was read from (``paths``)."""

    frames: dict[str, pd.DataFrame] = dataclasses.field(default_factory=dict)
    paths: dict[str, str] = dataclasses.field(default_factory=dict)

    def ok(self, gpu: str, **where) -> pd.DataFrame:
        """Timed rows that finished, filtered by column values (lists mean "any of"; ``tables.finished``)."""
        return finished(self.frames[gpu], **where)

    def rows(self, gpu: str, **where) -> pd.DataFrame:
        """Every row, filtered by column values (``tables.matching``)."""
        df = self.frames[gpu]
        return df[matching(df, where)]

    @property
    def timed(self) -> bool:
        """Whether its rows carry timings (median and p20/p80): what the borderline band moves."""
        return any({"ms_median", "ms_p20", "ms_p80"} <= set(df.columns) for df in self.frames.values())


@dataclasses.dataclass
class Context:
    """Every table the evaluators may read, by name (``attention``, ``ops``, ``traffic``, ``compiled``, ...)."""

    tables: dict[str, Results] = dataclasses.field(default_factory=dict)

    def table(self, name: str) -> Results:
        return self.tables.get(name) or Results()
