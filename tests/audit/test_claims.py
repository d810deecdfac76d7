"""The claims: the articles' registry and the families' own claim files, loaded and checked (ids, evaluators,
sources, what a claim not built yet needs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from audit_helpers import claim_entry, write_registry

from analysis import registry
from analysis.audit import REGISTRY, load_claims

ROOT = Path(__file__).resolve().parents[2]

# Every id of the project's claim catalog (claims.md); the registry must keep all of them.
CATALOG_IDS = [
    "mem-8k-scores",
    "mem-128k-head",
    "mem-128k-oom",
    "a100-bw",
    "time-128k-hbm",
    "time-128k-compute",
    "idle-95",
    "incident-16x",
    "incident-rollback",
    "std-bytes-formula",
    "std-flops",
    "ai-4096",
    "ai-limit",
    "ai-order-d",
    "a100-knee",
    "tc-bound-55",
    "std-mfu",
    "fa-hbm-on",
    "fa-exact",
    "fa1-speed-mem",
    "fa-gain-vanishes",
    "fa1-blocks",
    "recompute-flops-a",
    "recompute-flops-b",
    "mem-64k",
    "bwd-faster",
    "break-even-512",
    "fa-io-theorem",
    "io-ratio-20",
    "io-q2-8k",
    "io-q2-32k",
    "fa1-mfu",
    "online-softmax",
    "fp16-tolerance",
    "fa2-mfu",
    "fa2-vs-fa1",
    "causal-skip-50",
    "lazy-rescale",
    "h100-peak",
    "fa3-util",
    "tma-registers",
    "wgmma-issue",
    "fp8-2pf",
    "fp8-accuracy",
    "flashdecoding",
    "flashinfer",
    "fp32-16x",
    "varlen-waste",
    "block-64",
    "tc-95-inner",
    "exp1-oom-16k",
    "exp3-maxdiff",
    "exp4-close",
    "exp-s0-slower",
    "moe-dense-inside",
    "moe-grouped",
    "w4-bandwidth",
    "w4-fusion",
    "fp8-scales",
]


def test_registry_loads_every_catalog_claim(claims):
    assert len(CATALOG_IDS) == len(set(CATALOG_IDS)) == 59
    missing = sorted(set(CATALOG_IDS) - {c.whole.id if c.whole else c.id for c in claims.values()})
    assert missing == []


def test_registry_claims_are_well_formed(claims):
    evaluators = registry.evaluators()
    for claim in claims.values():
        assert claim.evaluator in evaluators or claim.evaluator == "not_built", claim.id
        assert claim.statement, claim.id
        assert claim.kind, claim.id
        assert claim.source.startswith(("S0 (", "S1 (")), claim.id
        if claim.evaluator == "not_built":
            assert claim.needs, claim.id


def test_load_registry_reads_the_default_path(claims):
    assert REGISTRY == ROOT / "analysis" / "audit" / "registry.yaml"
    ids = [c.id for c in load_claims(registry.evaluators(), path=REGISTRY)]
    assert list(claims)[: len(ids)] == ids  # the articles' registry first, then the families' own claims


def test_small_valid_registry_loads(tmp_path):
    path = write_registry(
        tmp_path,
        [claim_entry("one"), claim_entry("two", evaluator="not_built", needs="a kernel")],
    )
    claims = load_claims(registry.evaluators(), path=path)
    assert [c.id for c in claims] == ["one", "two"]
    assert claims[0].source == "S1 (b.txt) §1"
    assert claims[1].needs == "a kernel"
    assert claims[0].conditions == {}
    assert claims[0].topic_title == "A topic" and claims[0].where == "B (S1), Section 1"
    assert [q.text for q in claims[0].quotes] == ["words"]


@pytest.mark.parametrize(
    "entries, match",
    [
        pytest.param([claim_entry("dup"), claim_entry("dup")], "duplicate claim id 'dup'", id="duplicate-id"),
        pytest.param([claim_entry("odd", evaluator="no_such_evaluator")], "unknown evaluator", id="unknown-evaluator"),
        pytest.param(
            [claim_entry("later", evaluator="not_built")], "does not say what it needs", id="not-built-no-needs"
        ),
        pytest.param(
            [claim_entry("empty-needs", evaluator="not_built", needs="")],
            "does not say what it needs",
            id="not-built-empty-needs",
        ),
        pytest.param(
            [claim_entry("elsewhere", source={"article": "S9", "section": "x", "section_en": "x"})],
            "unknown article",
            id="unknown-article",
        ),
        pytest.param(
            [claim_entry("quoted", quote=[{"article": "S7", "text": "x"}])], "unknown article 'S7'", id="quote-article"
        ),
        pytest.param(
            [claim_entry("loose", tolerance=-0.1)],
            r"claim 'loose' \(claims/0/tolerance\): -0.1 is less than the minimum of 0",
            id="schema-tolerance",
        ),
        pytest.param([claim_entry("extra", colour="red")], "Additional properties", id="schema-unknown-field"),
        pytest.param(
            [claim_entry("two-values", asserted={"approx": 1, "range": [1, 2]})],
            "claim 'two-values'",
            id="schema-asserted",
        ),
    ],
)
def test_malformed_registry_is_rejected(tmp_path, entries, match):
    with pytest.raises(ValueError, match=match):
        load_claims(registry.evaluators(), path=write_registry(tmp_path, entries))


def test_the_gpu_arithmetic_is_judged_by_the_audit_and_no_family(claims, monkeypatch):
    """The articles' datasheet arithmetic (A100 bandwidth and knee, H100 peak, fp16 over fp32, N² growth) has
    its evaluators in ``analysis.audit.arithmetic``; the registry collects them beside the families', and a
    family that defined one of those names again would be refused."""
    from analysis.audit import arithmetic

    names = {"a100_bw", "a100_knee", "h100_peak", "incident_16x", "fp32_16x"}
    assert names <= set(arithmetic.EVALUATORS)
    assert all(registry.evaluators()[n] is arithmetic.EVALUATORS[n] for n in arithmetic.EVALUATORS)
    assert not any(names & set(f.evaluators()) for f in registry.FAMILIES.values())
    assert {c.evaluator for c in claims.values()} >= names
    attention = registry.family("attention")
    monkeypatch.setattr(type(attention), "evaluators", lambda self: {"a100_bw": None} if self is attention else {})
    with pytest.raises(ValueError, match="'a100_bw' is defined by the audit"):
        registry.evaluators()
