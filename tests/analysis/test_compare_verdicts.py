"""Comparing two result sets' verdicts (``analysis.compare_verdicts``) on synthetic H200 sets: two runs whose
FA-3 utilisation straddles fa3-util's 75% edge, with and without repeat rounds, and the sets it refuses."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from audit_helpers import ATTENTION, fa3_run

from analysis import audit, compare_verdicts


def _set(folder, rows, gpu: str | None = "h200"):
    """A result set: ``attention.csv`` of ``rows`` (and an ``environment.json`` naming ``gpu``) in ``folder``."""
    folder.mkdir(parents=True)
    ATTENTION.write_rows([{**r, "inputs": "normal"} for r in rows], folder / "attention.csv")
    if gpu is not None:
        env = {"gpu": gpu, "gpu_name": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0", "git_sha": "0" * 40}
        (folder / "environment.json").write_text(json.dumps(env))
    return folder


def _main(capsys, *args) -> tuple[int, str]:
    status = compare_verdicts.main([str(a) for a in args])
    return status, capsys.readouterr().out


def test_a_change_flagged_borderline_in_both_sets_passes(tmp_path, capsys):
    a = _set(tmp_path / "a", fa3_run(0.74, rounds=0.02))
    b = _set(tmp_path / "b", fa3_run(0.76, rounds=0.02))
    status, out = _main(capsys, a, b)
    assert status == 0, out
    assert "1 verdict row differs:" in out
    assert "fa3-util.utilisation [h200]: fails → holds; borderline in A: yes, in B: yes: flagged in both" in out
    assert "A: 74% of the 989.4 TFLOP/s peak (ours-fa3) (band: holds, fails)" in out
    assert out.rstrip().endswith("each flagged in both sets")


def test_a_change_the_bands_missed_fails(tmp_path, capsys):
    """Without repeat rounds the p20-p80 bands miss the edge: the change was flagged in neither set."""
    a = _set(tmp_path / "a", fa3_run(0.74))
    b = _set(tmp_path / "b", fa3_run(0.76))
    status, out = _main(capsys, a, b)
    assert status == 1
    assert "fails → holds; borderline in A: no, in B: no: NOT FLAGGED in A and B" in out
    assert out.rstrip().endswith("1 of 1 not flagged borderline in both sets")
    one = _set(tmp_path / "c", fa3_run(0.76, rounds=0.02))  # flagged in the new run only: still a failure
    status, out = _main(capsys, a, one)
    assert status == 1 and "borderline in A: no, in B: yes: NOT FLAGGED in A" in out


def test_the_same_verdicts_pass_and_a_results_folder_holds_sets(tmp_path, capsys):
    """A results folder (one set per GPU type in its subfolders) compares like the set itself; a set without
    environment.json takes its GPU type from its folder's name. Far from the edge nothing differs."""
    a = _set(tmp_path / "a", fa3_run(0.60, rounds=0.02))
    _set(tmp_path / "results" / "h200", fa3_run(0.62, rounds=0.02), gpu=None)
    (tmp_path / "results" / "audit").mkdir()  # a results folder's other subfolders hold no tables
    status, out = _main(capsys, a, tmp_path / "results")
    assert status == 0 and "every verdict row is the same in both sets" in out
    assert "GPU types compared: h200" in out
    assert "borderline: 0 of" in out


def test_changes_judged_in_one_set_only_are_never_flagged():
    def frame(rows):
        df = pd.DataFrame([{c: "" for c in audit.COLUMNS} | r for r in rows])
        return df.assign(nth=0, borderline=df["borderline"].astype(bool))

    a = frame(
        [
            {"claim_id": "x", "gpu": "h200", "verdict": "holds", "band": "holds, fails", "borderline": True},
            {"claim_id": "y", "gpu": "h200", "verdict": "fails", "band": "fails", "borderline": False},
            {"claim_id": "z", "gpu": "a100", "verdict": "fails", "band": "fails", "borderline": False},
        ]
    )
    b = frame([{"claim_id": "x", "gpu": "h200", "verdict": "untestable", "note": "no rows", "borderline": False}])
    diff = compare_verdicts.changes(a, b, {"h200"})  # a100 is not compared: B has no set of it
    assert diff[["claim_id", "verdict_a", "verdict_b"]].values.tolist() == [
        ["x", "holds", "untestable"],
        ["y", "fails", "(no row)"],
    ]
    assert not diff["flagged"].any()
    assert {compare_verdicts._why(r) for r in diff.itertuples()} == {"NOT FLAGGED: judged in one set only"}


def test_sets_that_cannot_be_compared_are_named(tmp_path, capsys):
    a = _set(tmp_path / "a", fa3_run(0.74))
    other = _set(tmp_path / "other", fa3_run(0.74), gpu="a100-sxm4-80gb")
    (tmp_path / "empty").mkdir()
    for args, message in (
        ((a, tmp_path / "missing"), "missing: no such folder"),
        ((a, tmp_path / "empty"), "empty: no result tables (attention.csv, traffic.csv, ops.csv)"),
        ((a, other), "share no GPU type"),
    ):
        with pytest.raises(SystemExit) as exit_:
            compare_verdicts.main([str(x) for x in args])
        assert exit_.value.code == 2
        assert message in capsys.readouterr().err
    (tmp_path / "bad" / "h200").mkdir(parents=True)
    (tmp_path / "bad" / "h200" / "attention.csv").write_text("experiment,status\nfa2-setting,finished\n")
    with pytest.raises(SystemExit) as exit_:  # a table that fails its schema: the file and what is wrong
        compare_verdicts.main([str(a), str(tmp_path / "bad")])
    assert exit_.value.code == 2 and "h200/attention.csv, line 1: required columns" in capsys.readouterr().err
