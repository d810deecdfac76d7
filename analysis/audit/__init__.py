"""The claims audit engine: the claims (``claims``), what they are judged from (``context``), verdicts and the
helpers that judge (``verdicts``), borderline bands (``band``) and the audit itself (``engine``). The
evaluators live with their families (``analysis/families/<family>/claims.py``), except those of the articles'
GPU arithmetic (``arithmetic``), which are about no family; the registry collects both
(``analysis.registry.evaluators``)."""

from analysis.audit.claims import PART_SEP, REGISTRY, Claim, Claims, Quote, Subject, load_claims, part_id
from analysis.audit.context import ANALYTIC, Context, Results, Selection, evidence
from analysis.audit.engine import COLUMNS, audit, judge, summary
from analysis.audit.verdicts import VERDICTS, Evaluators, Untestable, Verdict, combine, judge_part

__all__ = [
    "ANALYTIC",
    "COLUMNS",
    "PART_SEP",
    "Quote",
    "REGISTRY",
    "Subject",
    "VERDICTS",
    "Claim",
    "Claims",
    "Context",
    "Evaluators",
    "Results",
    "Selection",
    "Untestable",
    "Verdict",
    "audit",
    "combine",
    "evidence",
    "judge",
    "judge_part",
    "load_claims",
    "part_id",
    "summary",
]
