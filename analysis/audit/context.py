"""What the evaluators judge from: every result table of the report, per GPU type, and the file each came from.

``Context.table(name)`` is one table's ``Results`` (``{}`` frames where no GPU has it): ``frames[gpu]`` the
rows (typed by the table's reader: ``causal`` a bool, shapes integers), ``paths[gpu]`` the file.
``select(gpu, ...)`` picks rows by column values (a list means any of them, ``tables.at_most`` /
``tables.at_least`` a bound), by default the timed rows that finished, and returns them as a ``Selection``
with the verdict's evidence written from that same query: the file and the column values, so the evidence
says exactly which rows were read. A GPU-independent table (compiled kernels) is keyed by ``ANALYTIC``
("-"), as its verdicts are.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from analysis.core.tables import describe, finished, matching

ANALYTIC = "-"  # the gpu column of verdicts (and the key of tables) that do not depend on a GPU


@dataclasses.dataclass(frozen=True)
class Selection:
    """Rows an evaluator reads (``rows``) and the evidence naming them: the file they came from and the query
    that picked them (``where``; ``finished``: only timed rows that finished)."""

    rows: pd.DataFrame
    path: str
    where: dict
    finished: bool = True

    @property
    def evidence(self) -> str:
        what = describe(self.where) + (" (finished, timed rows)" if self.finished else "")
        return f"{self.path}: {what.strip()}" if what else self.path

    @property
    def empty(self) -> bool:
        return self.rows.empty

    def narrow(self, **where) -> Selection:
        """The rows that also have these column values; the evidence names them too."""
        return Selection(self.rows[matching(self.rows, where)], self.path, {**self.where, **where}, self.finished)


def evidence(*selections: Selection) -> str:
    """The evidence of a verdict read from several selections: each query once, in order; a file named once."""
    out: list[str] = []
    for sel in selections:
        text = sel.evidence
        if out and text.startswith(sel.path + ": ") and out[-1].startswith(sel.path):
            text = text.removeprefix(sel.path + ": ")
        if text not in out:
            out.append(text)
    return "; ".join(out)


@dataclasses.dataclass
class Results:
    """One table's rows per GPU type (``frames``) and the file each was read from (``paths``)."""

    frames: dict[str, pd.DataFrame] = dataclasses.field(default_factory=dict)
    paths: dict[str, str] = dataclasses.field(default_factory=dict)

    def select(self, gpu: str, finished: bool = True, **where) -> Selection:
        """The rows of ``gpu`` with these column values (by default only timed rows that finished), with the
        evidence that names them."""
        rows = self.ok(gpu, **where) if finished else self.rows(gpu, **where)
        return Selection(rows, self.paths[gpu], where, finished)

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
