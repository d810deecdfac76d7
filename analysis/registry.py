"""The registry: every family the pipeline runs, in the order the report shows them. A new family is one more
name on the two lines below (its folder under ``analysis/families/`` holds everything else).

From the families it derives what the rest of the pipeline asks for: the result tables (``tables``: composed
from the columns of the families that share each one), every claim evaluator (``evaluators``: the families'
and, beside them, the audit's own for the articles' GPU arithmetic, ``analysis.audit.arithmetic``), claim
document and claim (``claims``), and which family an experiment belongs to. Only the names below are
families: what they share lives in ``analysis/families/_shared``, which is none of them.
"""

from __future__ import annotations

import functools
from pathlib import Path

from analysis.audit import arithmetic
from analysis.audit import targets as target_evaluators
from analysis.audit.claims import Claims, load_claims, load_targets
from analysis.core.family import Family
from analysis.core.tables import Table, compose
from analysis.families import attention, compiled, fp8, moe, traffic, w4a16

FAMILIES: dict[str, Family] = {f.name: f for f in (m.FAMILY for m in (attention, fp8, traffic, w4a16, moe, compiled))}


def family(name: str) -> Family:
    if name not in FAMILIES:
        raise KeyError(f"unknown family {name!r}; known: {list(FAMILIES)}")
    return FAMILIES[name]


def of_table(name: str) -> list[Family]:
    """The families whose rows go to table ``name``, in registry order."""
    return [f for f in FAMILIES.values() if f.table == name]


@functools.cache
def tables() -> dict[str, Table]:
    """Every result table, by name, in registry order, composed from its families' columns."""
    names = list(dict.fromkeys(f.table for f in FAMILIES.values()))
    out = {}
    for name in names:
        fams = of_table(name)
        out[name] = compose(name, [f.columns() for f in fams], [e for f in fams for e in f.experiments])
    return out


def table(name: str) -> Table:
    return tables()[name]


def checks_table() -> str | None:
    """The table the interpreter checks' rows go to: that of the families with CPU checks (``plan.checks``),
    which must share one (their rows are collected into one ``checks.csv``); None when no family has checks."""
    found = {f.table for f in FAMILIES.values() if hasattr(f.plan, "checks")}
    if len(found) > 1:
        raise ValueError(f"the families' interpreter checks go to several tables {sorted(found)}: they share one")
    return next(iter(found), None)


def of_experiment(experiment: str) -> Family:
    """The family whose plan lists ``experiment``."""
    for f in FAMILIES.values():
        if experiment in f.experiments:
            return f
    raise KeyError(f"no family runs experiment {experiment!r}")


def evaluators() -> dict:
    """Every claim evaluator, by name: the audit's own (the GPU arithmetic's, ``analysis.audit.arithmetic``, and
    the targets' ratio, ``analysis.audit.targets``), then each family's (a name defined twice is an error)."""
    audits = {**arithmetic.EVALUATORS, **target_evaluators.EVALUATORS}
    out: dict = dict(audits)
    for f in FAMILIES.values():
        for name, fn in f.evaluators().items():
            if name in out:
                raise ValueError(
                    f"evaluator {name!r} is defined by {'the audit' if name in audits else 'two families'}"
                )
            out[name] = fn
    return out


def claim_documents() -> list[tuple[Path, dict]]:
    """The families' own claims (file, its claims document), beside the articles' registry."""
    return [d for d in (f.claims_document() for f in FAMILIES.values()) if d is not None]


@functools.cache
def targets() -> dict[str, Claims]:
    """Each family's performance targets (the ``targets`` of its claims document), by family, in registry order:
    judged by the audit's engine on a result set, they are the lines of its summary that have a target
    (``analysis.summary``)."""
    out = {}
    for fam in FAMILIES.values():
        doc = fam.claims_document()
        if doc is not None and doc[1].get("targets"):
            out[fam.name] = load_targets(evaluators(), [doc])
    ids = [t.id for ts in out.values() for t in ts]
    taken = set(claims().by_id()) | {c.whole.id for c in claims() if c.whole}
    clash = sorted({i for i in ids if ids.count(i) > 1} | (set(ids) & taken))
    if clash:
        raise ValueError(f"target ids used twice or by a claim: {clash}")
    return out


def implementations() -> set[str]:
    """Every implementation name a family's rows may carry (its plan's ``IMPLS``): what a claim's subject names."""
    return {impl for f in FAMILIES.values() for impl in getattr(f.plan, "IMPLS", ())}


@functools.cache
def claims() -> Claims:
    """Every claim the audit judges and the report shows: the articles' registry, then each family's own claim
    file, read and validated once (``analysis.audit.claims``; a subject names an implementation of
    ``implementations``)."""
    return load_claims(evaluators(), claim_documents(), implementations=implementations())
