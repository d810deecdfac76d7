"""The self-contained HTML report: the claims audit, per GPU type the families' summaries and figures with the
tables behind them, failures, and the correctness checks.

``render_report`` fills ``reports/templates/report.html.j2`` with jinja2 (autoescape on). Images and fonts
are embedded as base64 data URIs and the CSS is inline, so the single HTML file can be mailed or archived
and still shows everything. Table cells go through ``words``, so that a narrow column wraps between words,
never inside a word or a number; a table wider than the window scrolls in its own box. What is
family-specific comes from the families (``analysis.registry``): the order and titles of the figure sections,
a family's summary tables and how a point's shape reads (``analysis/families/<family>/report.py``); the rest
is computed here from the result rows.
"""

from __future__ import annotations

import base64
import json
import math
import numbers
import re
from datetime import datetime, timezone
from pathlib import Path

import jinja2
import numpy as np
import pandas as pd
from markupsafe import Markup, escape

from analysis import registry
from analysis.core import outputs, validate
from analysis.core.paths import ROOT
from analysis.core.tables import shared_columns
from analysis.report import claims, provenance, quote_font

TEMPLATES = ROOT / "reports" / "templates"
TEMPLATE = "report.html.j2"
MISSING = "—"
STATUSES = tuple(shared_columns()["status"]["enum"])


def fmt(v) -> str:
    """A cell as text: integers in full, other numbers to 3 significant digits, missing as a dash."""
    if v is None or (not isinstance(v, str) and pd.isna(v)):
        return MISSING
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, numbers.Integral):
        return str(int(v))
    if isinstance(v, numbers.Real):
        v = float(v)
        if math.isinf(v):
            return str(v)
        if v.is_integer() and abs(v) < 1e15:
            return str(int(v))
        # Below 1000, 3 significant digits; above, ".3g" would switch to exponent notation.
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


# A word: a run of characters that are neither white space nor wide (CJK text breaks between its characters).
WIDE = "\u2e80-\u303f\u3040-\u9fff\uac00-\ud7af\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef"
WORD = re.compile(rf"[^\s{WIDE}]+")
# a character beside which a browser may break a line inside a word ("4.001e-" / "16", "TFLOP/" / "s",
# "}" / "{"): any but letters, digits and the punctuation that never opens a break inside a word
BREAKS_INSIDE = re.compile(r"""[^\w.,:;'"()<>=#&*@]""")
LONG_WORD = 24  # characters; a longer word (a path, a list of names) may break after / or _, or , or = before a letter
PIECE_END = re.compile(r"(?<=[/_])(?=.)|(?<=[,=])(?=[^\W\d_])")


def words(text) -> Markup:
    """Text for a table cell (the template's ``words`` filter) that breaks lines only between words: a word
    the browser could break inside (beside a hyphen, a dash, a slash, a brace, ...) is kept whole
    (``<span class="nw">``), and a long word may break only after a path's slash, an identifier's underscore,
    or a comma or equals sign before a letter (``<wbr>``). Escaped; wide (CJK) text is left as it is."""
    text = str(text)
    out, end = [], 0
    for m in WORD.finditer(text):
        out.append(escape(text[end : m.start()]))
        word = m.group()
        pieces = PIECE_END.split(word) if len(word) > LONG_WORD else [word]
        out.append(
            Markup("<wbr>").join(
                Markup('<span class="nw">{}</span>').format(p) if len(p) > 1 and BREAKS_INSIDE.search(p) else escape(p)
                for p in pieces
            )
        )
        end = m.end()
    out.append(escape(text[end:]))
    return Markup("").join(out)


def _is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) and not pd.isna(v)


def _table(df: pd.DataFrame | None) -> dict:
    """A frame as header plus rows of formatted cells, for the template's table macro."""
    if df is None:
        df = pd.DataFrame()
    rows = [[{"text": fmt(v), "num": _is_number(v)} for v in rec] for rec in df.itertuples(index=False, name=None)]
    return {"columns": [str(c) for c in df.columns], "rows": rows}


def _hook(experiment, name: str):
    """The ``report.py`` function ``name`` of the family that runs ``experiment``, or None."""
    try:
        module = registry.of_experiment(str(experiment)).module("report")
    except KeyError:
        return None
    return getattr(module, name, None) if module else None


def shapes(df: pd.DataFrame) -> pd.Series:
    """Each row's shape in words, as its family writes it (empty where the family says nothing)."""
    out = [(_hook(r.get("experiment"), "shape") or (lambda _: ""))(r) for r in df.to_dict("records")]
    return pd.Series(out, index=df.index, dtype=object)


def point_tables(tables: dict[str, pd.DataFrame]) -> list[pd.DataFrame]:
    """The tables whose rows are points the report counts and lists (those whose families describe a shape)."""
    out = []
    for name, df in tables.items():
        if df is not None and not df.empty and all(f.has("report") for f in registry.of_table(name)):
            out.append(df)
    return out


def status_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Counts of each status per experiment × impl, with a total column."""
    if df.empty:
        return pd.DataFrame(columns=["experiment", "impl", "total"])
    keys = df[["experiment", "impl"]].fillna(MISSING).astype(str)
    counts = pd.crosstab([keys["experiment"], keys["impl"]], df["status"].fillna(MISSING).astype(str))
    cols = [s for s in STATUSES if s in counts.columns] + sorted(set(counts.columns) - set(STATUSES))
    counts = counts[cols]
    counts["total"] = counts.sum(axis=1)
    counts.columns.name = None
    return counts.reset_index()


MESSAGE_CHARS = 200  # of a failure's message in the report; the CSV keeps the whole recorded message


def readable(message: str, limit: int = MESSAGE_CHARS) -> str:
    """A failure message for a table cell: at most ``limit`` characters, cut after a whole word with "…"
    (the recorded messages are capped at a fixed length, which can fall inside a word)."""
    text = " ".join(str(message).split())
    if len(text) <= limit:
        return text
    cut = text[: limit + 1].rsplit(" ", 1)[0].rstrip(",;:")
    return cut + " …"


def failures(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Every row of ``frames`` whose status is not ``ok``, with the message saying why, table after table."""
    parts = []
    for df in frames:
        bad = df[df["status"] != "ok"]
        parts.append(
            pd.DataFrame(
                {
                    "experiment": bad["experiment"],
                    "impl": bad["impl"],
                    "dtype": bad["dtype"],
                    "mode": bad["mode"] if "mode" in bad else "",
                    "shape": shapes(bad),
                    "status": bad["status"],
                    "message": bad["message"],
                }
            )
        )
    cols = ["experiment", "impl", "dtype", "mode", "shape", "status", "message"]
    if not parts:
        return pd.DataFrame(columns=cols)
    out = pd.concat(parts).reset_index(drop=True)
    out["message"] = out["message"].fillna("").map(readable)
    return out


def correctness_table(checks: pd.DataFrame | None) -> pd.DataFrame | None:
    """Correctness-only rows: error against the float64 reference next to the allowed bound."""
    if checks is None or checks.empty:
        return None
    return pd.DataFrame(
        {
            "impl": checks["impl"],
            "dtype": checks["dtype"],
            "mode": checks["mode"],
            "shape": shapes(checks),
            "max_abs_err": pd.to_numeric(checks["max_abs_err"], errors="coerce"),
            "ref_err": pd.to_numeric(checks["ref_err"], errors="coerce"),
            "err_bound": pd.to_numeric(checks["err_bound"], errors="coerce"),
            "status": checks["status"],
            "message": checks["message"],
        }
    ).reset_index(drop=True)


def _data_uri(png) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(png).read_bytes()).decode("ascii")


def _caption(path: str) -> list[str]:
    """Caption paragraphs (blank-line separated in the .rst; ``path`` relative to the repository root), each
    joined onto one line."""
    text = (ROOT / path).read_text(encoding="utf-8")
    return [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]


def _figure(entry: dict) -> dict:
    out = {
        "name": entry["name"],
        "caption": _caption(entry["caption"]),
        "reason": entry.get("reason"),
        "src": None,
        "csv_name": None,
        "table": None,
    }
    if entry.get("png"):
        out["src"] = _data_uri(entry["png"])
    if entry.get("csv"):
        out["csv_name"] = Path(entry["csv"]).name
        try:
            table = pd.read_csv(entry["csv"])
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            raise validate.DataError(
                f"{entry['csv']}: the table behind figure {entry['name']} cannot be read ({type(exc).__name__}: {exc})"
            ) from None
        out["table"] = _table(table)
    return out


OTHER_SECTION = "more"


def section_titles() -> dict[str, str]:
    """Section id → title of every family's figure sections, in registry order."""
    return {sid: title for f in registry.FAMILIES.values() for sid, title in f.sections}


def figure_sections(entries: list[dict]) -> list[dict]:
    """Figures grouped under the section they belong to (``section`` of each manifest entry), in the order of
    the families' sections; entries without a known section come last, under "More figures". Figures of what
    the run did not measure (``measured`` false) are left out."""
    titles = section_titles()
    groups: dict[str, list[dict]] = {}
    for e in entries:
        if e.get("measured") is False:  # not in this run's grid: nothing failed, nothing to show
            continue
        key = e.get("section") if e.get("section") in titles else OTHER_SECTION
        groups.setdefault(key, []).append(e)
    order = [k for k in titles if k in groups] + ([OTHER_SECTION] if OTHER_SECTION in groups else [])
    return [
        {"id": k, "title": titles.get(k, "More figures"), "figures": [_figure(e) for e in groups[k]]} for k in order
    ]


def _value_text(v) -> str:
    return json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else fmt(v)


def _gpu(g: dict) -> dict:
    tables = g.get("tables") or {}
    points = point_tables(tables)
    keys = ["experiment", "impl", "status"]
    both = pd.concat([t[keys] for t in points], ignore_index=True) if points else pd.DataFrame()
    env = g.get("provenance") or {}
    summaries = [
        s
        for f in registry.FAMILIES.values()
        if f.has("report")
        for s in (getattr(f.module("report"), "summary_tables", None) or (lambda _: []))(tables)
    ]
    origin = provenance.origin(list(tables.values()), g.get("manifest"))
    return {
        "slug": g["slug"],
        "name": env.get("gpu_name") or g["slug"],
        "source": g.get("source", ""),
        "origin": {**origin, "text": provenance.origin_text(origin)},
        "peers": provenance.peers_text(list(tables.values()), env),
        "provenance": [(str(k), _value_text(v)) for k, v in env.items()],
        "sections": [
            {**sec, "provenance": provenance.describe(points, sec["id"], g.get("manifest"))}
            for sec in figure_sections(g.get("figures") or [])
        ],
        "summaries": [{"title": s["title"], "text": s["text"], "table": _table(s["table"])} for s in summaries],
        "status": _table(status_summary(both)) if not both.empty else None,
        "failures": _table(failures(points)) if not both.empty else None,
    }


VERDICT_ORDER = ("holds", "partly", "fails", "inconsistent", "untestable")


def verdict_section(verdicts: pd.DataFrame | None, gpus: list[dict]) -> dict | None:
    """The claims: counts per verdict (and of the borderline rows), the first screen's headline claims by
    topic with thumbnails of their figures, and every verdict row by topic (``analysis.report.claims``), with
    the values the table's filters offer. Links and thumbnails go only to figures in the report.

    ``gpus``: the report's GPU entries (``slug`` and ``figures``, as ``render_report`` takes them).
    """
    if verdicts is None:
        return None
    figures = {(g["slug"], e["name"]): e["png"] for g in gpus for e in g.get("figures") or [] if e.get("png")}
    rows = claims.claim_rows(verdicts, registry.claims(), {g["slug"] for g in gpus})
    counts = pd.Series([r["verdict"] for r in rows]).value_counts()
    topics: dict[str, list[dict]] = {}
    for r in rows:
        topics.setdefault(r["topic"], []).append(r)
    flagged = claims.borderline(rows)
    return {
        "counts": [(k, int(counts.get(k, 0))) for k in VERDICT_ORDER],
        "borderline": flagged["count"],
        "borderline_rule": flagged["text"],
        "counting": claims.counting(rows),
        "headlines": claims.headlines(rows, figures),
        "topics": [{"topic": t, "title": rs[0]["topic_title"], "rows": rs} for t, rs in topics.items()],
        "filters": list(claims.filters(rows).items()),
    }


def _checks_origin(checks: pd.DataFrame | None) -> str:
    """The first screen's line on the interpreter checks (always this run's, on this machine's CPU)."""
    if checks is None or checks.empty:
        return ""
    return "run by this run on this machine, in Triton's interpreter: " + provenance.rows_text(
        provenance.origin([checks], None), "checked"
    )


def render_report(
    out_html,
    gpus: list[dict],
    checks: pd.DataFrame | None,
    title: str = "IO-aware attention kernels: benchmark and audit report",
    generated: dict | None = None,
    extra_sections: list[dict] | None = None,
    verdicts: pd.DataFrame | None = None,
    comparison: list[dict] | None = None,
    notices: list[str] | None = None,
) -> Path:
    """Write the report to ``out_html`` (through a temporary file: a failure leaves the last report) and
    return its path.

    ``gpus``: one dict per GPU with ``slug``, ``source``, ``provenance`` (dict), ``figures`` (manifest entries,
    as ``analysis.core.plotting.render_all`` returns them) and ``tables`` (table name → that GPU's rows).
    ``checks``: correctness-only rows (experiment ``interpreter-check``) or None.
    ``generated``: facts about this build shown in the header; ``timestamp`` and ``git_sha`` are
    named explicitly, any other keys are listed. ``extra_sections``: dicts with ``title`` and
    ``html``, placed before the GPU sections; their ``html`` is inserted as is, so the caller must
    have escaped any data in it. ``verdicts``: the claims audit (``analysis.audit.COLUMNS``); when
    given, it leads the report. ``comparison``: the cross-GPU figures (``render_all`` entries), shown
    after it when several GPU types are in the report. ``notices``: banners at the top (e.g. that no
    shipped results are included).
    """
    correctness = correctness_table(checks)
    sections = [_gpu(g) for g in gpus]
    generated = dict(generated or {})
    generated.setdefault("timestamp", datetime.now(timezone.utc).isoformat(timespec="seconds"))
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        # The template's ".j2" suffix defeats extension-based autoescape detection, so force it on.
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["words"] = words
    html = env.get_template(TEMPLATE).render(
        title=title,
        timestamp=str(generated.pop("timestamp")),
        git_sha=str(generated.pop("git_sha", "unknown")),
        generated=[(str(k), _value_text(v)) for k, v in generated.items()],
        extra_sections=[
            {"id": f"extra-{i}", "title": s["title"], "html": Markup(s["html"])}
            for i, s in enumerate(extra_sections or [])
        ],
        gpus=sections,
        checks=_table(correctness) if correctness is not None else None,
        checks_origin=_checks_origin(checks),
        verdicts=verdict_section(verdicts, gpus),
        origins={g["slug"]: "shipped set" if g["origin"]["shipped"] else "this run" for g in sections},
        font_css=Markup(quote_font.css_faces()),
        quote_family=quote_font.QUOTES.family,
        math_family=quote_font.MATH.family,
        comparison=[_figure(e) for e in comparison] if comparison else None,
        notices=list(notices or []),
    )
    return outputs.write_text(out_html, html)
