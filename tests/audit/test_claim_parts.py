"""Compound claims: the registry's parts become claims of their own (``<id>.<part>``), each judged against
its own asserted value from the values the whole's evaluator observed."""

from __future__ import annotations

import copy

import pytest
import yaml

from analysis import audit, registry
from analysis.audit import Claim, Context, Verdict


def _registry(path=audit.REGISTRY) -> list[Claim]:
    return audit.load_claims(registry.evaluators(), path=path)


def _part(asserted: dict, tolerance: float = 0.0) -> Claim:
    whole = Claim("w", "S0", "whole", {"text": "x"}, "x", 0.0, {}, ("measured",), "fake")
    return Claim("w.p", "S0", "part", asserted, "x", tolerance, {}, ("measured",), "fake", part="p", whole=whole)


@pytest.mark.parametrize(
    ("asserted", "tolerance", "values", "expected"),
    [
        ({"range": [2, 4]}, 0.0, [2.0, 4.0], "holds"),
        ({"range": [2, 4]}, 0.0, [1.9, 3.0], "partly"),
        ({"range": [2, 4]}, 0.05, [1.9, 4.2], "holds"),
        ({"approx": 750}, 0.05, [712.5, 787.5], "holds"),
        ({"approx": 750}, 0.05, [696.0], "fails"),
        ({"at_least": 0.9}, 0.0, [1.2, 0.8], "partly"),
        ({"at_most": 5}, 0.0, [6.0], "fails"),
        ({"at_least": 0.9}, 0.0, [float("nan"), 1.0], "holds"),  # unfinished points do not count
    ],
)
def test_a_part_is_judged_against_its_own_asserted_value(asserted, tolerance, values, expected):
    assert audit.judge_part(_part(asserted, tolerance), values) == expected


def test_a_qualitative_part_or_no_value_is_an_error_naming_the_part():
    with pytest.raises(ValueError, match="'w.p' is qualitative"):
        audit.judge_part(_part({"text": "faster"}), [1.0])
    with pytest.raises(ValueError, match="'w.p': no finite observed value"):
        audit.judge_part(_part({"approx": 1}), [float("nan")])


def test_the_part_verdict_comes_from_the_whole_evaluation():
    part = _part({"range": [2, 4], "unit": "×"})
    seen = []

    def evaluate(claim, ctx):
        seen.append(claim.id)
        parts = {"p": ([3.0], "3.0×"), "q": ("fails", "")}
        return [Verdict("partly", "whole", "note", "evidence", gpu="g", parts=parts)]

    df = audit.audit([part], Context(), {"fake": evaluate}, band=False)
    assert seen == ["w"]  # the evaluator judges the whole claim
    row = df.iloc[0]
    assert (row["claim_id"], row["verdict"], row["observed"], row["unit"], row["note"]) == (
        "w.p",
        "holds",
        "3.0×",
        "×",
        "note",
    )
    missing = Claim("w.r", "S0", "r", {"approx": 1}, "x", 0.0, {}, ("measured",), "fake", part="r", whole=part.whole)
    with pytest.raises(ValueError, match="gives no verdict for part 'r' of claim 'w'"):
        audit.audit([missing], Context(), {"fake": evaluate}, band=False)


def test_an_untestable_whole_makes_every_part_untestable():
    def evaluate(claim, ctx):
        raise audit.Untestable("no rows")

    row = audit.audit([_part({"approx": 1})], Context(), {"fake": evaluate}, band=False).iloc[0]
    assert row["verdict"] == "untestable" and row["note"] == "no rows"


def test_the_registry_refuses_bad_part_names(tmp_path):
    data = yaml.safe_load(audit.REGISTRY.read_text(encoding="utf-8"))
    entry = next(c for c in data["claims"] if c.get("parts"))
    for parts, message in (
        (["a.b", "c"], r"claim 'mem-128k-head' \(claims/1/parts/0/part\): 'a.b' does not match"),
        (["x", "x"], "names a part twice"),
    ):
        bad = copy.deepcopy(data)
        whole = next(c for c in bad["claims"] if c["id"] == entry["id"])
        whole["parts"] = [{**whole["parts"][0], "part": name} for name in parts]
        path = tmp_path / "registry.yaml"
        path.write_text(yaml.safe_dump(bad, allow_unicode=True), encoding="utf-8")
        with pytest.raises(ValueError, match=message):
            _registry(path)


def test_the_shipped_compound_claims_come_as_parts():
    ids = {c.id for c in _registry()}
    assert {
        "fa1-speed-mem.speed",
        "fa1-speed-mem.memory",
        "exp4-close.vs-naive",
        "exp4-close.vs-official",
        "fa3-util.utilisation",
        "fa3-util.tflops",
        "incident-rollback.memory",
        "incident-rollback.latency",
        "fa2-mfu.utilisation",
        "fa2-mfu.tflops",
        "fa1-mfu.utilisation",
        "fa1-mfu.tflops",
    } <= ids
    assert not {"fa1-speed-mem", "exp4-close", "fa3-util"} & ids


def test_an_analytic_compound_claim_judges_each_number_of_its_own():
    parts = [c for c in _registry() if c.whole is not None and c.whole.id == "mem-128k-head"]
    df = audit.audit(parts, Context(), registry.evaluators()).set_index("claim_id")
    assert list(df.index) == ["mem-128k-head.elements", "mem-128k-head.s", "mem-128k-head.s-and-p"]
    assert (df["verdict"] == "holds").all() and (df["gpu"] == audit.ANALYTIC).all()
    s = df.loc["mem-128k-head.s"]
    assert s["observed"] == "S 34.36 GB" and s["asserted"] == "≈ 34.36 GB"


def test_a_part_no_experiment_can_check_is_untestable_beside_the_parts_that_hold():
    parts = [c for c in _registry() if c.whole is not None and c.whole.id == "a100-bw"]
    df = audit.audit(parts, Context(), registry.evaluators()).set_index("claim_id")["verdict"].to_dict()
    assert df == {
        "a100-bw.peak-bandwidth": "holds",
        "a100-bw.effective-bandwidth": "untestable",
        "a100-bw.fp16-peak": "holds",
    }
