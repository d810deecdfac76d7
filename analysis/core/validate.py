"""Validation of every file the pipeline reads back: result tables against their schemas, JSON files.

A table that collect, the figures, the audit or the report reads is checked before anything uses it, and
a bad file fails the step with the file, the line and the column named; nothing is dropped, repaired or
passed on silently. The schemas are the ones users read (``workflow/schemas/*.schema.yaml``, one property
per column); what is checked, per file:

- the text: UTF-8, well-formed CSV (an unterminated quote, a row with more or fewer fields than the
  header: a truncated or corrupted file), a header without repeated or unknown columns, and every column
  the schema requires (a column it lists but does not require was added after tables were shipped: older
  tables may lack it, and the table's reader fills it in, ``analysis.core.tables.Table.optional``);
- every cell against its column's property: ``type`` (integer, number, boolean, string; ``null``: may be
  empty), ``enum`` (the status vocabulary, dtypes, modes, …), ``minimum`` / ``maximum`` /
  ``exclusiveMinimum`` (value ranges);
- the rules that tie a row's columns together (``ROW_RULES``): an ``ok`` row's error is within its bound; a
  timed ``ok`` row has a median time; p20 ≤ median ≤ p80; the lowest repeat round's median is not above the
  highest; a row that did not finish says why; an untestable verdict says why, and a verdict is borderline
  exactly when its band has several verdicts.

``read_csv`` returns the validated table with every column typed once, from its property (``typed``):
booleans as bool (pandas' nullable boolean where the column may be empty), integers as nullable integers
(``Int64``), numbers as float, strings as str (an empty cell NaN, or "" with ``keep_default_na=False``), so
that no reader compares a value as text or coerces it again. ``read_json`` checks a JSON file's keys and
their types.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import yaml

from analysis.core.paths import SCHEMAS

MAX_LISTED = 5  # problems listed in one error; the rest are counted


class DataError(ValueError):
    """A file the pipeline reads is malformed or breaks its schema; the message names file, line, column."""


@functools.cache
def load_schema(name: str) -> dict:
    """A row schema of ``workflow/schemas`` by file name (cached)."""
    return yaml.safe_load((SCHEMAS / name).read_text(encoding="utf-8"))


def decode(path: str | Path) -> str:
    """The file's text; a missing file or bytes that are not UTF-8 are a ``DataError`` naming the file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a folder, not a file") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DataError(
            f"{path}, line {line}: not UTF-8 text (byte {exc.start}: {exc.reason}); the file is corrupted"
        ) from None


def _records(path: Path, text: str) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """(header, [(line, fields)]) of a CSV text; malformed CSV is a ``DataError``."""
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, None)
        if header is None:
            raise DataError(f"{path}: empty file, no header (expected a CSV table)")
        records = []
        for fields in reader:
            if fields:  # csv gives [] for a blank line
                records.append((reader.line_num, fields))
    except csv.Error as exc:
        raise DataError(
            f"{path}, line {reader.line_num}: malformed CSV ({exc}); the file is truncated or corrupted"
        ) from None
    return header, records


def _types(prop: dict) -> set[str]:
    t = prop.get("type", "string")
    return set(t) if isinstance(t, list) else {t}


def _check_cell(text: str, prop: dict) -> str | None:
    """What is wrong with one cell (None: nothing)."""
    types = _types(prop)
    if text == "":
        if "null" in types or ("string" in types and "enum" not in prop):
            return None
        return "empty, but the column needs a value"
    value: object = text
    if types & {"integer", "number"} and not types & {"string", "boolean"}:
        try:
            value = float(text)
        except ValueError:
            return "not a number"
        if "integer" in types and "number" not in types and not (math.isfinite(value) and value.is_integer()):
            return "not an integer"
        if math.isnan(value):
            return None if "null" in types else "NaN, but the column needs a value"
    elif "boolean" in types:
        if text not in ("True", "False", "true", "false"):
            return "not True or False"
        return None
    if "enum" in prop and value not in prop["enum"]:
        return f"not one of {prop['enum']}"
    if "minLength" in prop and len(text) < prop["minLength"]:
        return f"shorter than {prop['minLength']} characters"
    if isinstance(value, float):
        if "minimum" in prop and not value >= prop["minimum"]:
            return f"below the minimum {prop['minimum']}"
        if "exclusiveMinimum" in prop and not value > prop["exclusiveMinimum"]:
            return f"not above {prop['exclusiveMinimum']}"
        if "maximum" in prop and not value <= prop["maximum"]:
            return f"above the maximum {prop['maximum']}"
    return None


def _number(row: dict, col: str) -> float | None:
    text = row.get(col, "")
    if text == "":
        return None
    value = float(text)
    return None if math.isnan(value) else value


def _error_within_bound(row: dict) -> tuple[str, str] | None:
    err, bound = _number(row, "max_abs_err"), _number(row, "err_bound")
    if row.get("status") == "ok" and err is not None and bound is not None and not err <= bound:
        return "max_abs_err", f"status ok, but the error {err:.4g} exceeds its bound err_bound {bound:.4g}"
    return None


def _timed_has_time(row: dict) -> tuple[str, str] | None:
    if row.get("status") == "ok" and row.get("timed") in ("True", "true") and _number(row, "ms_median") is None:
        return "ms_median", "a timed ok row without a median time"
    return None


def _quantiles_ordered(row: dict) -> tuple[str, str] | None:
    p20, med, p80 = (_number(row, c) for c in ("ms_p20", "ms_median", "ms_p80"))
    if None not in (p20, med, p80) and not p20 <= med <= p80:
        return "ms_median", f"percentiles out of order: p20 {p20:.4g}, median {med:.4g}, p80 {p80:.4g}"
    return None


def _rounds_ordered(row: dict) -> tuple[str, str] | None:
    low, high = _number(row, "ms_round_min"), _number(row, "ms_round_max")
    if None not in (low, high) and not low <= high:
        return "ms_round_min", f"repeat rounds out of order: lowest median {low:.4g} above the highest {high:.4g}"
    return None


def _failure_says_why(row: dict) -> tuple[str, str] | None:
    if row.get("status") not in (None, "", "ok") and not row.get("message", "").strip():
        return "message", f"status {row['status']} without a message saying why"
    return None


def _untestable_says_why(row: dict) -> tuple[str, str] | None:
    if row.get("verdict") == "untestable" and not row.get("note", "").strip():
        return "note", "an untestable verdict without a note saying why"
    return None


def _borderline_matches_band(row: dict) -> tuple[str, str] | None:
    several = len([v for v in row.get("band", "").split(",") if v.strip()]) > 1
    if (row.get("borderline") in ("True", "true")) != several:
        return "borderline", f"borderline is {row.get('borderline')} but the band is {row.get('band')!r}"
    return None


# (columns it needs, the rule): each returns None or (column, problem)
ROW_RULES: list[tuple[tuple[str, ...], Callable[[dict], tuple[str, str] | None]]] = [
    (("status", "max_abs_err", "err_bound"), _error_within_bound),
    (("status", "timed", "ms_median"), _timed_has_time),
    (("ms_p20", "ms_median", "ms_p80"), _quantiles_ordered),
    (("ms_round_min", "ms_round_max"), _rounds_ordered),
    (("status", "message"), _failure_says_why),
    (("verdict", "note"), _untestable_says_why),
    (("band", "borderline"), _borderline_matches_band),
]


def validate_csv(path: str | Path, schema: dict, text: str | None = None) -> list[str]:
    """Check a CSV file against a row schema; returns its header. Raises ``DataError`` listing the problems."""
    path = Path(path)
    text = decode(path) if text is None else text
    header, records = _records(path, text)
    props = schema["properties"]
    problems = []
    seen = set()
    for col in header:
        if col in seen:
            problems.append(f"{path}, line 1: column {col!r} appears twice in the header")
        seen.add(col)
    unknown = [c for c in header if c not in props]
    if unknown and schema.get("additionalProperties", True) is False:
        problems.append(f"{path}, line 1: columns {unknown} are not in the schema")
    missing = [c for c in schema.get("required", []) if c not in seen]
    if missing:
        problems.append(f"{path}, line 1: required columns {missing} are missing")
    if problems:
        raise DataError("; ".join(problems))
    width = len(header)
    rules = [rule for needs, rule in ROW_RULES if all(c in seen for c in needs)]
    count = 0
    for line, fields in records:
        if len(fields) != width:
            problems.append(
                f"{path}, line {line}: {len(fields)} fields where the header has {width} (a truncated or corrupted row)"
            )
            count += 1
            continue
        row = dict(zip(header, fields, strict=True))
        for col, text_ in row.items():
            if col in props:
                why = _check_cell(text_, props[col])
                if why:
                    count += 1
                    if len(problems) < MAX_LISTED:
                        problems.append(f"{path}, line {line}, column {col!r}: {text_!r} is {why}")
        for rule in rules:
            broken = rule(row)
            if broken:
                count += 1
                if len(problems) < MAX_LISTED:
                    problems.append(f"{path}, line {line}, column {broken[0]!r}: {broken[1]}")
    if problems:
        more = f" (and {count - len(problems)} more problems)" if count > len(problems) else ""
        raise DataError("; ".join(problems[:MAX_LISTED]) + more)
    return header


def read_text(path: str | Path, schema: dict | str) -> pd.DataFrame:
    """The table in ``path`` after ``validate_csv``, every cell as its text ("" when empty); ``typed`` types it."""
    if isinstance(schema, str):
        schema = load_schema(schema)
    text = decode(path)
    validate_csv(path, schema, text)
    return pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)


def read_csv(path: str | Path, schema: dict | str, keep_default_na: bool = True) -> pd.DataFrame:
    """The table in ``path`` after ``validate_csv``, its columns typed by ``schema`` (``typed``: an empty string
    cell NaN, or with ``keep_default_na=False`` "")."""
    if isinstance(schema, str):
        schema = load_schema(schema)
    return typed(read_text(path, schema), schema, keep_default_na)


def kind(prop: dict) -> str:
    """What a column holds by its property: ``boolean``, ``integer``, ``number`` or ``string``."""
    types = _types(prop) - {"null"}
    if types == {"boolean"}:
        return "boolean"
    if types == {"integer"}:
        return "integer"
    if types and types <= {"integer", "number"}:
        return "number"
    return "string"


_BOOLEANS = {"True": True, "true": True, "False": False, "false": False}


def typed_column(text: pd.Series, prop: dict, keep_default_na: bool = True) -> pd.Series:
    """A column of cell texts (``read_text``; NaN or "" where empty) in the type of its property ``prop``."""
    empty = text.isna() | (text.astype(str) == "")
    nullable = "null" in _types(prop) or bool(empty.any())
    what = kind(prop)
    if what == "boolean":
        values = text.where(~empty).map(_BOOLEANS)
        return values.astype("boolean") if nullable else values.astype(bool)
    if what in ("integer", "number"):
        values = pd.to_numeric(text.where(~empty), errors="raise").astype("float64")
        return values.astype("Int64") if what == "integer" else values
    out = text.where(~empty, float("nan") if keep_default_na else "")
    return out.astype(object)


def typed(df: pd.DataFrame, schema: dict, keep_default_na: bool = True) -> pd.DataFrame:
    """``df`` (cell texts) with each column of ``schema`` in its type (``typed_column``); others as they are."""
    props = schema["properties"]
    return pd.DataFrame(
        {c: typed_column(df[c], props[c], keep_default_na) if c in props else df[c] for c in df.columns},
        index=df.index,
        columns=df.columns,
    )


def read_json(path: str | Path, required: dict[str, type | tuple[type, ...]] | None = None, kind: type = dict):
    """A JSON file's value: a ``kind`` (dict or list); for a dict, every key of ``required`` present with a
    value of its type. Anything else is a ``DataError`` naming the file and the key."""
    text = decode(path)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}, line {exc.lineno}: not valid JSON ({exc.msg}); the file is corrupted") from None
    if not isinstance(value, kind):
        raise DataError(f"{path}: expected a JSON {kind.__name__}, got {type(value).__name__}")
    for key, types in (required or {}).items():
        if key not in value:
            raise DataError(f"{path}: key {key!r} is missing")
        if not isinstance(value[key], types):
            raise DataError(f"{path}: key {key!r} is {value[key]!r}, expected {_type_names(types)}")
    return value


def _type_names(types) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(t.__name__ for t in types)


ENVIRONMENT_KEYS = {"gpu": str, "gpu_name": str, "torch": str, "triton": str, "git_sha": str}


def read_environment(path: str | Path, gpu: str | None = None) -> dict:
    """An ``environment.json`` (``analysis.core.provenance.environment``): its keys, and its GPU type ``gpu``."""
    env = read_json(path, ENVIRONMENT_KEYS)
    if gpu is not None and env["gpu"] != gpu:
        raise DataError(f"{path}: key 'gpu' is {env['gpu']!r}, but the file is the environment of GPU type {gpu!r}")
    return env


FIGURE_KEYS = {"name": str, "caption": str}


def read_figure_manifest(path: str | Path) -> list[dict]:
    """A figures folder's ``manifest.json`` (``analysis.core.plotting.render_all``): a list of entries, each with a
    name and a caption, and its PNG and table present where it names them."""
    entries = read_json(path, kind=list)
    folder = Path(path).parent
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise DataError(f"{path}: entry {i} is {type(e).__name__}, expected an object")
        for key, t in FIGURE_KEYS.items():
            if not isinstance(e.get(key), t):
                raise DataError(f"{path}: entry {i} has no {key} (a {t.__name__})")
        for key in ("png", "csv"):
            if e.get(key) and not Path(e[key]).is_file() and not (folder / Path(e[key]).name).is_file():
                raise DataError(f"{path}: entry {i} ({e['name']}) names {key} {e[key]!r}, which does not exist")
    return entries
