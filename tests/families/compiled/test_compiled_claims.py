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


# ---- tc-95-inner: the inner loop's instruction mix -------------------------------------------------------

MIX_90 = dict(loop_mma=16, loop_instructions=555, loop_tensor_flops=1048576.0, loop_other_flops=12800.0)
MIX_80 = dict(loop_mma=256, loop_instructions=952, loop_tensor_flops=1048576.0, loop_other_flops=12800.0)
PIPES = dict(loop_pipe_fma=241, loop_pipe_alu=144, loop_pipe_xu=66, loop_pipe_memory=29, loop_pipe_uniform=52)


def _mix_rows():
    return [
        _compiled_row("mma-issue", "sm_90", target="sm_90", tile_m=128, loop_pipe_tensor=16, **PIPES, **MIX_90),
        _compiled_row("mma-issue", "sm_80", target="sm_80", tile_m=128, loop_pipe_tensor=256, **PIPES, **MIX_80),
    ]


def _inst_mix_row(gpu="h200", status="ok", **counts) -> dict:
    base = dict(experiment="traffic-inst-mix", impl="ours-fa2", seqlen=8192, head_dim=128, status=status, message="")
    return {**base, "gpu": gpu, **counts}


def test_tc_inner_static_mix_decides_without_a_profiler(claims):
    """Only the compiled table: the static share of tensor-core instructions per warp per tile decides; the
    FLOP share and the wgmma / mma.sync work ratio are in the evidence."""
    verdicts = _judge("tc-95-inner", _claims_ctx(_mix_rows()), claims)
    assert list(verdicts["gpu"]) == [ANALYTIC]
    row = verdicts.iloc[0]
    assert row["verdict"] == "fails"
    assert (
        row["observed"].startswith("2.9% on sm_90 (16 wgmma of 555 instructions")
        and "26.9% on sm_80" in row["observed"]
    )
    assert "98.8% of the FLOPs" in row["observed"]
    assert (
        "the share of instructions decides" in row["note"]
        and "work of 16 mma.sync (65536 against 4096 FLOPs per warp)" in row["note"]
    )


def test_tc_inner_executed_counts_decide_on_a_profiled_gpu(claims):
    ctx = _claims_ctx(_mix_rows())
    traffic = pd.DataFrame(
        [
            _inst_mix_row(inst_executed=1.0e9, inst_tensor_hmma=0.0, inst_tensor_gmma=3.0e7, inst_fma=4.4e8),
            _inst_mix_row(gpu="a100", inst_executed=1.0e9, inst_tensor_hmma=9.6e8),  # an imagined tensor-bound run
        ]
    )
    other = pd.DataFrame([dict(experiment="traffic-scaling", impl="naive", seqlen=1024, head_dim=64, status="ok")])
    frames = {"h200": traffic[traffic["gpu"] == "h200"], "a100": traffic[traffic["gpu"] == "a100"], "h100": other}
    ctx.tables["traffic"] = Results(frames, {g: f"{g}/traffic.csv" for g in frames})
    verdicts = _judge("tc-95-inner", ctx, claims).set_index("gpu")
    assert set(verdicts.index) == {ANALYTIC, "h200", "a100"}  # h100 has no instruction-mix pass: no verdict
    assert verdicts.loc["h200", "verdict"] == "fails" and verdicts.loc["h200", "observed"].startswith(
        "3.0% of executed"
    )
    assert "fma 44%" in verdicts.loc["h200", "note"] and "static SASS mix beside it" in verdicts.loc["h200", "note"]
    assert verdicts.loc["a100", "verdict"] == "holds"


def test_tc_inner_a_failed_profile_is_untestable_with_ncu_s_reason(claims):
    ctx = _claims_ctx(_mix_rows())
    bad = pd.DataFrame(
        [_inst_mix_row(status="error", message="==ERROR== Failed to find metric sm__inst_executed_pipe_x")]
    )
    ctx.tables["traffic"] = Results({"h200": bad}, {"h200": "traffic.csv"})
    verdicts = _judge("tc-95-inner", ctx, claims).set_index("gpu")
    assert verdicts.loc["h200", "verdict"] == "untestable" and "Failed to find metric" in verdicts.loc["h200", "note"]
    assert verdicts.loc[ANALYTIC, "verdict"] == "fails"
