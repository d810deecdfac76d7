"""The claims: the registry of what the two source articles assert, and each family's own claims.

``analysis/audit/registry.yaml`` lists every checkable numeric statement of the two source articles (what
the article asserts, how loosely, under which conditions) under a stable id; a family may bring claims of its
own sources in ``analysis/families/<family>/claims.yaml`` (same format). Each claim names an *evaluator*: a
function of a family's ``claims.py`` (``analysis.audit.engine`` runs them), or ``not_built`` for a claim whose
experiment does not exist yet (then ``needs`` says what would check it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable
from pathlib import Path

import yaml

REGISTRY = Path(__file__).resolve().with_name("registry.yaml")


@dataclasses.dataclass(frozen=True)
class Claim:
    id: str
    source: str
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


PART_SEP = "."  # a part's id: the claim's id, the separator, the part's name


def part_id(claim_id: str, part: str) -> str:
    return f"{claim_id}{PART_SEP}{part}"


def _parts(whole: Claim, entry: dict) -> list[Claim]:
    """The parts of a compound claim, each judged on its own: its statement, asserted value, wording and
    (by default the whole's) tolerance and figure; the whole's evaluator gives every part's verdict."""
    out = []
    for p in entry.get("parts") or []:
        if not p.get("part") or PART_SEP in p["part"]:
            raise ValueError(f"claim {whole.id!r}: a part needs a name without {PART_SEP!r}: {p.get('part')!r}")
        out.append(
            dataclasses.replace(
                whole,
                id=part_id(whole.id, p["part"]),
                statement=p["statement"],
                asserted=p["asserted"],
                wording=str(p.get("wording", whole.wording)),
                tolerance=float(p.get("tolerance", whole.tolerance)),
                figure=p.get("figure", whole.figure),
                part=p["part"],
                whole=whole,
            )
        )
    if len({c.part for c in out}) != len(out):
        raise ValueError(f"claim {whole.id!r} names a part twice")
    return out


def load_claims(
    evaluators: Collection[str], extra: Iterable[str | Path] = (), path: str | Path = REGISTRY
) -> list[Claim]:
    """The claims of the registry at ``path``, then those of each file of ``extra`` (a family's own
    ``claims.yaml``, with its own ``sources``), in order. Unknown evaluators (not in ``evaluators``, nor
    ``not_built``), unknown sources and duplicate ids are errors. A compound claim (one with ``parts``) comes
    back as its parts, ``<id>.<part>`` each (``_parts``)."""
    known = set(evaluators) | {"not_built"}
    claims, seen = [], set()
    for file in (path, *extra):
        claims += _read(Path(file), known, seen)
    return claims


def _read(path: Path, evaluators: set[str], seen: set[str]) -> list[Claim]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    sources = data["sources"]
    claims = []
    for c in data["claims"]:
        if c["id"] in seen:
            raise ValueError(f"duplicate claim id {c['id']!r}")
        seen.add(c["id"])
        if c["evaluator"] not in evaluators:
            raise ValueError(f"claim {c['id']!r} names unknown evaluator {c['evaluator']!r}")
        if c["evaluator"] == "not_built" and not c.get("needs"):
            raise ValueError(f"claim {c['id']!r} is not built but does not say what it needs")
        src = c["source"]
        if src["article"] not in sources:
            raise ValueError(f"claim {c['id']!r} cites unknown article {src['article']!r}")
        whole = Claim(
            id=c["id"],
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
        )
        claims.extend(_parts(whole, c) or [whole])
    return claims
