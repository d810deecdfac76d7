"""Result tables: the one row format every family writes, composed from shared columns and the family's own.

Every attempted point is one row in long format, whatever happened to it: ``status`` says how it ended and
``message`` why, so a failed or out-of-memory point is visible in the tables and figures instead of
silently missing. A job writes one CSV (``results/<gpu>/<family>/<shard>.csv``); collect concatenates a GPU's
jobs into its tables (``results/<gpu>/<table>.csv``), one per table name: families whose rows share a layout
share a table (attention and FP8 rows in ``attention.csv``, W4A16 and MoE rows in ``ops.csv``).

Columns. ``workflow/schemas/result.schema.yaml`` defines the columns that several families use, once: the
core every table has (``CORE``: experiment, status, message, timestamp), and the identity, timing, error,
telemetry and provenance columns of measured rows. Each family's ``columns.yaml`` lists the columns its rows
carry, in order, and defines those the shared file does not (``analysis.core.family``). ``compose`` makes a
table from its families: the union of their lists in an order consistent with each (``merge_orders``), and
the JSON schema of one row from the definitions, with ``experiment`` restricted to the families' experiments.

Columns a family lists as ``optional`` were added after tables had been shipped; a table without them still
loads and gets them as NaN (or the family's ``defaults``). Any other missing column is an error. Every file
read is validated first (``analysis.core.validate``: columns, types, the status vocabulary, value ranges and
row rules), so a truncated, corrupted or inconsistent table fails the step that reads it, with the file,
line and column named; then the table is typed once, from the same column definitions (``validate.typed``:
``causal`` and ``timed`` are bools, shapes nullable integers, metrics floats), so no reader coerces a column
again. ``finished`` is the one filter for the rows that finished and were timed.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd
import yaml

from analysis.core import outputs, validate
from analysis.core.paths import SCHEMAS

CORE = ("experiment", "status", "message", "timestamp")
SHARED = SCHEMAS / "result.schema.yaml"


@functools.cache
def shared_columns() -> dict[str, dict]:
    """Name → JSON-schema property of every column defined in ``workflow/schemas/result.schema.yaml``."""
    return yaml.safe_load(SHARED.read_text(encoding="utf-8"))["properties"]


@dataclasses.dataclass(frozen=True, eq=False)
class Table:
    """One result table: its columns in order, those older files may lack (and what they mean there), and
    the JSON schema every file of it is validated against."""

    name: str
    columns: tuple[str, ...]
    optional: tuple[str, ...]
    defaults: dict
    schema: dict

    @property
    def statuses(self) -> tuple[str, ...]:
        return tuple(self.schema["properties"]["status"]["enum"])

    def frame(self, rows: Iterable[dict]) -> pd.DataFrame:
        """Rows (dicts) to a frame with exactly the table's columns; unknown keys or statuses are an error."""
        return frame(rows, list(self.columns), self.statuses, self.name)

    def write_rows(self, rows: Iterable[dict], path: str | Path) -> pd.DataFrame:
        """Write one job's rows to ``path`` (CSV, through a temporary file). Returns the frame written."""
        return write_frame(self.frame(rows), path)

    def read_rows(self, paths: Iterable[str | Path]) -> pd.DataFrame:
        """Concatenate CSVs of this table (one per job) into one frame, each file validated first, its columns
        typed once (``read_tables``)."""
        return read_tables(paths, list(self.columns), self.schema, self.optional, self.defaults, self.name)


def merge_orders(lists: Sequence[Sequence[str]]) -> list[str]:
    """The union of ``lists``, each list's order kept: a name new to the result goes right before the next
    name of its own list that is already placed (at the end when there is none)."""
    out: list[str] = []
    for names in lists:
        for i, name in enumerate(names):
            if name in out:
                continue
            later = next((n for n in names[i + 1 :] if n in out), None)
            out.insert(out.index(later) if later is not None else len(out), name)
    return out


def compose(name: str, declared: Sequence[dict], experiments: Sequence[str]) -> Table:
    """The table ``name`` of the families whose ``columns.yaml`` contents are ``declared`` (in registry order)
    and whose experiments are ``experiments``. A column a family defines must not be a shared one, and two
    families of one table must define a column alike."""
    shared = shared_columns()
    own: dict[str, dict] = {}
    for d in declared:
        for col, prop in (d.get("properties") or {}).items():
            if col in shared:
                raise ValueError(f"table {name}: column {col!r} is defined in {SHARED.name}, not by a family")
            if col in own and own[col] != prop:
                raise ValueError(f"table {name}: two families define column {col!r} differently")
            own[col] = prop
    columns = merge_orders([d["columns"] for d in declared])
    missing = [c for c in CORE if c not in columns]
    undefined = [c for c in columns if c not in shared and c not in own]
    if missing or undefined:
        raise ValueError(f"table {name}: core columns {missing} missing, columns {undefined} defined nowhere")
    optional = tuple(c for c in columns if any(c in (d.get("optional") or ()) for d in declared))
    defaults = {k: v for d in declared for k, v in (d.get("defaults") or {}).items()}
    properties = {c: copy.deepcopy(shared.get(c) or own[c]) for c in columns}
    properties["experiment"]["enum"] = list(experiments)
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "description": f"One row of the {name} table: " + " ".join(d.get("description", "").strip() for d in declared),
        "type": "object",
        "additionalProperties": False,
        "required": [c for c in columns if c not in optional],
        "properties": properties,
    }
    return Table(name, tuple(columns), optional, defaults, schema)


def frame(rows: Iterable[dict], columns: list[str], statuses: tuple[str, ...], what: str) -> pd.DataFrame:
    """Rows (dicts) to a frame with exactly ``columns`` in order; unknown keys or statuses are an error."""
    rows = list(rows)
    for r in rows:
        extra = set(r) - set(columns)
        if extra:
            raise ValueError(f"row has columns outside the {what} schema: {sorted(extra)}")
        if r.get("status") not in statuses:
            raise ValueError(f"row status must be one of {statuses}, got {r.get('status')!r}")
    return pd.DataFrame(rows, columns=columns)


def write_frame(df: pd.DataFrame, path: str | Path) -> pd.DataFrame:
    """Write a table to ``path`` (CSV) through a temporary file (``analysis.core.outputs``), creating the
    folder: a job killed mid-write leaves no half file that looks finished."""
    outputs.write_csv(df, path)
    return df


def read_tables(
    paths, columns: list[str], schema: dict | str, optional=(), defaults=None, what: str = "result"
) -> pd.DataFrame:
    """Concatenate CSVs (one per job) into one table with exactly ``columns``, each validated against
    ``schema`` (a dict, or a file of ``workflow/schemas``; ``analysis.core.validate``) first, then typed once by
    it (``validate.typed``). A file without some of the ``optional`` columns (written before they existed) gets
    them as ``defaults`` or empty, each file on its own; any other missing column is an error."""
    if isinstance(schema, str):
        schema = validate.load_schema(schema)
    defaults = defaults or {}
    frames = [validate.read_text(p, schema) for p in paths]
    frames = [f.assign(**{c: _text(defaults.get(c)) for c in optional if c not in f.columns}) for f in frames]
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns, dtype=str)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{what} files lack columns {missing}")
    return validate.typed(df[columns], schema)


def _text(value) -> str:
    """A default as the text of a cell ("" for none)."""
    return "" if value is None or value != value else str(value)


def finished(df: pd.DataFrame | None, **where) -> pd.DataFrame:
    """The rows of a (typed) result table that finished (``status`` ok) and were timed, filtered by column
    values (a list, tuple or set means any of them); an empty frame without a table."""
    if df is None:
        return pd.DataFrame()
    return df[matching(df, where) & (df["status"] == "ok") & df["timed"]]


@dataclasses.dataclass(frozen=True)
class Bound:
    """A column value that is a bound, not a value: ``at_most(16)`` matches cells ≤ 16, ``at_least(4096)`` cells
    ≥ 4096 (in ``matching`` and, written ``m≤16``, in a query's description)."""

    op: str  # "≤" or "≥"
    value: float

    def mask(self, col: pd.Series) -> pd.Series:
        return col <= self.value if self.op == "≤" else col >= self.value

    def __str__(self) -> str:
        return f"{self.op}{self.value:g}"


def at_most(value: float) -> Bound:
    return Bound("≤", value)


def at_least(value: float) -> Bound:
    return Bound("≥", value)


def matching(df: pd.DataFrame, where: dict) -> pd.Series:
    """Where the rows of ``df`` have the column values of ``where`` (a list, tuple or set means any of them, a
    ``Bound`` a range; an empty cell matches nothing)."""
    mask = pd.Series(True, index=df.index)
    for col, val in where.items():
        if isinstance(val, Bound):
            hit = val.mask(df[col])
        elif isinstance(val, (list, tuple, set)):
            hit = df[col].isin(list(val))
        else:
            hit = df[col] == val
        mask &= hit.fillna(False).astype(bool)
    return mask


def describe(where: dict) -> str:
    """A query's column values as the evidence names them: ``experiment=memory, impl=naive,ours-fa2, m≤16``."""
    parts = []
    for col, val in where.items():
        if isinstance(val, Bound):
            parts.append(f"{col}{val}")
        elif isinstance(val, (list, tuple, set)):
            parts.append(f"{col}={','.join(str(v) for v in (sorted(val) if isinstance(val, set) else val))}")
        else:
            parts.append(f"{col}={val}")
    return ", ".join(parts)


def load_provenance(path: str | Path) -> dict:
    """An ``environment.json``, validated (``analysis.core.validate.read_environment``)."""
    return validate.read_environment(path)


def section_mask(df: pd.DataFrame, section: str) -> pd.Series:
    """Rows of ``df`` that belong to ``section``: an experiment, or a family (quant, moe, ...)."""
    hit = df["experiment"] == section
    if "family" in df:
        hit |= df["family"] == section
    return hit
