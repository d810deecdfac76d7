"""The claims audit engine: the claims (``claims``), what they are judged from (``context``), verdicts and the
helpers that judge (``verdicts``), borderline bands (``band``) and the audit itself (``engine``). The
evaluators live with their families (``analysis/families/<family>/claims.py``)."""

from analysis.audit.claims import REGISTRY, Claim, load_claims
from analysis.audit.context import ANALYTIC, Context, Results
from analysis.audit.engine import COLUMNS, audit, summary
from analysis.audit.verdicts import VERDICTS, Evaluators, Untestable, Verdict

__all__ = ["ANALYTIC", "COLUMNS", "REGISTRY", "VERDICTS", "Claim", "Context", "Evaluators", "Results", "Untestable",
           "Verdict", "audit", "load_claims", "summary"]  # fmt: skip
