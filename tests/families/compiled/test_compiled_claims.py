"""The FA-3 claims: compiled-kernel facts (registers, MMA issue, TMA issue slots) and the ablation."""

from __future__ import annotations

import pandas as pd
import pytest
from audit_helpers import judge
from figure_helpers import ATTENTION
from figure_helpers import attention_row as _row

from analysis.audit import ANALYTIC, Context, Results


def _compiled_row(experiment, variant, target="sm_90", **facts) -> dict:
    base = dict(
        experiment=experiment,
        kernel="fa2" if experiment == "mma-issue" else "fa3",
        target=target,
        head_dim=128,
        dtype="bfloat16",
        causal=False,
        variant=variant,
        tile_m=64,
        tile_n=128,
        status="ok",
        message="",
        load_loop_spills=0,
        load_loop_instructions=0,
        load_loop_tma=0,
        load_loop_thread_loads=0,
        loop_mma=16,
        setmaxnreg="",
    )
    return {**base, **facts}


def _claims_ctx(compiled_rows=None, rows=None):
    ctx = Context()
    if compiled_rows:
        ctx.tables["compiled"] = Results({ANALYTIC: pd.DataFrame(compiled_rows)}, {ANALYTIC: "k.csv"})
    if rows:
        ctx.tables["attention"] = Results({"h200": ATTENTION.frame(rows)}, {"h200": "attention.csv"})
    return ctx


def _judge(cid, ctx, claims):
    return judge([claims[cid]], ctx)


def test_compiled_claims_without_the_table_are_untestable(claims):
    for cid in ("tma-registers", "wgmma-issue", "tma-issue-slots"):
        row = _judge(cid, _claims_ctx(), claims).iloc[0]
        assert row["verdict"] == "untestable" and "compiled family" in row["note"], row


@pytest.mark.parametrize(
    "cp_spills, verdict, observed",
    [
        ((3, 2, 0), "partly", "33–48 registers"),  # spills at 56, none at 72: saves 33–48, overlapping 30–40
        ((3, 0, 0), "partly", "17–32 registers"),  # none at 56: 17–32 overlaps 30–40 without lying inside it
        ((0, 0, 0), "untestable", ""),
    ],  # never spills: no lower bound on what it needs
)
def test_tma_registers_from_the_spill_boundary(claims, cp_spills, verdict, observed):
    rows = [_compiled_row("producer-registers", "fa3", producer_regs=r, setmaxnreg=f"{r}/240") for r in (24, 40, 56)]
    rows += [
        _compiled_row("producer-registers", "no-tma", producer_regs=r, setmaxnreg=f"{r}/224", load_loop_spills=s)
        for r, s in zip((40, 56, 72), cp_spills, strict=True)
    ]
    row = _judge("tma-registers", _claims_ctx(rows), claims).iloc[0]
    assert row["verdict"] == verdict, row
    assert row["observed"].startswith(observed)


def test_wgmma_issue_counts_mma_instructions_per_tile(claims):
    rows = [
        _compiled_row("mma-issue", "sm_90", target="sm_90", loop_mma=16, tile_m=128),
        _compiled_row("mma-issue", "sm_80", target="sm_80", loop_mma=256, tile_m=128),
    ]
    row = _judge("wgmma-issue", _claims_ctx(rows), claims).iloc[0]
    assert row["verdict"] == "partly" and row["observed"].startswith("16× fewer"), row  # fewer, not 4×
    rows[1]["loop_mma"] = 64
    assert _judge("wgmma-issue", _claims_ctx(rows), claims).iloc[0]["verdict"] == "holds"


def test_tma_issue_slots_compares_the_producer_loops(claims):
    rows = [
        _compiled_row("fa3-schedules", "fa3", load_loop_instructions=39, load_loop_tma=2),
        _compiled_row("fa3-schedules", "no-tma", load_loop_instructions=395, load_loop_thread_loads=32),
    ]
    row = _judge("tma-issue-slots", _claims_ctx(rows), claims).iloc[0]
    assert row["verdict"] == "holds" and row["observed"].startswith("10.1× more"), row


@pytest.mark.parametrize(
    "costs, verdict",
    [((30, 6, 6, 20), "holds"), ((30, -3, 6, 20), "partly"), ((1, -3, 2, 0), "fails")],
)
def test_fa3_techniques_from_the_ablation(claims, costs, verdict):
    ablated = ["ours-fa3-no-warp-specialize", "ours-fa3-no-pingpong", "ours-fa3-no-overlap", "ours-fa3-no-tma"]
    rows = [_row("fa3-ablation", "ours-fa3", 8192, b=2, ms=1.0)]
    rows += [_row("fa3-ablation", impl, 8192, b=2, ms=1 + c / 100) for impl, c in zip(ablated, costs, strict=True)]
    row = _judge("fa3-techniques", _claims_ctx(rows=rows), claims)
    row = row[row["gpu"] == "h200"].iloc[0]
    assert row["verdict"] == verdict, row
    assert f"warp specialisation {costs[0]:+d}%" in row["observed"]
