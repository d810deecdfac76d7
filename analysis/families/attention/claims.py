"""The attention family's evaluators (``analysis.audit``), collected from its claim modules: the articles'
claims, and its own performance targets (``claims.yaml``)."""

from __future__ import annotations

from analysis.families.attention import fa3_claims, measured_claims, model_claims, subject_claims, targets

EVALUATORS = {
    **model_claims.EVALUATORS,
    **measured_claims.EVALUATORS,
    **subject_claims.EVALUATORS,
    **fa3_claims.EVALUATORS,
    **targets.EVALUATORS,
}
