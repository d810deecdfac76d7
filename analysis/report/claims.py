"""The claims as a reader meets them in the report: grouped by topic, each with its statement in English, the
article's own words, the article's title and section, and the verdict rows of the audit beside them.

Input: the audit's verdict table (``analysis.audit.COLUMNS``) and the claims it judged (``analysis.audit.Claims``,
``analysis.registry.claims``: the same objects, with the topic, headline, quotes and English section each
claim file gives). Output: plain dicts for the report template, with every value a string (the template
escapes them) but a quote's ``math``: its text and MathML parts (``analysis.report.quote_math.parts``), or None.

The first screen (``headlines``) shows the claims marked ``headline: true``, one line per verdict row, with a
thumbnail of the figure behind it; the claims table (``claim_rows``) shows every row, its long evidence and
note folded, with the data the template's filter and sort read (``data-*``).
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pandas as pd

from analysis import audit
from analysis.audit import Claim, Claims
from analysis.report import quote_math

THUMB_WIDTH = 240  # pixels of a first-screen thumbnail
NO_EXPERIMENT = audit.claims.NOT_BUILT  # the audit's evidence for a claim without an experiment


def thumbnail(png: str | Path, width: int = THUMB_WIDTH) -> str:
    """A small copy of a figure as a data URI (PNG), so the first screen does not carry each figure twice."""
    from PIL import Image

    with Image.open(png) as im:
        im = im.convert("RGB")
        height = max(1, round(im.height * width / im.width))
        small = im.resize((width, height), Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    small.save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _row(r: dict, claim: Claim, figure_gpus: set[str], borderline: bool) -> dict:
    link = f"#fig-{r['gpu']}-{r['figure']}" if r.get("figure") and r["gpu"] in figure_gpus else ""
    evidence = "" if r["evidence"] == NO_EXPERIMENT else r["evidence"]
    observed = r["observed"] or ("no experiment measures it" if r["evidence"] == NO_EXPERIMENT else "—")
    return {
        "claim_id": r["claim_id"],
        "anchor": f"claim-{r['claim_id']}-{r['gpu']}".replace(".", "-"),
        "parent": claim.whole.id if claim.whole else "",
        "parent_statement": claim.whole.statement if claim.whole else "",
        "topic": claim.topic,
        "headline": claim.headline,
        "topic_title": claim.topic_title,
        "statement": claim.statement,
        "where": claim.where,
        "quotes": [
            {"article": q.article, "title": q.title, "text": q.text, "math": quote_math.parts(q.text)}
            for q in claim.quotes
        ],
        "kind": r["kind"],
        "asserted": r["asserted"],
        "observed": observed,
        "verdict": r["verdict"],
        "gpu": "any (analytic)" if r["gpu"] == audit.ANALYTIC else r["gpu"],
        "gpu_slug": r["gpu"],
        "tolerance": r["tolerance"],
        "evidence": evidence,
        "note": r["note"],
        "figure": r.get("figure", ""),
        "link": link,
        "band": r.get("band", ""),
        "is_borderline": borderline,
    }


def claim_rows(verdicts: pd.DataFrame, claims: Claims, figure_gpus: set[str]) -> list[dict]:
    """One entry per verdict row, in topic order (a file's order inside a topic). A verdict row whose claim is
    not among ``claims`` is an error naming it."""
    order = {t: i for i, t in enumerate(claims.topics)}
    by_id = claims.by_id()
    rows = []
    typed = verdicts.to_dict("records")  # the verdict table as read: borderline is a bool
    for i, r in enumerate(verdicts.fillna("").astype(str).to_dict("records")):
        claim = by_id.get(r["claim_id"])
        if claim is None:
            raise ValueError(f"verdict row {i}: claim {r['claim_id']!r} is not in the registry")
        rows.append((order[claim.topic], i, _row(r, claim, figure_gpus, bool(typed[i].get("borderline", False)))))
    return [row for *_, row in sorted(rows, key=lambda t: t[:2])]


def _in_order(rows: list[dict]) -> list[tuple[str, str]]:
    """(topic, title) of the rows, in the rows' order (``claim_rows`` sorts them by topic)."""
    return list(dict.fromkeys((r["topic"], r["topic_title"]) for r in rows))


def headlines(rows: list[dict], figures: dict[tuple[str, str], str]) -> list[dict]:
    """The first screen: per topic, the headline claims' rows (analytic rows only where the claim has no
    measured one), each with the thumbnail of its figure on that GPU when there is one.

    ``figures``: (gpu slug, figure name) → PNG path of the figures in the report."""
    measured = {r["claim_id"] for r in rows if r["gpu_slug"] != audit.ANALYTIC}
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if not r["headline"] or (r["gpu_slug"] == audit.ANALYTIC and r["claim_id"] in measured):
            continue
        png = figures.get((r["gpu_slug"], r["figure"]))
        groups.setdefault(r["topic"], []).append({**r, "thumb": thumbnail(png) if png else ""})
    return [{"topic": t, "title": title, "rows": groups[t]} for t, title in _in_order(rows) if t in groups]


def filters(rows: list[dict]) -> dict[str, list[str]]:
    """The values each filter of the claims table offers: verdicts, topics and kinds present."""
    kinds = sorted({k.strip() for r in rows for k in r["kind"].split(",") if k.strip()})
    return {
        "verdict": [v for v in audit.VERDICTS if any(r["verdict"] == v for r in rows)],
        "topic": [t for t, _ in _in_order(rows)],
        "kind": kinds,
    }


def counting(rows: list[dict]) -> dict:
    """How claims, parts and verdict rows relate, counted from the rows: ``claims`` (a compound claim once, of
    them ``compound``), ``parts`` (a compound claim's parts, each judged on its own), ``rows``; of the rows,
    ``analytic`` (one per part recomputed from the models) and ``measured`` (one per part and GPU type), over
    ``gpus`` GPU types, and ``both``: the parts with rows of each kind; ``text``: the first screen's sentence."""
    parts = {r["claim_id"] for r in rows}
    claims = {r["parent"] or r["claim_id"] for r in rows}
    analytic = {r["claim_id"] for r in rows if r["gpu_slug"] == audit.ANALYTIC}
    measured = {r["claim_id"] for r in rows if r["gpu_slug"] != audit.ANALYTIC}
    out = {
        "claims": len(claims),
        "compound": len(claims - parts),
        "parts": len(parts),
        "rows": len(rows),
        "analytic": sum(r["gpu_slug"] == audit.ANALYTIC for r in rows),
        "measured": sum(r["gpu_slug"] != audit.ANALYTIC for r in rows),
        "gpus": len({r["gpu_slug"] for r in rows} - {audit.ANALYTIC}),
        "both": len(analytic & measured),
    }
    both = (
        f"; {_n(out['both'], 'part')} {'has' if out['both'] == 1 else 'have'} rows of both kinds" if out["both"] else ""
    )
    out["text"] = (
        f"{_n(out['claims'], 'claim')} ({out['compound']} of them compound, each judged as its parts: "
        f"{_n(out['parts'], 'part')} in all) give {_n(out['rows'], 'verdict row')}: {out['analytic']} recomputed "
        f"from the models, one per part, and {out['measured']} measured, one per part and GPU type "
        f"({_n(out['gpus'], 'GPU type')} in this report){both}."
    )
    return out


def borderline(rows: list[dict]) -> dict:
    """How many measured verdict rows are borderline (``count``) of those judged (``judged``: measured, not
    untestable), and ``text``: the first screen's sentence saying so and what it means (the rule:
    ``analysis.audit.band``)."""
    judged = [r for r in rows if r["gpu_slug"] != audit.ANALYTIC and r["verdict"] != "untestable"]
    count = sum(bool(r["is_borderline"]) for r in judged)
    text = (
        f"{count} of {_n(len(judged), 'measured verdict row')} {'is' if count == 1 else 'are'} borderline: "
        "judged again with every time it reads moved across its band (the row's p20–p80, widened to the lowest "
        "and highest median of its repeat rounds where it has them: the run-to-run spread the run measured), the "
        "verdict changes, so another run may give the other verdict. A verdict within that spread of its edge is "
        "borderline in the runs on both sides of it; the others held across it."
    )
    return {"count": count, "judged": len(judged), "text": text}


def _n(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
