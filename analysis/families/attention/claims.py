"""The attention family's evaluators (``analysis.audit``), collected from its claim modules."""

from __future__ import annotations

from analysis.families.attention import fa3_claims, measured_claims, model_claims

EVALUATORS = {**model_claims.EVALUATORS, **measured_claims.EVALUATORS, **fa3_claims.EVALUATORS}
