"""The MoE family: its plan and config section, its run in Triton's interpreter (float16, tiny shapes), its
figures and its evaluators, on synthetic operator tables (``ops_helpers``)."""

from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from fake_harness import MS
from figure_helpers import render
from ops_helpers import OPS, moe_rows, quant_rows, table, verdict

from analysis import budget, configuration, registry
from analysis.core.flops import gemm_flops, moe_ffn_flops
from analysis.families.moe import plan as moeplan
from analysis.families.moe import run as moerun

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "workflow" / "config.yaml"
FULL = ROOT / "workflow" / "config-full.yaml"
DEFAULT = configuration.load_config([CONFIG])


def test_default_shards_and_budget():
    shards = moeplan.shards(DEFAULT)
    assert set(shards) == {
        "moe_mixtral_bfloat16_uniform",
        "moe_deepseek_bfloat16_uniform",
        "moe_qwen_bfloat16_uniform",
        "moe_deepseek_bfloat16_zipf",
    }
    assert budget.budget(registry.family("moe"), DEFAULT)["moe"]["seconds"] <= 70  # the default grid stays small


def test_full_config_has_every_shape():
    shards = moeplan.shards(configuration.load_config([CONFIG, FULL]))
    every = {(m, r) for m in moeplan.SHAPES for r in ("uniform", "zipf")}
    assert {(f["model"], f["routing"]) for f in shards.values()} == every
    assert all(f["tokens"][0] == 1 and f["tokens"][-1] == 16384 for f in shards.values())


@pytest.mark.parametrize(
    "fields, match",
    [
        pytest.param({"routing": "skewed"}, "unknown routing", id="routing"),
        pytest.param({"top_k": 9}, "top_k=9 must be", id="top-k"),
        pytest.param({"tokens": []}, "token counts", id="tokens"),
    ],
)
def test_spec_validation(fields, match):
    base = dict(
        model="t",
        experts=5,
        top_k=2,
        hidden=24,
        ffn=40,
        dtype="float16",
        tokens=[3],
        routing="uniform",
        impls=["ours-moe"],
    )
    with pytest.raises(ValueError, match=match):
        moeplan.MoeSpec(**{**base, **fields})


def test_overlapping_grids_are_refused():
    config = copy.deepcopy(DEFAULT)
    config["moe"]["grids"] = config["moe"]["grids"] + [config["moe"]["grids"][0]]
    with pytest.raises(ValueError, match="makes shard 'moe_mixtral_bfloat16_uniform' twice"):
        moeplan.shards(config)


def test_disabled_section_makes_no_shards():
    off = copy.deepcopy(DEFAULT)
    off["moe"]["enabled"] = False
    assert registry.family("moe").shards(off) == {}


def test_schema_names_the_catalogue():
    assert configuration.schema()["$defs"]["moe_model"]["enum"] == list(moeplan.SHAPES)
    assert registry.family("moe").config_schema()["properties"]["impls"]["items"]["enum"] == list(moeplan.IMPLS)


@pytest.mark.parametrize(
    "bad",
    [{"grids": [{"models": ["mixtral"], "routings": ["skewed"], "tokens": [1]}]}, {"gather_max_gb": 0}],
    ids=["routing", "cap"],
)
def test_schema_rejects_bad_values(tmp_path, bad):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"moe": bad}))
    with pytest.raises(configuration.ConfigError):
        configuration.load_config([CONFIG, path])


def _moe_spec(**kw) -> moeplan.MoeSpec:
    fields = dict(
        model="tiny",
        experts=5,
        top_k=2,
        hidden=24,
        ffn=40,
        dtype="float16",
        tokens=[1, 37],
        routing="uniform",
        impls=list(moeplan.IMPLS),
        check_rows=8,
        gather_chunk_gib=1e-5,
    )
    return moeplan.MoeSpec(**{**fields, **kw})


@pytest.mark.parametrize("routing", ["uniform", "zipf"])
def test_moe_rows_untimed(env, routing):
    spec = _moe_spec(routing=routing)
    df = OPS.frame(moerun.run(spec, env, device="cpu", log_line=lambda s: None, timed=False))
    assert len(df) == spec.points() == 2 * (10 + 4)
    stages = df[df["impl"] == "ours-moe"]
    assert sorted(stages["stage"]) == sorted(["routing", "dispatch", "gemm", "combine", "total"] * 2)
    unsupported = df[df["status"] != "ok"]
    assert set(unsupported["impl"]) == {"torch-grouped-mm", "grouped-mm-moe"}  # bf16 on CUDA only
    assert (unsupported["status"] == "unsupported").all()
    ok = df[df["status"] == "ok"]
    # "ok" already means within the gate's bound; the errors are also small against the outputs (fp16)
    assert (ok["rel_err"] < 1e-2).all(), ok[["impl", "rel_err"]]
    assert set(ok["op"]) == {"moe-layer", "grouped-gemm"} and (df["m"] == df["tokens"] * 2).all()
    gather = ok[ok["impl"] == "gather-moe"]
    assert (gather["kernel_config"] == "chunk=1 slots").all()  # the tiny cap forces one slot per chunk
    # the candidate persistent grouped GEMM: the layer and the GEMM alone, a total row each (no stages)
    persistent = ok[ok["impl"].isin(["ours-moe-persistent", "ours-grouped-persistent"])]
    assert len(persistent) == 4 and (persistent["stage"] == "total").all()


def test_moe_timed_stage_rows(env, fake_timing):
    spec = _moe_spec(tokens=[9], impls=["ours-moe", "ours-grouped"], spread_rounds=1)
    df = OPS.frame(moerun.run(spec, env, device="cpu", log_line=lambda s: None))
    assert (df["status"] == "ok").all() and df["ms_median"].eq(MS).all()
    # one repeat round of each timed row: the four stages, the layer, the grouped GEMM
    assert len(fake_timing.rounds) == 6 and df["spread_rounds"].eq(1).all()
    total = df[(df["impl"] == "ours-moe") & (df["stage"] == "total")].iloc[0]
    assert total["tflops"] == pytest.approx(moe_ffn_flops(9, 2, 24, 40) / (MS * 1e-3) / 1e12)
    gemm = df[df["stage"] == "gemm"].iloc[0]
    assert gemm["tflops"] == total["tflops"] and gemm["model_bytes"] == total["model_bytes"]
    assert df[df["stage"] == "routing"]["tflops"].isna().all()
    grouped = df[df["impl"] == "ours-grouped"].iloc[0]
    assert grouped["tflops"] == pytest.approx(gemm_flops(18, 40, 24) / (MS * 1e-3) / 1e12)


def test_moe_gather_over_the_cap_is_unsupported_not_run(env):
    spec = _moe_spec(tokens=[16], impls=["gather-moe", "loop-moe"], gather_max_gb=1e-6)
    df = OPS.frame(moerun.run(spec, env, device="cpu", log_line=lambda s: None, timed=False))
    gather = df[df["impl"] == "gather-moe"].iloc[0]
    assert gather["status"] == "unsupported" and "gather_max_gb" in gather["message"]
    assert df[df["impl"] == "loop-moe"]["status"].eq("ok").all()


def test_moe_wrong_grouped_gemm_is_caught(env, fake_timing, monkeypatch):
    import kernels.moe as kmoe

    real = kmoe.grouped_gemm
    monkeypatch.setattr(kmoe, "grouped_gemm", lambda a, b, off, **kw: real(a, b, off, **kw) + 0.05)
    spec = _moe_spec(tokens=[20], impls=["ours-grouped", "loop-grouped"])
    df = OPS.frame(moerun.run(spec, env, device="cpu", log_line=lambda s: None))
    assert df.set_index("impl")["status"].to_dict() == {"ours-grouped": "mismatch", "loop-grouped": "ok"}
    assert len(fake_timing) == 1


def test_moe_wrong_layer_is_caught_with_its_stages(env, fake_timing, monkeypatch):
    """A wrong grouped GEMM inside our layer (the one moe_ffn and the gemm stage use): the layer's total and
    its four stage rows are mismatch rows, none of them timed; the loop still passes and is timed."""
    import kernels.moe.ffn as kffn

    real = kffn.grouped_gemm
    monkeypatch.setattr(kffn, "grouped_gemm", lambda a, b, off, **kw: real(a, b, off, **kw) * 1.1)
    spec = _moe_spec(tokens=[20], impls=["ours-moe", "loop-moe"])
    df = OPS.frame(moerun.run(spec, env, device="cpu", log_line=lambda s: None))
    ours = df[df["impl"] == "ours-moe"]
    assert sorted(ours["stage"]) == sorted(["routing", "dispatch", "gemm", "combine", "total"])
    assert (ours["status"] == "mismatch").all() and ours["ms_median"].isna().all()
    assert df[df["impl"] == "loop-moe"]["status"].tolist() == ["ok"] and len(fake_timing) == 1


def test_zipf_routing_follows_the_law():
    gen = torch.Generator().manual_seed(3)
    logits = moerun.routing_logits(40000, 8, "zipf", 1.2, gen, "cpu")
    top1 = torch.bincount(logits.argmax(-1), minlength=8).double() / 40000
    ranked = top1.sort(descending=True).values
    law = torch.arange(1, 9, dtype=torch.float64) ** -1.2
    assert torch.allclose(ranked, law / law.sum(), atol=0.01)
    uniform = torch.bincount(moerun.routing_logits(40000, 8, "uniform", 1.2, gen, "cpu").argmax(-1), minlength=8)
    assert (uniform.double() / 40000 - 1 / 8).abs().max() < 0.01


def test_moe_time_split_leaves_out_points_missing_a_stage(tmp_path):
    """A point whose combine stage did not finish is left out of the split (figure and audit alike) instead
    of having its other stages' shares inflated by a 0 for the missing one."""
    rows = [r for r in moe_rows() if not (r["tokens"] == 4096 and r["stage"] == "combine")]
    df = table(rows + quant_rows(), tmp_path)
    render("moe", df, tmp_path / "fig")
    split = pd.read_csv(tmp_path / "fig" / "moe_time_split.csv")
    assert split["tokens"].tolist() == [256]
    assert split["gemm_share"].iloc[0] == pytest.approx(0.3 / (0.02 + 0.05 + 0.3 + 0.03))
    note = verdict("moe-dense-inside", rows, tmp_path)["note"]
    assert "T=256" in note and "T=4096" not in note


def test_moe_dense_inside_share(tmp_path):
    v = verdict("moe-dense-inside", moe_rows(gemm_ms=0.08), tmp_path)
    assert v["verdict"] == "holds"  # (0.02 + 0.05 + 0.03) / 0.18 = 56% of the time
    assert v["observed"] == "routing + dispatch + combine 56% of the layer's time"
    assert "deepseek T=256 uniform: 56%" in v["note"]
    assert verdict("moe-dense-inside", moe_rows(gemm_ms=0.1), tmp_path)["verdict"] == "fails"  # exactly half


def test_figures_from_a_synthetic_table(tmp_path):
    entries = render("moe", table(moe_rows(), tmp_path), tmp_path / "fig")
    assert [e["name"] for e in entries] == ["moe_time_split", "moe_layer", "moe_grouped_gemm"]
    assert all(e["reason"] is None and Path(e["png"]).stat().st_size > 10_000 for e in entries)
    split = pd.read_csv(tmp_path / "fig" / "moe_time_split.csv")
    shares = split[["routing_share", "dispatch_share", "gemm_share", "combine_share"]].sum(axis=1)
    assert shares.round(9).eq(1).all()
    assert {e["section"] for e in entries} == {"moe"}


def test_figures_without_moe_rows_are_skipped(tmp_path):
    entries = render("moe", table(quant_rows(), tmp_path), tmp_path / "fig")
    assert all(e["png"] is None and ("MoE" in e["reason"] or "grouped-GEMM" in e["reason"]) for e in entries)


@pytest.mark.parametrize(
    "claim, rows, expected",
    [
        pytest.param("moe-dense-inside", moe_rows(gemm_ms=0.05), "holds", id="dense-inside-holds"),
        pytest.param("moe-dense-inside", moe_rows(gemm_ms=0.5), "fails", id="dense-inside-fails"),
        pytest.param("moe-grouped", moe_rows(), "holds", id="grouped-holds"),
        pytest.param("moe-grouped", moe_rows(gather_ms=0.8), "partly", id="grouped-partly"),
        pytest.param("moe-grouped", moe_rows(gather_ms=0.3), "fails", id="grouped-fails"),
        pytest.param("moe-grouped", quant_rows(), "untestable", id="grouped-no-moe-rows"),
        pytest.param("moe-grouped", None, "untestable", id="no-ops-table"),
    ],
)
def test_evaluators(claim, rows, expected, tmp_path):
    v = verdict(claim, rows, tmp_path)
    assert v["verdict"] == expected, v["note"]
    if expected == "untestable":
        assert v["note"]
    else:
        assert v["gpu"] == "h200" and v["evidence"].startswith("ops.csv")


def test_grouped_gemm_targets_and_the_persistent_candidate(tmp_path):
    """The targets hold ours-grouped to torch._grouped_mm at 4096 and 256 tokens (here equal times: fails);
    the persistent candidate, 1.25× faster, gets a line saying it would meet both, without a target of its own."""
    from analysis import registry, summary
    from analysis.families.moe import summary as moesummary

    rows = moe_rows()
    rows += [dict(r, impl="ours-grouped-persistent", ms_median=0.08) for r in rows if r["impl"] == "ours-grouped"]
    tables = {"ops": table(rows, tmp_path)}
    judged = summary.targets(tables, "h200").set_index("claim_id")
    assert judged.loc["moe-grouped-4096", "verdict"] == "fails" == judged.loc["moe-grouped-256", "verdict"]
    assert judged.loc["moe-grouped-4096", "observed"] == "1.00×"
    lines = [x for x in moesummary.lines(tables, registry.targets()["moe"].by_id()) if x.what.startswith("candidate")]
    assert len(lines) == 2 and all(x.measured == "1.25×; would meet it: yes" and not x.target for x in lines)
