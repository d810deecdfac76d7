"""The self-contained HTML report: figures, the tables behind them, failures and correctness checks.

``render_report`` fills ``reports/templates/report.html.j2`` with jinja2 (autoescape on). Images are
embedded as base64 data URIs and the CSS is inline, so the single HTML file can be mailed or archived
and still shows everything. The summary tables are computed here from the result rows.
"""

from __future__ import annotations

import base64
import json
import math
import numbers
from datetime import datetime, timezone
from pathlib import Path

import jinja2
import numpy as np
import pandas as pd
from markupsafe import Markup

from analysis import claims_view, outputs, quote_font, section_provenance, validate
from analysis.figures import DTYPE_ORDER, MODE_TEXT, OURS, PALETTE, SECTIONS, fa2_mode
from analysis.tables import STATUSES

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "reports" / "templates"
CAPTIONS = ROOT / "reports" / "captions"
TEMPLATE = "report.html.j2"
REFERENCE = "sdpa-flash"
RATIO_COLUMN = f"{OURS} / {REFERENCE}"
CUDNN_RATIO_COLUMN = f"{OURS} / sdpa-cudnn"
MISSING = "—"


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


def _is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) and not pd.isna(v)


def _table(df: pd.DataFrame | None) -> dict:
    """A frame as header plus rows of formatted cells, for the template's table macro."""
    if df is None:
        df = pd.DataFrame()
    rows = [[{"text": fmt(v), "num": _is_number(v)} for v in rec] for rec in df.itertuples(index=False, name=None)]
    return {"columns": [str(c) for c in df.columns], "rows": rows}


def _shape(row) -> str:
    def part(key):
        v = pd.to_numeric(row.get(key), errors="coerce")
        return "?" if pd.isna(v) else str(int(v))

    nq, nk = part("seqlen_q"), part("seqlen_k")
    n = f"N={nq}" if nq == nk else f"Nq={nq} Nk={nk}"
    causal = str(row.get("causal")).strip().lower() in ("true", "1", "1.0")
    return f"B={part('batch')} H={part('heads')} {n} d={part('head_dim')}" + (" causal" if causal else "")


def _with_shape(df: pd.DataFrame) -> pd.Series:
    return pd.Series([_shape(r) for r in df.to_dict("records")], index=df.index, dtype=object)


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


def failures(df: pd.DataFrame, ops: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every row whose status is not ``ok``, with the message saying why: attention rows, then the rows of
    the W4A16/MoE table ``ops`` (their shape is the layer and M, or the tokens and routing)."""
    bad = df[df["status"] != "ok"]
    out = pd.DataFrame(
        {
            "experiment": bad["experiment"],
            "impl": bad["impl"],
            "dtype": bad["dtype"],
            "mode": bad["mode"],
            "shape": _with_shape(bad),
            "status": bad["status"],
            "message": bad["message"],
        }
    )
    if ops is not None and not ops.empty:
        bad = ops[ops["status"] != "ok"]
        shape = [_ops_shape(r) for r in bad.to_dict("records")]
        out = pd.concat([out, pd.DataFrame({"experiment": bad["experiment"], "impl": bad["impl"],
                                            "dtype": bad["dtype"], "mode": "", "shape": shape,
                                            "status": bad["status"], "message": bad["message"]})])  # fmt: skip
    out["message"] = out["message"].fillna("").map(readable)
    return out.reset_index(drop=True)


def _ops_shape(row) -> str:
    def part(key):
        v = pd.to_numeric(row.get(key), errors="coerce")
        return "?" if pd.isna(v) else str(int(v))

    if row.get("experiment") == "moe":
        return f"{row.get('model')} {part('tokens')} tokens, {row.get('routing')} routing, stage {row.get('stage')}"
    return f"{row.get('model')} M={part('m')} N={part('n')} K={part('k')}"


def throughput_summary(df: pd.DataFrame, mode: str = "fwd") -> pd.DataFrame:
    """Best TFLOP/s of one mode per impl at the largest N of each (dtype, head_dim, causal) setting.

    Experiment ``fa2-setting``. "Largest N" is the largest sequence length at which any
    implementation finished in that setting, so an impl that failed there shows as missing rather
    than being compared at a smaller N. The last columns are ours divided by sdpa-flash and by
    sdpa-cudnn at that N.
    """
    d = fa2_mode(df, mode).dropna(subset=["tflops"])
    setting = ["dtype", "head_dim", "causal"]
    if d.empty:
        return pd.DataFrame(columns=setting + ["N", RATIO_COLUMN, CUDNN_RATIO_COLUMN])
    largest = d.groupby(setting)["seqlen_q"].transform("max")
    at_n = d[d["seqlen_q"] == largest].rename(columns={"seqlen_q": "N"})
    # Several rows per impl (e.g. kernel configurations) can exist at one point: report the best.
    wide = at_n.pivot_table(index=setting + ["N"], columns="impl", values="tflops", aggfunc="max")
    impls = [i for i in PALETTE if i in wide.columns] + sorted(set(wide.columns) - set(PALETTE))
    wide = wide[impls]
    ours = wide[OURS] if OURS in wide.columns else np.nan
    ref = wide[REFERENCE] if REFERENCE in wide.columns else np.nan
    wide[RATIO_COLUMN] = ours / ref
    wide[CUDNN_RATIO_COLUMN] = ours / (wide["sdpa-cudnn"] if "sdpa-cudnn" in wide.columns else np.nan)
    wide.columns.name = None
    rank = {t: i for i, t in enumerate(DTYPE_ORDER)}
    return (
        wide.reset_index()
        .sort_values(setting, key=lambda c: c.map(rank) if c.name == "dtype" else c, kind="stable")
        .reset_index(drop=True)
    )


def correctness_table(checks: pd.DataFrame | None) -> pd.DataFrame | None:
    """Correctness-only rows: error against the float64 reference next to the allowed bound."""
    if checks is None or checks.empty:
        return None
    return pd.DataFrame(
        {
            "impl": checks["impl"],
            "dtype": checks["dtype"],
            "mode": checks["mode"],
            "shape": _with_shape(checks),
            "max_abs_err": pd.to_numeric(checks["max_abs_err"], errors="coerce"),
            "ref_err": pd.to_numeric(checks["ref_err"], errors="coerce"),
            "err_bound": pd.to_numeric(checks["err_bound"], errors="coerce"),
            "status": checks["status"],
            "message": checks["message"],
        }
    ).reset_index(drop=True)


def _data_uri(png) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(png).read_bytes()).decode("ascii")


def _caption(file_name: str) -> list[str]:
    """Caption paragraphs (blank-line separated in the .rst), each joined onto one line."""
    text = (CAPTIONS / file_name).read_text(encoding="utf-8")
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
            raise validate.DataError(f"{entry['csv']}: the table behind figure {entry['name']} cannot be read "
                                     f"({type(exc).__name__}: {exc})") from None  # fmt: skip
        out["table"] = _table(table)
    return out


OTHER_SECTION = "more"


def figure_sections(entries: list[dict]) -> list[dict]:
    """Figures grouped under the experiment they show (``section`` of each manifest entry), in the order
    of ``analysis.figures.SECTIONS``; entries without a known section come last, under "More figures".
    Figures of what the run did not measure (``measured`` false) are left out."""
    groups: dict[str, list[dict]] = {}
    for e in entries:
        if e.get("measured") is False:  # not in this run's grid: nothing failed, nothing to show
            continue
        key = e.get("section") if e.get("section") in SECTIONS else OTHER_SECTION
        groups.setdefault(key, []).append(e)
    order = [k for k in SECTIONS if k in groups] + ([OTHER_SECTION] if OTHER_SECTION in groups else [])
    return [
        {"id": k, "title": SECTIONS.get(k, "More figures"), "figures": [_figure(e) for e in groups[k]]} for k in order
    ]


def _value_text(v) -> str:
    return json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else fmt(v)


def _gpu(g: dict) -> dict:
    table = g.get("table")
    table = table if table is not None else pd.DataFrame()
    ops = g.get("ops_table")  # the W4A16/MoE rows, counted and listed with the attention rows
    keys = ["experiment", "impl", "status"]
    frames = [t[keys] for t in (table, ops) if t is not None and not t.empty]
    both = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    provenance = g.get("provenance") or {}
    return {
        "slug": g["slug"],
        "name": provenance.get("gpu_name") or g["slug"],
        "source": g.get("source", ""),
        "provenance": [(str(k), _value_text(v)) for k, v in provenance.items()],
        "sections": [
            {**sec, "provenance": section_provenance.describe([table, ops], sec["id"], g.get("manifest"))}
            for sec in figure_sections(g.get("figures") or [])
        ],
        "throughput": _throughput(table),
        "status": _table(status_summary(both)) if not both.empty else None,
        "failures": _table(failures(table, ops)) if not both.empty else None,
    }


def _throughput(table: pd.DataFrame) -> list[dict]:
    """One summary table per mode of the FA-2 setting present (forward first, as before modes)."""
    if table.empty:
        return []
    present = set(table.loc[table["experiment"] == "fa2-setting", "mode"].dropna())
    return [
        {"mode": m, "what": MODE_TEXT[m].capitalize(), "table": _table(throughput_summary(table, m))}
        for m in MODE_TEXT
        if m in present or m == "fwd"
    ]


VERDICT_ORDER = ("holds", "partly", "fails", "inconsistent", "untestable")


def verdict_section(verdicts: pd.DataFrame | None, gpus: list[dict]) -> dict | None:
    """The claims: counts per verdict (and of the borderline rows), the first screen's headline claims by
    topic with thumbnails of their figures, and every verdict row by topic (``analysis.claims_view``), with
    the values the table's filters offer. Links and thumbnails go only to figures in the report.

    ``gpus``: the report's GPU entries (``slug`` and ``figures``, as ``render_report`` takes them).
    """
    if verdicts is None:
        return None
    figures = {(g["slug"], e["name"]): e["png"] for g in gpus for e in g.get("figures") or [] if e.get("png")}
    rows = claims_view.claim_rows(verdicts, claims_view.load_texts(), {g["slug"] for g in gpus})
    counts = pd.Series([r["verdict"] for r in rows]).value_counts()
    topics: dict[str, list[dict]] = {}
    for r in rows:
        topics.setdefault(r["topic"], []).append(r)
    return {
        "counts": [(k, int(counts.get(k, 0))) for k in VERDICT_ORDER],
        "borderline": sum(r["is_borderline"] for r in rows),
        "claims": len({r["parent"] or r["claim_id"] for r in rows}),
        "parts": len(rows),
        "headlines": claims_view.headlines(rows, figures),
        "topics": [{"topic": t, "title": claims_view.TOPICS[t], "rows": rs} for t, rs in topics.items()],
        "filters": list(claims_view.filters(rows).items()),
    }


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

    ``gpus``: one dict per GPU with ``slug``, ``source``, ``provenance`` (dict), ``figures`` (as
    returned by ``analysis.figures.render_all``) and ``table`` (all result rows of that GPU).
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
    html = env.get_template(TEMPLATE).render(
        title=title,
        timestamp=str(generated.pop("timestamp")),
        git_sha=str(generated.pop("git_sha", "unknown")),
        generated=[(str(k), _value_text(v)) for k, v in generated.items()],
        extra_sections=[
            {"id": f"extra-{i}", "title": s["title"], "html": Markup(s["html"])}
            for i, s in enumerate(extra_sections or [])
        ],
        gpus=[_gpu(g) for g in gpus],
        checks=_table(correctness) if correctness is not None else None,
        verdicts=verdict_section(verdicts, gpus),
        quote_font_css=Markup(quote_font.css_face()),
        quote_font_family=quote_font.FAMILY,
        comparison=[_figure(e) for e in comparison] if comparison else None,
        notices=list(notices or []),
    )
    return outputs.write_text(out_html, html)
