"""A claim's subject: the kernel a claim about a named kernel's speed is about (``Claim.subject``), checked when the
claims load, and the implementation an evaluator judges (``analysis.audit.subject.judged``): the official build
where its rows are, ours where it is not installed, did not finish or has no rows, and the words that say so."""

from __future__ import annotations

import pytest
from audit_helpers import FIXTURE_PATH, claim_entry, fixture_ctx, fixture_row, write_registry

from analysis import registry
from analysis.audit import Subject, load_claims
from analysis.audit.subject import judged


def _registry(tmp_path, subject: dict | None):
    extra = {"kind": ["measured"]} | ({"subject": subject} if subject is not None else {})
    return write_registry(tmp_path, [claim_entry("one", **extra)])


def _load(path):
    return load_claims(registry.evaluators(), path=path, implementations=registry.implementations())


def test_a_subject_loads_with_its_reason(tmp_path):
    claim = _load(_registry(tmp_path, {"impl": "upstream-fa", "ours": "ours-fa3", "why": "its  own\nkernels"}))[0]
    assert claim.subject == Subject("upstream-fa", "its own kernels", "ours-fa3") and claim.subject.official
    ours = _load(_registry(tmp_path, {"impl": "ours-fa1", "why": "no maintained build"}))[0].subject
    assert not ours.official and ours.ours == ""
    assert _load(_registry(tmp_path, None))[0].subject is None


@pytest.mark.parametrize(
    "subject, match",
    [
        pytest.param({"impl": "sdpa-flash", "why": "x"}, "official build: name ours beside it", id="official-alone"),
        pytest.param({"impl": "ours-fa1", "ours": "ours-fa2", "why": "x"}, "is ours already", id="ours-twice"),
        pytest.param(
            {"impl": "upstream-fb", "ours": "ours-fa3", "why": "x"},
            r"unknown implementations \['upstream-fb'\]",
            id="unknown",
        ),
        pytest.param(
            {"impl": "sdpa-flash", "ours": "ours-fa9", "why": "x"},
            r"unknown implementations \['ours-fa9'\]",
            id="unknown-ours",
        ),
        pytest.param({"impl": "sdpa-flash", "ours": "ours-fa2"}, "'why' is a required property", id="no-reason"),
        pytest.param({"impl": "sdpa-flash", "ours": "sdpa-cudnn", "why": "x"}, "does not match", id="ours-not-ours"),
        pytest.param({"impl": "Flash Attention", "why": "x"}, "does not match", id="not-a-name"),
    ],
)
def test_a_subject_that_is_not_one_is_refused(tmp_path, subject, match):
    with pytest.raises(ValueError, match=match):
        _load(_registry(tmp_path, subject))


def test_every_named_kernels_speed_claim_names_its_subject(claims):
    """FA-2's claims are judged on PyTorch's FA-2 backend, FA-3's on FlashAttention's own kernels, FA-1's and the
    FP8 kernel's on ours (no build of theirs runs here); each names a known implementation and says why."""
    subjects = {c.whole.id if c.whole else c.id: c.subject for c in claims.values() if c.subject}
    expected = {
        "fa2-mfu": ("sdpa-flash", "ours-fa2"),
        "incident-rollback": ("sdpa-flash", "ours-fa2"),
        "fa3-util": ("upstream-fa", "ours-fa3"),
        "fa1-mfu": ("ours-fa1", ""),
        "fa1-speed-mem": ("ours-fa1", ""),
        "fa2-vs-fa1": ("ours-fa2", ""),
        "bwd-faster": ("ours-fa2", ""),
        "fa3-techniques": ("ours-fa3", ""),
        "fp8-2pf": ("ours-fp8-block", ""),
        "flashdecoding": ("ours-decode", ""),
        "exp4-close": ("ours-fa2", ""),
        "exp-s0-slower": ("ours-fa2", ""),
    }
    assert {cid: (s.impl, s.ours) for cid, s in subjects.items()} == expected
    assert all(s.why for s in subjects.values())
    known = registry.implementations()
    assert all(s.impl in known and (not s.ours or s.ours in known) for s in subjects.values())
    # cuDNN's FP8 is a peer beside the FP8 claim, not its subject
    assert "cudnn-fp8" in subjects["fp8-2pf"].why and "not the subject" in subjects["fp8-2pf"].why


# --- which implementation a verdict is judged on ----------------------------------------------------------------

FA3 = Subject("upstream-fa", "FlashAttention's own kernels", "ours-fa3")


class _Claim:
    id = "c"

    def __init__(self, subject):
        self.subject = subject


def _judge(rows, subject=FA3, **where):
    ctx = fixture_ctx(rows)
    return judged(_Claim(subject), ctx.table("attention"), "h200", **where)


def test_the_official_build_is_judged_where_it_finished_ours_beside_it():
    j = _judge([fixture_row("upstream-fa"), fixture_row("ours-fa3")], experiment="fa2-setting")
    assert (j.impl, j.beside, j.official) == ("upstream-fa", "ours-fa3", True)
    assert j.text == "judged on upstream-fa, FlashAttention's own kernels; ours (ours-fa3) beside it"
    assert j.label("upstream-fa") == "official" and j.label("ours-fa3") == "ours" and j.evidence == ()


@pytest.mark.parametrize(
    "statuses, why",
    [
        pytest.param(["absent", "absent"], "is not installed here", id="not-installed"),
        pytest.param(["error", "unsupported", "error"], "did not finish here (2 error, 1 unsupported)", id="failed"),
        pytest.param([], "has no rows in this result set", id="no-rows"),
    ],
)
def test_ours_is_judged_where_the_official_build_has_no_rows_and_the_note_says_why(statuses, why):
    rows = [fixture_row("ours-fa3")] + [
        fixture_row("upstream-fa", status=s, message="why", seqlen_q=1024 * (i + 1), seqlen_k=1024 * (i + 1))
        for i, s in enumerate(statuses)
    ]
    j = _judge(rows, experiment="fa2-setting")
    assert (j.impl, j.beside, j.official) == ("ours-fa3", "", False)
    assert (
        j.text
        == f"judged on ours (ours-fa3): upstream-fa {why}; it is the claim's subject, FlashAttention's own kernels"
    )
    if statuses:  # the subject's rows that decided it are named in the evidence
        (sel,) = j.evidence
        assert sel.path == FIXTURE_PATH and len(sel.rows) == len(statuses) and sel.where["impl"] == "upstream-fa"
    else:
        assert j.evidence == ()


def test_only_the_selected_rows_count():
    # upstream's finished rows are in another experiment: at these rows it did not run
    rows = [fixture_row("upstream-fa", experiment="llama3-70b-heads"), fixture_row("ours-fa3")]
    assert _judge(rows, experiment="fa2-setting").impl == "ours-fa3"
    assert _judge(rows, experiment="llama3-70b-heads").impl == "upstream-fa"


def test_a_subject_that_is_ours_says_why_no_official_build_is():
    j = _judge([fixture_row("ours-fa1")], Subject("ours-fa1", "FA-1 has no maintained build"))
    assert (j.impl, j.beside, j.official) == ("ours-fa1", "", False)
    assert j.text == "judged on ours-fa1: FA-1 has no maintained build"
    with pytest.raises(ValueError, match="names no subject"):
        _judge([], None)
