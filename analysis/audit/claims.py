"""The claims: the registry of what the two source articles assert, and each family's own claims, read once.

``analysis/audit/registry.yaml`` lists every checkable numeric statement of the two source articles (what the
article asserts, how loosely, under which conditions, where it says so and in which words) under a stable id;
a family may bring claims of its own sources in ``analysis/families/<family>/claims.yaml`` (same format). Each
file is validated against ``workflow/schemas/claims.schema.yaml`` and then against what the schema cannot say
(evaluators, cited articles and topics exist; ids are unique), and becomes ``Claim`` objects: what the audit
judges (``analysis.audit.engine``) and what the report shows (``analysis.report.claims``) are the same objects.

Each claim names an *evaluator*: a function of a family's ``claims.py`` or of the audit's own
(``analysis.audit.arithmetic``), or ``not_built`` for a claim whose experiment does not exist yet (then
``needs`` says what would check it). A compound claim comes back as its parts, each judged on its own. A claim
about a named kernel's speed or utilisation names its *subject* (``Subject``): the kernel its evaluator judges,
the official build where one runs here, with our replication beside it (``analysis.audit.subject``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path

import yaml

from analysis.core.paths import SCHEMAS

REGISTRY = Path(__file__).resolve().with_name("registry.yaml")
SCHEMA = SCHEMAS / "claims.schema.yaml"
NOT_BUILT = "not_built"  # the evaluator of a claim whose experiment does not exist yet
PART_SEP = "."  # a part's id: the claim's id, the separator, the part's name


@dataclasses.dataclass(frozen=True)
class Quote:
    article: str  # S0 / S1
    title: str  # the article's title, in English
    text: str  # the article's own words, verbatim (white space runs made single spaces)


@dataclasses.dataclass(frozen=True)
class Subject:
    """The kernel a claim is about, as it runs here: ``impl`` (an implementation name), ``why`` that one, and
    beside an official build ``ours``, our replication of it (shown beside it, judged where it has no rows)."""

    impl: str
    why: str
    ours: str = ""

    @property
    def official(self) -> bool:
        """Whether the subject is an official build (else it is our replication: no official one runs here)."""
        return not self.impl.startswith("ours-")


@dataclasses.dataclass(frozen=True)
class Claim:
    id: str
    source: str  # article, its file and the section as the article names it
    statement: str
    asserted: dict
    wording: str
    tolerance: float
    conditions: dict
    kind: tuple[str, ...]
    evaluator: str
    needs: str = ""
    figure: str = ""
    # a part of a compound claim: the part's name and the whole claim its evaluator judges
    part: str = ""
    whole: Claim | None = None
    # what the report shows beside the verdicts
    topic: str = ""
    topic_title: str = ""
    headline: bool = False
    where: str = ""  # the article's title and section, in English
    quotes: tuple[Quote, ...] = ()
    subject: Subject | None = None  # the kernel it is about, for a claim about a named kernel's speed

    def asserted_text(self) -> str:
        a, unit = self.asserted, self.asserted.get("unit", "")
        if "range" in a:
            lo, hi = a["range"]
            return f"{lo:g}–{hi:g} {unit}".strip()
        if "approx" in a:
            return f"≈ {a['approx']:g} {unit}".strip()
        if "at_least" in a:
            return f"≥ {a['at_least']:g} {unit}".strip()
        if "at_most" in a:
            return f"≤ {a['at_most']:g} {unit}".strip()
        return a.get("text", self.wording)


@dataclasses.dataclass(frozen=True)
class Claims:
    """The claims of one or more claim files, in file order (a compound claim as its parts), and the report's
    topics (name → title) in the order the files declare them."""

    claims: tuple[Claim, ...]
    topics: dict[str, str]

    def __iter__(self) -> Iterator[Claim]:
        return iter(self.claims)

    def __len__(self) -> int:
        return len(self.claims)

    def __getitem__(self, i: int) -> Claim:
        return self.claims[i]

    def by_id(self) -> dict[str, Claim]:
        return {c.id: c for c in self.claims}


def part_id(claim_id: str, part: str) -> str:
    return f"{claim_id}{PART_SEP}{part}"


def load_claims(
    evaluators: Collection[str],
    extra: Iterable[str | Path | tuple[Path, dict]] = (),
    path: str | Path = REGISTRY,
    implementations: Collection[str] | None = None,
) -> Claims:
    """The claims of the registry at ``path``, then those of each document of ``extra`` (a family's own
    claims, with their own ``sources`` and ``topics``: a file, or a file and the document read from it,
    ``analysis.registry.claim_documents``), in order. A document that breaks the schema, an unknown evaluator
    (not in ``evaluators``, nor ``not_built``), an unknown article or topic, a duplicate id and a subject that
    is not one (an official build without ``ours``, ours with one; with ``implementations``, an implementation
    none of them is) are errors naming the file and the claim."""
    known = set(evaluators) | {NOT_BUILT}
    datas = [_validated(*(d if isinstance(d, tuple) else (d, None))) for d in (path, *extra)]
    topics: dict[str, str] = {}
    for _, data in datas:
        for name, title in (data.get("topics") or {}).items():
            topics.setdefault(name, str(title))
    claims: list[Claim] = []
    seen: set[str] = set()
    for file, data in datas:
        for entry in data.get("claims") or []:
            whole = _claim(file, data["sources"], entry, known, topics, implementations)
            if whole.id in seen:
                raise ValueError(f"{file}: duplicate claim id {whole.id!r}")
            seen.add(whole.id)
            claims.extend(_parts(file, whole, entry) or [whole])
    return Claims(tuple(claims), topics)


def load_targets(evaluators: Collection[str], documents: Iterable[tuple[Path, dict]]) -> Claims:
    """The performance targets of ``documents`` (a family's claims document: its file and what was read from
    it), as claims its evaluator judges: kind measured, no article, no quote. Unknown evaluators and duplicate
    ids are errors naming the file."""
    out: list[Claim] = []
    seen: set[str] = set()
    for file, data in (_validated(*d) for d in documents):
        for t in data.get("targets") or []:
            if t["evaluator"] not in evaluators:
                raise ValueError(f"{file}: target {t['id']!r} names unknown evaluator {t['evaluator']!r}")
            if t["id"] in seen:
                raise ValueError(f"{file}: duplicate target id {t['id']!r}")
            seen.add(t["id"])
            out.append(
                Claim(
                    id=t["id"],
                    source=f"target ({file.name})",
                    statement=t["statement"],
                    asserted=t["asserted"],
                    wording=t["wording"],
                    tolerance=float(t.get("tolerance", 0.0)),
                    conditions=t.get("conditions") or {},
                    kind=("measured",),
                    evaluator=t["evaluator"],
                )
            )
    return Claims(tuple(out), {})


@functools.cache
def _schema_validator():
    import jsonschema

    return jsonschema.Draft202012Validator(yaml.safe_load(SCHEMA.read_text(encoding="utf-8")))


def _validated(path: Path, data: dict | None = None) -> tuple[Path, dict]:
    """(``path``, the claims document read from it, or ``data`` when given), checked against the schema; the
    first problems named with their place."""
    path = Path(path)
    if data is None:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    errors = sorted(_schema_validator().iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        lines = []
        for e in errors[:5]:
            place = "/".join(str(p) for p in e.absolute_path)
            if len(e.absolute_path) >= 2 and e.absolute_path[0] == "claims":
                cid = data["claims"][e.absolute_path[1]].get("id", "?")
                place = f"claim {cid!r} ({place})"
            lines.append(f"{place or 'top level'}: {e.message}")
        more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
        raise ValueError(f"{path}: does not match {SCHEMA.name}{more}:\n  " + "\n  ".join(lines))
    return path, data


def _claim(
    file: Path, sources: dict, c: dict, evaluators: set[str], topics: dict[str, str], implementations=None
) -> Claim:
    """One claim of a file, its cross-references checked."""
    cid = c["id"]
    if c["evaluator"] not in evaluators:
        raise ValueError(f"{file}: claim {cid!r} names unknown evaluator {c['evaluator']!r}")
    if c["evaluator"] == NOT_BUILT and not c.get("needs"):
        raise ValueError(f"{file}: claim {cid!r} is not built but does not say what it needs")
    src = c["source"]
    cited = [src["article"], *(q["article"] for q in c["quote"])]
    for article in cited:
        if article not in sources:
            raise ValueError(f"{file}: claim {cid!r} cites unknown article {article!r}")
    if c["topic"] not in topics:
        raise ValueError(f"{file}: claim {cid!r}: topic {c['topic']!r} is not one of {sorted(topics)}")
    quotes = tuple(Quote(q["article"], sources[q["article"]]["title"], " ".join(q["text"].split())) for q in c["quote"])
    subject = _subject(file, cid, c.get("subject"), implementations)
    return Claim(
        id=cid,
        source=f"{src['article']} ({sources[src['article']]['file']}) {src['section']}",
        statement=c["statement"],
        asserted=c["asserted"],
        wording=str(c["wording"]),
        tolerance=float(c["tolerance"]),
        conditions=c.get("conditions") or {},
        kind=tuple(c["kind"]),
        evaluator=c["evaluator"],
        needs=c.get("needs", ""),
        figure=c.get("figure", ""),
        topic=c["topic"],
        topic_title=topics[c["topic"]],
        headline=bool(c.get("headline", False)),
        where=f"{sources[src['article']]['title']} ({src['article']}), {src['section_en']}",
        quotes=quotes,
        subject=subject,
    )


def _subject(file: Path, cid: str, s: dict | None, implementations: Collection[str] | None) -> Subject | None:
    """A claim's ``subject`` entry, checked: an official build has our replication beside it, ours has none;
    both are implementations the families measure (when ``implementations`` is given)."""
    if s is None:
        return None
    subject = Subject(s["impl"], " ".join(s["why"].split()), s.get("ours", ""))
    if subject.official and not subject.ours:
        raise ValueError(f"{file}: claim {cid!r}: subject {subject.impl!r} is an official build: name ours beside it")
    if not subject.official and subject.ours:
        raise ValueError(f"{file}: claim {cid!r}: subject {subject.impl!r} is ours already: it takes no ours")
    if implementations is not None:
        unknown = [i for i in (subject.impl, subject.ours) if i and i not in implementations]
        if unknown:
            raise ValueError(f"{file}: claim {cid!r}: subject names unknown implementations {unknown}")
    return subject


def _parts(file: Path, whole: Claim, entry: dict) -> list[Claim]:
    """The parts of a compound claim, each judged on its own: its statement, asserted value, wording and (by
    default the whole's) tolerance, figure and headline; the whole's evaluator gives every part's verdict."""
    out = [
        dataclasses.replace(
            whole,
            id=part_id(whole.id, p["part"]),
            statement=p["statement"],
            asserted=p["asserted"],
            wording=str(p["wording"]),
            tolerance=float(p.get("tolerance", whole.tolerance)),
            figure=p.get("figure", whole.figure),
            headline=bool(p.get("headline", whole.headline)),
            part=p["part"],
            whole=whole,
        )
        for p in entry.get("parts") or []
    ]
    if len({c.part for c in out}) != len(out):
        raise ValueError(f"{file}: claim {whole.id!r} names a part twice")
    return out
