"""The claims as a reader meets them in the report: grouped by topic, each with its statement in English,
the article's own words, the article's title and section, and the verdict rows of the audit beside them.

Input: the audit's verdict table (``analysis.audit.COLUMNS``) and the display fields (``topic``, ``headline``,
``quote``, ``source.section_en``) of the claim files the audit judges: the articles' registry
(``analysis/audit/registry.yaml``) and each family's own ``claims.yaml``. A family's claim file may add topics
of its own (``topics: {name: title}``), shown after the registry's.
Output: plain dicts for the report template, with every value a string (the template escapes them).

The first screen (``headlines``) shows the claims the registry marks ``headline: true``, one line per
verdict row, with a thumbnail of the figure behind it; the claims table (``claim_rows``) shows every row,
its long evidence and note folded, with the data the template's filter and sort read (``data-*``).
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

from analysis import audit, registry

# Topics in the order the report shows them; each claim of the registry names one (a family's claim file may
# add its own: ``topics``).
TOPICS = {
    "memory": "Memory and IO",
    "fa1": "FlashAttention-1",
    "fa2": "FlashAttention-2",
    "fa3": "FlashAttention-3 on Hopper",
    "fp8": "FP8",
    "decode": "Decoding and variable lengths",
    "moe": "MoE",
    "w4a16": "W4A16",
    "arithmetic": "The articles' arithmetic",
}
THUMB_WIDTH = 240  # pixels of a first-screen thumbnail
NO_EXPERIMENT = "not_built"  # the audit's evidence token for a claim without an experiment


@dataclass(frozen=True)
class Quote:
    article: str  # S0 / S1
    title: str  # the article's title, in English
    text: str  # the article's own words, verbatim


@dataclass(frozen=True)
class ClaimText:
    id: str
    topic: str
    headline: bool
    statement: str
    where: str  # article title and section, in English
    quotes: tuple[Quote, ...]
    topic_title: str = ""
    parent: str = ""  # the compound claim this part belongs to ("" for a whole claim)
    parent_statement: str = ""


def load_texts(path: str | Path = audit.REGISTRY, extra=None) -> dict[str, ClaimText]:
    """Display fields of every claim of the registry at ``path`` and of the claim files ``extra`` (by
    default every family's, ``analysis.registry.claim_files``), by claim id (a compound claim's parts by
    theirs, each with the whole's statement and quotes).
    A claim without a known topic, a quote or an English section name is an error naming it."""
    files = [Path(path), *(registry.claim_files() if extra is None else extra)]
    datas = [yaml.safe_load(Path(f).read_text(encoding="utf-8")) for f in files]
    topics = dict(TOPICS)
    for data in datas:
        for name, title in (data.get("topics") or {}).items():
            topics.setdefault(name, str(title))
    out: dict[str, ClaimText] = {}
    for data in datas:
        out.update(_texts(data, topics))
    return out


def _texts(data: dict, topics: dict[str, str]) -> dict[str, ClaimText]:
    sources = data["sources"]
    out: dict[str, ClaimText] = {}
    for c in data["claims"]:
        cid = c["id"]
        if c.get("topic") not in topics:
            raise ValueError(f"claim {cid!r}: topic {c.get('topic')!r} is not one of {sorted(topics)}")
        quotes = tuple(
            Quote(q["article"], sources[q["article"]]["title"], " ".join(str(q["text"]).split()))
            for q in c.get("quote") or []
        )
        if not quotes:
            raise ValueError(f"claim {cid!r} quotes nothing of its article (field quote)")
        src = c["source"]
        if not src.get("section_en"):
            raise ValueError(f"claim {cid!r}: source has no English section name (section_en)")
        where = f"{sources[src['article']]['title']} ({src['article']}), {src['section_en']}"
        parts = c.get("parts") or []
        title = topics[c["topic"]]
        if not parts:
            out[cid] = ClaimText(cid, c["topic"], bool(c.get("headline")), c["statement"], where, quotes, title)
        for p in parts:
            pid = audit.part_id(cid, p["part"])
            out[pid] = ClaimText(
                pid,
                c["topic"],
                bool(p.get("headline", c.get("headline"))),
                p["statement"],
                where,
                quotes,
                title,
                parent=cid,
                parent_statement=c["statement"],
            )
    return out


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


def _is_true(v) -> bool:
    return str(v).strip().lower() in ("true", "1")


def _row(r: dict, text: ClaimText, figure_gpus: set[str]) -> dict:
    link = f"#fig-{r['gpu']}-{r['figure']}" if r.get("figure") and r["gpu"] in figure_gpus else ""
    evidence = "" if r["evidence"] == NO_EXPERIMENT else r["evidence"]
    observed = r["observed"] or ("no experiment measures it" if r["evidence"] == NO_EXPERIMENT else "—")
    return {
        "claim_id": r["claim_id"],
        "anchor": f"claim-{r['claim_id']}-{r['gpu']}".replace(".", "-"),
        "parent": text.parent,
        "parent_statement": text.parent_statement,
        "topic": text.topic,
        "headline": text.headline,
        "topic_title": text.topic_title,
        "statement": text.statement,
        "where": text.where,
        "quotes": [{"article": q.article, "title": q.title, "text": q.text} for q in text.quotes],
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
        "is_borderline": _is_true(r.get("borderline", "")),
    }


def claim_rows(verdicts: pd.DataFrame, texts: dict[str, ClaimText], figure_gpus: set[str]) -> list[dict]:
    """One entry per verdict row, in topic order (the registry's order inside a topic). A verdict row whose
    claim the registry does not know is an error naming it."""
    order = {t: i for i, t in enumerate(topic_order(texts))}
    rows = []
    for i, r in enumerate(verdicts.fillna("").astype(str).to_dict("records")):
        text = texts.get(r["claim_id"])
        if text is None:
            raise ValueError(f"verdict row {i}: claim {r['claim_id']!r} is not in the registry")
        rows.append((order[text.topic], i, _row(r, text, figure_gpus)))
    return [row for *_, row in sorted(rows, key=lambda t: t[:2])]


def topic_order(texts: dict[str, ClaimText]) -> list[str]:
    """The topics in the order the report shows them: the registry's (``TOPICS``), then the families' own."""
    extra = [t.topic for t in texts.values() if t.topic not in TOPICS]
    return [*TOPICS, *dict.fromkeys(extra)]


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
