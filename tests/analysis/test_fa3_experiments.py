"""The FA-3 wiring of the attention grid: implementations, the ablation's shards, its figures and the
names the torch-free spec keeps in step with the kernel's schedules."""

from __future__ import annotations

import matplotlib
import pandas as pd
import pytest
from test_experiment_figures import _row

from analysis import fa3_figures, figures
from analysis.core.tables import to_frame
from analysis.experiments import grid, spec
from analysis.experiments.spec import Spec

matplotlib.use("Agg")


def test_spec_names_follow_the_kernel():
    from kernels.attention import fa3

    assert set(spec.FA3_ABLATIONS) | {"fa3"} == set(fa3.SCHEDULES)
    assert set(fa3_figures.ABLATION_ORDER) == set(spec.FA3_IMPLS)


def test_every_fa3_name_is_an_implementation():
    from analysis.experiments.attention import implementation

    for impl in spec.FA3_IMPLS:
        assert callable(implementation(impl))
    with pytest.raises(ValueError, match="unknown implementation"):
        implementation("ours-fa3-no-such-switch")


def test_ablation_shards_from_the_config():
    att = {"warmup_ms": 25, "rep_ms": 100, "check_rows": 128,
           "fa3_ablation": {"enabled": True, "tokens": 16384, "hidden": 2048, "dtype": "float16",
                            "head_dims": [64, 128], "causal": [False], "seqlens": [8192],
                            "impls": list(spec.FA3_IMPLS) + ["ours-fa2"],
                            "warmup_ms": None, "rep_ms": None}}  # fmt: skip
    for key in ("fa2_setting", "fa1_setting", "gain_surface", "block_sweep", "rescale_ablation", "memory", "decode",
                "fp8_speed", "fp8_accuracy", "varlen"):  # fmt: skip
        att[key] = {"enabled": False, "configs": None}
    att["traffic"] = {"block_sweep": {"configs": []}}
    shards = grid.attention_shards(att)
    assert sorted(shards) == ["fa3-ablation_float16_d128_full", "fa3-ablation_float16_d64_full"]
    s = Spec(**shards["fa3-ablation_float16_d128_full"])
    assert s.shape(0) == (2, 16, 8192, 8192) and s.points() == len(spec.FA3_IMPLS) + 1
    with pytest.raises(ValueError, match="forward pass only"):
        Spec(**{**shards["fa3-ablation_float16_d128_full"], "mode": "bwd"})
    with pytest.raises(ValueError, match="do not belong"):
        Spec(**{**shards["fa3-ablation_float16_d128_full"], "impls": ["naive"]})


def _table() -> pd.DataFrame:
    rows = []
    for dtype in ("float16", "bfloat16"):
        for causal in (False, True):
            for n in (1024, 4096, 16384):
                for impl, tf in (("ours-fa1", 60), ("ours-fa2", 450), ("ours-fa3", 600), ("sdpa-cudnn", 590),
                                 ("sdpa-flash", 340), ("naive", 120)):  # fmt: skip
                    if impl == "ours-fa1" and dtype == "bfloat16":
                        continue
                    status = "unsupported" if (impl, n, causal) == ("ours-fa3", 1024, True) else "ok"
                    ms = 4 * (16384 // n) * 16 * n * n * 128 / (2 if causal else 1) / (tf * 1e12) * 1e3
                    rows.append(_row("fa2-setting", impl, n, b=16384 // n, causal=causal, ms=ms, status=status,
                                     dtype=dtype))  # fmt: skip
    for d in (64, 128):
        impls = fa3_figures.ABLATION_ORDER + ["ours-fa2", "sdpa-cudnn"]
        for impl, tf in zip(impls, (600, 590, 570, 480, 430, 450, 590), strict=True):
            ms = 4 * 2 * (2048 // d) * 8192 * 8192 * d / (tf * 1e12) * 1e3
            rows.append(_row("fa3-ablation", impl, 8192, d=d, b=2, h=2048 // d, ms=ms))
    return to_frame(rows)


def test_ladder_draws_the_three_generations(tmp_path):
    table = fa3_figures.fa3_ladder(_table(), tmp_path / "ladder.png")
    assert (tmp_path / "ladder.png").stat().st_size > 10_000
    drawn = table[table["status"] == "ok"]
    assert set(drawn["impl"]) == {"ours-fa1", "ours-fa2", "ours-fa3", "sdpa-flash", "sdpa-cudnn"}  # naive left out
    assert (table["status"] == "unsupported").sum() == 2 and set(drawn["head_dim"]) == {128}  # both dtypes


def test_ablation_labels_the_change_against_the_full_schedule(tmp_path):
    table = fa3_figures.fa3_ablation(_table(), tmp_path / "ablation.png")
    assert (tmp_path / "ablation.png").stat().st_size > 10_000
    row = table[(table["impl"] == "ours-fa3-no-tma") & (table["head_dim"] == 128)].iloc[0]
    assert row["change_pct"] == pytest.approx(100 * (480 / 600 - 1), rel=1e-6)
    assert (table.loc[table["impl"] == "ours-fa3", "change_pct"].abs() < 1e-9).all()


def test_figures_skip_without_fa3_rows(tmp_path):
    t = _table()
    t = t[~t["impl"].str.startswith("ours-fa3")]
    for draw in (fa3_figures.fa3_ladder, fa3_figures.fa3_ablation):
        with pytest.raises(figures.NoDataError):
            draw(t, tmp_path / "x.png")


# ---------------------------------------------------------------------------------------------------
# The FA-3 claims: compiled-kernel facts and the ablation
# ---------------------------------------------------------------------------------------------------


def _compiled_row(experiment, variant, target="sm_90", **facts) -> dict:
    base = dict(experiment=experiment, kernel="fa2" if experiment == "mma-issue" else "fa3", target=target,
                head_dim=128, dtype="bfloat16", causal=False, variant=variant, tile_m=64, tile_n=128,
                status="ok", message="", load_loop_spills=0, load_loop_instructions=0, load_loop_tma=0,
                load_loop_thread_loads=0, loop_mma=16, setmaxnreg="")  # fmt: skip
    return {**base, **facts}


def _claims_ctx(compiled_rows=None, rows=None):
    from analysis import audit

    ctx = audit.Context(compiled=pd.DataFrame(compiled_rows) if compiled_rows else None, compiled_path="k.csv")
    if rows:
        ctx.tables, ctx.paths = {"h200": to_frame(rows)}, {"h200": "attention.csv"}
    return ctx


def _judge(cid, ctx):
    from analysis import audit

    claim = {c.id: c for c in audit.load_registry()}[cid]
    return audit.audit([claim], ctx)


def test_compiled_claims_without_the_table_are_untestable():
    for cid in ("tma-registers", "wgmma-issue", "tma-issue-slots"):
        row = _judge(cid, _claims_ctx()).iloc[0]
        assert row["verdict"] == "untestable" and "compiled_kernels" in row["note"], row


@pytest.mark.parametrize(
    "cp_spills, verdict, observed",
    [((3, 2, 0), "partly", "33–48 registers"),  # spills at 56, none at 72: saves 33–48, overlapping 30–40
     ((3, 0, 0), "partly", "17–32 registers"),  # none at 56: 17–32 overlaps 30–40 without lying inside it
     ((0, 0, 0), "untestable", "")],  # never spills: no lower bound on what it needs
)  # fmt: skip
def test_tma_registers_from_the_spill_boundary(cp_spills, verdict, observed):
    rows = [_compiled_row("producer-registers", "fa3", producer_regs=r, setmaxnreg=f"{r}/240") for r in (24, 40, 56)]
    rows += [_compiled_row("producer-registers", "no-tma", producer_regs=r, setmaxnreg=f"{r}/224",
                           load_loop_spills=s) for r, s in zip((40, 56, 72), cp_spills, strict=True)]  # fmt: skip
    row = _judge("tma-registers", _claims_ctx(rows)).iloc[0]
    assert row["verdict"] == verdict, row
    assert row["observed"].startswith(observed)


def test_wgmma_issue_counts_mma_instructions_per_tile():
    rows = [_compiled_row("mma-issue", "sm_90", target="sm_90", loop_mma=16, tile_m=128),
            _compiled_row("mma-issue", "sm_80", target="sm_80", loop_mma=256, tile_m=128)]  # fmt: skip
    row = _judge("wgmma-issue", _claims_ctx(rows)).iloc[0]
    assert row["verdict"] == "partly" and row["observed"].startswith("16× fewer"), row  # fewer, not 4×
    rows[1]["loop_mma"] = 64
    assert _judge("wgmma-issue", _claims_ctx(rows)).iloc[0]["verdict"] == "holds"


def test_tma_issue_slots_compares_the_producer_loops():
    rows = [_compiled_row("fa3-schedules", "fa3", load_loop_instructions=39, load_loop_tma=2),
            _compiled_row("fa3-schedules", "no-tma", load_loop_instructions=395,
                          load_loop_thread_loads=32)]  # fmt: skip
    row = _judge("tma-issue-slots", _claims_ctx(rows)).iloc[0]
    assert row["verdict"] == "holds" and row["observed"].startswith("10.1× more"), row


@pytest.mark.parametrize(
    "costs, verdict",
    [((30, 6, 6, 20), "holds"), ((30, -3, 6, 20), "partly"), ((1, -3, 2, 0), "fails")],
)
def test_fa3_techniques_from_the_ablation(costs, verdict):
    ablated = ["ours-fa3-no-warp-specialize", "ours-fa3-no-pingpong", "ours-fa3-no-overlap", "ours-fa3-no-tma"]
    rows = [_row("fa3-ablation", "ours-fa3", 8192, b=2, ms=1.0)]
    rows += [_row("fa3-ablation", impl, 8192, b=2, ms=1 + c / 100) for impl, c in zip(ablated, costs, strict=True)]
    row = _judge("fa3-techniques", _claims_ctx(rows=rows))
    row = row[row["gpu"] == "h200"].iloc[0]
    assert row["verdict"] == verdict, row
    assert f"warp specialisation {costs[0]:+d}%" in row["observed"]
