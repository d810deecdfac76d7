"""The W4A16 and MoE experiments: planning, schema, FLOP/byte models, the measuring modules in Triton's
interpreter (float16, tiny odd shapes), figures from a synthetic table and the audit's evaluators.

The GPU-only parts of the harness (CUDA-event timing, CUDA peak memory) are replaced by a fake that still
calls the timed callable once (tests/fake_harness.py, the ``fake_timing`` fixture of tests/analysis/conftest.py).
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from fake_harness import MS

from analysis import audit, ops_figures, ops_tables
from analysis.core import models
from analysis.core.flops import gemm_flops, moe_ffn_flops
from analysis.experiments import grid, moe, ops_grid, quant

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "workflow" / "config.yaml"
FULL = ROOT / "workflow" / "config-full.yaml"


# ---------------------------------------------------------------------------------------------------
# FLOP and byte models (hand-computed)
# ---------------------------------------------------------------------------------------------------


def test_gemm_and_moe_flops():
    assert gemm_flops(3, 5, 7) == 210
    # 2 tokens × top-2 = 4 rows; gate and up 2·4·8·6 each, down 2·4·6·8: 3 × 384
    assert moe_ffn_flops(2, 2, 8, 6) == 1152
    assert moe_ffn_flops(2, 1, 8, 12) == moe_ffn_flops(2, 2, 8, 6)  # the dense FFN of equal active FLOPs


def test_weight_byte_models():
    # 16 × 256 int4: 2048 B of codes; 2 groups of 128 per row, fp16 scale + uint8 zero: 16 × 2 × 3 = 96 B
    assert models.int4_weight_bytes(16, 256, 128, scale_bytes=2, zero_bytes=1) == 2144
    assert models.int4_weight_bytes(16, 256, 128, scale_bytes=2, zero_bytes=0) == 2112
    assert models.int4pack_weight_bytes(16, 256, 128) == 2048 + 16 * 2 * 4
    assert models.int8_weight_bytes(16, 256, scale_bytes=4) == 4096 + 64
    assert models.dense_weight_bytes(16, 256) == 8192
    assert models.unfused_dequant_bytes(16, 256, 2144) == 2144 + 2 * 8192
    assert models.moe_expert_weight_bytes(3, 8, 6) == 3 * 3 * 48 * 2
    assert models.gather_moe_bytes(2, 2, 8, 6) == 2 * 4 * 3 * 48 * 2
    with pytest.raises(ValueError, match="multiple of group_size"):
        models.int4_weight_bytes(16, 100, 32, 2)
    # 4096 × 14336 bf16 against int4 with float32 scales, uint8 zeros, group 128: 3.71× fewer bytes
    ratio = models.dense_weight_bytes(14336, 4096) / models.int4_weight_bytes(14336, 4096, 128, 4, 1)
    assert ratio == pytest.approx(2 / (0.5 + 5 / 128))


# ---------------------------------------------------------------------------------------------------
# Planning, budget, schema
# ---------------------------------------------------------------------------------------------------


def _cfg(*paths):
    return grid.load_config([CONFIG, *paths])


def test_default_shards_and_budget_quoted_in_the_config():
    shards = ops_grid.ops_shards(_cfg())
    assert set(shards) == {
        "w4a16_llama3-8b-up_bfloat16_g128", "w4a16_llama3-70b-up_bfloat16_g128", "w4a16_llama3-8b-down_bfloat16_g128",
        "moe_mixtral_bfloat16_uniform", "moe_deepseek_bfloat16_uniform", "moe_qwen_bfloat16_uniform",
        "moe_deepseek_bfloat16_zipf",
    }  # fmt: skip
    up = shards["w4a16_llama3-70b-up_bfloat16_g128"]
    assert (up["n"], up["k"]) == (28672, 8192)  # 8192 → 28672: the weight is [out, in]
    table = ops_grid.budget_table(shards)
    lines = CONFIG.read_text().splitlines()
    start = lines.index("#   " + table[0])  # the quant/moe budget block (the attention one is indented)
    assert lines[start : start + len(table)] == ["#   " + t for t in table]
    b = ops_grid.budget(shards)
    assert b["w4a16"]["seconds"] <= 70 and b["moe"]["seconds"] <= 70  # the default grid stays small


def test_full_config_has_every_shape():
    shards = ops_grid.ops_shards(_cfg(FULL))
    quant_models = {f["model"] for f in shards.values() if f["family"] == "quant"}
    assert quant_models == set(ops_grid.QUANT_SHAPES)
    moe_shards = [f for f in shards.values() if f["family"] == "moe"]
    every = {(m, r) for m in ops_grid.MOE_SHAPES for r in ("uniform", "zipf")}
    assert {(f["model"], f["routing"]) for f in moe_shards} == every
    assert all(f["tokens"][0] == 1 and f["tokens"][-1] == 16384 for f in moe_shards)
    assert shards["w4a16_llama3-8b-kv_bfloat16_g64"]["ms"] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096]


def test_planning_imports_no_torch():
    code = "import sys, analysis.experiments.ops_grid; "
    code += "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr


@pytest.mark.parametrize(
    "spec, fields, match",
    [
        pytest.param(ops_grid.QuantSpec, {"impls": ["marlin"]}, "unknown quant implementations", id="quant-impl"),
        pytest.param(ops_grid.QuantSpec, {"group_size": 48}, "group_size must be", id="group"),
        pytest.param(ops_grid.QuantSpec, {"k": 100}, "multiple of group_size", id="k"),
        pytest.param(ops_grid.MoeSpec, {"routing": "skewed"}, "unknown routing", id="routing"),
        pytest.param(ops_grid.MoeSpec, {"top_k": 9}, "top_k=9 must be", id="top-k"),
        pytest.param(ops_grid.MoeSpec, {"tokens": []}, "token counts", id="tokens"),
    ],
)
def test_spec_validation(spec, fields, match):
    base = (dict(model="t", n=40, k=96, dtype="float16", group_size=32, ms=[1], impls=["ours-w4a16"])
            if spec is ops_grid.QuantSpec else
            dict(model="t", experts=5, top_k=2, hidden=24, ffn=40, dtype="float16", tokens=[3], routing="uniform",
                 impls=["ours-moe"]))  # fmt: skip
    with pytest.raises(ValueError, match=match):
        spec(**{**base, **fields})


def test_overlapping_moe_grids_are_refused():
    m = _cfg()["moe"]
    with pytest.raises(ValueError, match="makes shard 'moe_mixtral_bfloat16_uniform' twice"):
        ops_grid.moe_shards({**m, "grids": m["grids"] + [m["grids"][0]]})


def test_disabled_sections_make_no_shards():
    cfg = _cfg()
    off = {"quant": {**cfg["quant"], "enabled": False}, "moe": {**cfg["moe"], "enabled": False}}
    assert ops_grid.ops_shards(off) == {}


def test_schema_names_the_catalogue_and_defaults_are_the_config():
    from snakemake.utils import validate

    schema = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())
    assert schema["$defs"]["quant_model"]["enum"] == list(ops_grid.QUANT_SHAPES)
    assert schema["$defs"]["moe_model"]["enum"] == list(ops_grid.MOE_SHAPES)
    assert schema["properties"]["quant"]["properties"]["impls"]["items"]["enum"] == list(ops_grid.QUANT_IMPLS)
    assert schema["properties"]["moe"]["properties"]["impls"]["items"]["enum"] == list(ops_grid.MOE_IMPLS)
    empty: dict = {}
    validate(empty, str(ROOT / "workflow" / "schemas" / "config.schema.yaml"))
    assert empty["quant"] == _cfg()["quant"] and empty["moe"] == _cfg()["moe"]


@pytest.mark.parametrize(
    "section, bad",
    [
        pytest.param("quant", {"models": ["llama3-8b-mlp"]}, id="quant-model"),
        pytest.param("quant", {"group_sizes": [48]}, id="group"),
        pytest.param("moe", {"grids": [{"models": ["mixtral"], "routings": ["skewed"], "tokens": [1]}]}, id="routing"),
        pytest.param("moe", {"gather_max_gb": 0}, id="cap"),
    ],
)
def test_schema_rejects_bad_values(tmp_path, section, bad):
    from snakemake.exceptions import WorkflowError

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({section: bad}))
    with pytest.raises(WorkflowError):
        _cfg(path)


def test_ops_result_schema_describes_every_column():
    schema = yaml.safe_load((ROOT / "workflow" / "schemas" / "ops_result.schema.yaml").read_text())
    assert list(schema["properties"]) == ops_tables.COLUMNS
    assert set(schema["required"]) == set(ops_tables.COLUMNS) - set(ops_tables.OPTIONAL)  # OPTIONAL: added later
    assert all(p.get("description") for p in schema["properties"].values())
    assert schema["properties"]["status"]["enum"] == list(ops_tables.STATUSES)
    assert schema["properties"]["stage"]["enum"] == list(ops_tables.STAGES)
    with pytest.raises(ValueError, match="outside the ops result schema"):
        ops_tables.to_frame([{"status": "ok", "speedup": 2.0}])


# ---------------------------------------------------------------------------------------------------
# The measuring modules in the interpreter
# ---------------------------------------------------------------------------------------------------


def _quant_spec(**kw) -> ops_grid.QuantSpec:
    fields = dict(model="tiny", n=40, k=96, dtype="float16", group_size=32, ms=[1, 3, 33],
                  impls=list(ops_grid.QUANT_IMPLS), check_rows=8)  # fmt: skip
    return ops_grid.QuantSpec(**{**fields, **kw})


def test_quant_rows_untimed(env):
    spec = _quant_spec()
    rows = quant.run(spec, env, device="cpu", log_line=lambda s: None, timed=False)
    df = ops_tables.to_frame(rows)
    assert len(df) == spec.points() == 3 * 5 + 1
    ok = df[df["status"] == "ok"]
    assert set(ok["impl"]) == set(ops_grid.QUANT_IMPLS) - {"torch-int4pack"}
    # PyTorch's int4 kernel is measured with bf16 on CUDA only: an honest row, not a gap
    int4pack = df[df["impl"] == "torch-int4pack"]
    assert (int4pack["status"] == "unsupported").all() and int4pack["message"].str.contains("CUDA").all()
    gated = ok[ok["impl"] != "copy-weight"]
    assert (gated["max_abs_err"] <= gated["err_bound"]).all() and gated["ms_median"].isna().all()
    assert (~df["timed"].astype(bool)).all()
    w4 = ok[ok["impl"] == "ours-w4a16"]
    assert (w4["model_bytes"] == models.int4_weight_bytes(40, 96, 32, 2, 1)).all()  # fp16 scales, uint8 zeros
    # the quantisation's own error is far above rounding, and int4's above int8's
    assert (w4["quant_err"] > 10 * w4["rel_err"]).all()
    assert ok[ok["impl"] == "ours-w8a16"]["quant_err"].max() < w4["quant_err"].min()
    assert ok[ok["impl"] == "torch-linear"]["quant_err"].isna().all()
    assert w4["kernel_config"].str.len().gt(0).all()
    copy = df[df["impl"] == "copy-weight"].iloc[0]
    assert math.isnan(copy["m"]) and copy["model_bytes"] == 2 * 40 * 12 * 4


def test_quant_timed_rows_have_rates(env, fake_timing):
    spec = _quant_spec(ms=[5], impls=["ours-w4a16", "torch-linear", "copy-weight"], warmup_ms=3, rep_ms=7)
    df = ops_tables.to_frame(quant.run(spec, env, device="cpu", log_line=lambda s: None))
    assert (df["status"] == "ok").all() and df["timed"].all()
    w4 = df[df["impl"] == "ours-w4a16"].iloc[0]
    assert w4["tflops"] == pytest.approx(2 * 5 * 40 * 96 / (MS * 1e-3) / 1e12)
    assert w4["gbps"] == pytest.approx(w4["model_bytes"] / (MS * 1e-3) / 1e9)
    assert w4["peak_mem_mib"] == 1.5 and set(fake_timing) == {(3, 7)}


def test_quant_wrong_kernel_is_a_mismatch_never_timed(env, fake_timing, monkeypatch):
    from kernels import w4a16

    real = w4a16.matmul
    monkeypatch.setattr(w4a16, "matmul", lambda x, pw, bias=None, config=None: real(x, pw) * 1.01)
    spec = _quant_spec(ms=[2], impls=["ours-w4a16", "dequant-linear"])
    df = ops_tables.to_frame(quant.run(spec, env, device="cpu", log_line=lambda s: None))
    bad = df[df["impl"] == "ours-w4a16"].iloc[0]
    assert bad["status"] == "mismatch" and "max-abs error" in bad["message"]
    assert math.isnan(bad["ms_median"]) and len(fake_timing) == 1  # only dequant-linear was timed


def _moe_spec(**kw) -> ops_grid.MoeSpec:
    fields = dict(model="tiny", experts=5, top_k=2, hidden=24, ffn=40, dtype="float16", tokens=[1, 37],
                  routing="uniform", impls=list(ops_grid.MOE_IMPLS), check_rows=8, gather_chunk_gib=1e-5)  # fmt: skip
    return ops_grid.MoeSpec(**{**fields, **kw})


@pytest.mark.parametrize("routing", ["uniform", "zipf"])
def test_moe_rows_untimed(env, routing):
    spec = _moe_spec(routing=routing)
    df = ops_tables.to_frame(moe.run(spec, env, device="cpu", log_line=lambda s: None, timed=False))
    assert len(df) == spec.points() == 2 * (8 + 4)
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


def test_moe_timed_stage_rows(env, fake_timing):
    spec = _moe_spec(tokens=[9], impls=["ours-moe", "ours-grouped"])
    df = ops_tables.to_frame(moe.run(spec, env, device="cpu", log_line=lambda s: None))
    assert (df["status"] == "ok").all() and df["ms_median"].eq(MS).all()
    total = df[(df["impl"] == "ours-moe") & (df["stage"] == "total")].iloc[0]
    assert total["tflops"] == pytest.approx(moe_ffn_flops(9, 2, 24, 40) / (MS * 1e-3) / 1e12)
    gemm = df[df["stage"] == "gemm"].iloc[0]
    assert gemm["tflops"] == total["tflops"] and gemm["model_bytes"] == total["model_bytes"]
    assert df[df["stage"] == "routing"]["tflops"].isna().all()
    grouped = df[df["impl"] == "ours-grouped"].iloc[0]
    assert grouped["tflops"] == pytest.approx(gemm_flops(18, 40, 24) / (MS * 1e-3) / 1e12)


def test_moe_gather_over_the_cap_is_unsupported_not_run(env):
    spec = _moe_spec(tokens=[16], impls=["gather-moe", "loop-moe"], gather_max_gb=1e-6)
    df = ops_tables.to_frame(moe.run(spec, env, device="cpu", log_line=lambda s: None, timed=False))
    gather = df[df["impl"] == "gather-moe"].iloc[0]
    assert gather["status"] == "unsupported" and "gather_max_gb" in gather["message"]
    assert df[df["impl"] == "loop-moe"]["status"].eq("ok").all()


def test_moe_wrong_grouped_gemm_is_caught(env, fake_timing, monkeypatch):
    import kernels.moe as kmoe

    real = kmoe.grouped_gemm
    monkeypatch.setattr(kmoe, "grouped_gemm", lambda a, b, off, **kw: real(a, b, off, **kw) + 0.05)
    spec = _moe_spec(tokens=[20], impls=["ours-grouped", "loop-grouped"])
    df = ops_tables.to_frame(moe.run(spec, env, device="cpu", log_line=lambda s: None))
    assert df.set_index("impl")["status"].to_dict() == {"ours-grouped": "mismatch", "loop-grouped": "ok"}
    assert len(fake_timing) == 1


def test_moe_wrong_layer_is_caught_with_its_stages(env, fake_timing, monkeypatch):
    """A wrong grouped GEMM inside our layer (the one moe_ffn and the gemm stage use): the layer's total and
    its four stage rows are mismatch rows, none of them timed; the loop still passes and is timed."""
    import kernels.moe.ffn as kffn

    real = kffn.grouped_gemm
    monkeypatch.setattr(kffn, "grouped_gemm", lambda a, b, off, **kw: real(a, b, off, **kw) * 1.1)
    spec = _moe_spec(tokens=[20], impls=["ours-moe", "loop-moe"])
    df = ops_tables.to_frame(moe.run(spec, env, device="cpu", log_line=lambda s: None))
    ours = df[df["impl"] == "ours-moe"]
    assert sorted(ours["stage"]) == sorted(["routing", "dispatch", "gemm", "combine", "total"])
    assert (ours["status"] == "mismatch").all() and ours["ms_median"].isna().all()
    assert df[df["impl"] == "loop-moe"]["status"].tolist() == ["ok"] and len(fake_timing) == 1


def test_zipf_routing_follows_the_law():
    gen = torch.Generator().manual_seed(3)
    logits = moe.routing_logits(40000, 8, "zipf", 1.2, gen, "cpu")
    top1 = torch.bincount(logits.argmax(-1), minlength=8).double() / 40000
    ranked = top1.sort(descending=True).values
    law = torch.arange(1, 9, dtype=torch.float64) ** -1.2
    assert torch.allclose(ranked, law / law.sum(), atol=0.01)
    uniform = torch.bincount(moe.routing_logits(40000, 8, "uniform", 1.2, gen, "cpu").argmax(-1), minlength=8)
    assert (uniform.double() / 40000 - 1 / 8).abs().max() < 0.01


# ---------------------------------------------------------------------------------------------------
# Synthetic table: figures and the audit
# ---------------------------------------------------------------------------------------------------

PROV = dict(gpu_name="NVIDIA H200", gpu="h200", driver="1", cuda="13", torch="2", triton="3", python="3",
            git_sha="abc", timestamp="t", kernel_config="")  # fmt: skip


COPY_GBPS = {128: 4000.0, 64: 2000.0}  # per group size: the copy rows must be told apart


def _quant_rows(w4_ms=0.03, dequant_ms=0.4, linear_ms=0.10, group_sizes=(128,)):
    rows = []
    for model, (k, n) in {"llama3-8b-up": (4096, 14336), "llama3-70b-up": (8192, 28672)}.items():
        for g in group_sizes:
            for m in (1, 16, 4096):
                for impl, ms, mb in (("torch-linear", linear_ms, n * k * 2.0), ("ours-w4a16", w4_ms, n * k * 0.539),
                                     ("dequant-linear", dequant_ms, n * k * 4.5)):  # fmt: skip
                    t = ms * (1 + m / 64)
                    rows.append(dict(experiment="w4a16", family="quant", op="linear", impl=impl, dtype="bfloat16",
                                     model=model, m=m, n=n, k=k, group_size=g, stage="total", status="ok", message="",
                                     timed=True, ms_median=t, model_bytes=mb, gbps=mb / t / 1e6, **PROV))  # fmt: skip
            rows.append(dict(experiment="w4a16", family="quant", op="linear", impl="copy-weight", dtype="bfloat16",
                             model=model, n=n, k=k, group_size=g, stage="total", status="ok", message="", timed=True,
                             ms_median=0.01, gbps=COPY_GBPS[g], **PROV))  # fmt: skip
    return rows


def _moe_rows(gemm_ms=0.3, gather_ms=5.0):
    rows = []
    for t in (256, 4096):
        base = dict(experiment="moe", family="moe", dtype="bfloat16", model="deepseek", m=6 * t, n=1408, k=2048,
                    experts=64, top_k=6, tokens=t, routing="uniform", status="ok", message="", timed=True,
                    **PROV)  # fmt: skip
        for stage, ms in dict(routing=0.02, dispatch=0.05, gemm=gemm_ms, combine=0.03).items():
            rows.append(dict(base, op="moe-layer", impl="ours-moe", stage=stage, ms_median=ms))
        for impl, ms in {"ours-moe": 0.4, "loop-moe": 3.0, "gather-moe": gather_ms, "dense-ffn": 0.2}.items():
            if impl == "gather-moe" and t == 4096:
                rows.append(dict(base, op="moe-layer", impl=impl, stage="total", status="unsupported", message="cap"))
                continue
            rows.append(dict(base, op="moe-layer", impl=impl, stage="total", ms_median=ms, tflops=10.0))
        for impl, tf in {"ours-grouped": 300, "torch-grouped-mm": 280, "loop-grouped": 50}.items():
            rows.append(dict(base, op="grouped-gemm", impl=impl, stage="total", ms_median=0.1, tflops=tf))
    return rows


def _table(rows, tmp_path) -> pd.DataFrame:
    path = tmp_path / "ops.csv"
    ops_tables.write_rows(rows, path)
    return ops_tables.read_rows([path])


def test_figures_from_a_synthetic_table(tmp_path):
    df = _table(_quant_rows() + _moe_rows(), tmp_path)
    entries = ops_figures.render_all(df, tmp_path / "fig", table_source="ops.csv")
    assert [e["name"] for e in entries] == list(ops_figures.FIGURES)
    assert all(e["reason"] is None and Path(e["png"]).stat().st_size > 10_000 for e in entries)
    speed = pd.read_csv(tmp_path / "fig" / "w4a16_speedup.csv")
    w4 = speed[(speed["impl"] == "ours-w4a16")]
    assert w4["speedup"].round(6).eq(round(0.10 / 0.03, 6)).all()
    bw = pd.read_csv(tmp_path / "fig" / "w4a16_bandwidth.csv")
    assert (bw["copy_gbps"] == 4000.0).all()
    split = pd.read_csv(tmp_path / "fig" / "moe_time_split.csv")
    shares = split[["routing_share", "dispatch_share", "gemm_share", "combine_share"]].sum(axis=1)
    assert shares.round(9).eq(1).all()
    assert {e["section"] for e in entries} == {"quant", "moe"}


def test_copy_bandwidth_is_matched_by_group_size(tmp_path):
    """Two group sizes per layer (as config-full runs): each kernel row is compared with the copy row of its
    own layer, dtype and group size, in the figure and in the audit."""
    df = _table(_quant_rows(group_sizes=(64, 128)), tmp_path)
    ops_figures.render_all(df, tmp_path / "fig", table_source="ops.csv")
    bw = pd.read_csv(tmp_path / "fig" / "w4a16_bandwidth.csv")
    assert (bw["copy_gbps"] == bw["group_size"].map(COPY_GBPS)).all() and set(bw["group_size"]) == {64, 128}
    ctx = audit.Context()
    ctx.ops["h200"], ctx.ops_paths["h200"] = df, "ops.csv"
    note = audit.audit([c for c in audit.load_registry() if c.id == "w4-bandwidth"], ctx).iloc[0]["note"]
    w4 = df[(df["impl"] == "ours-w4a16") & (df["m"] == 1)]
    share = 100 * w4["gbps"] / w4["group_size"].map(COPY_GBPS)
    assert f"{share.min():.0f}–{share.max():.0f}% of the copy bandwidth" in note


def test_moe_time_split_leaves_out_points_missing_a_stage(tmp_path):
    """A point whose combine stage did not finish is left out of the split (figure and audit alike) instead
    of having its other stages' shares inflated by a 0 for the missing one."""
    rows = [r for r in _moe_rows() if not (r["tokens"] == 4096 and r["stage"] == "combine")]
    df = _table(rows + _quant_rows(), tmp_path)
    ops_figures.render_all(df, tmp_path / "fig", table_source="ops.csv")
    split = pd.read_csv(tmp_path / "fig" / "moe_time_split.csv")
    assert split["tokens"].tolist() == [256]
    assert split["gemm_share"].iloc[0] == pytest.approx(0.3 / (0.02 + 0.05 + 0.3 + 0.03))
    verdict = _verdict("moe-dense-inside", rows, tmp_path)
    assert "T=256" in verdict["note"] and "T=4096" not in verdict["note"]


def test_figures_without_rows_are_skipped(tmp_path):
    entries = ops_figures.render_all(_table(_quant_rows(), tmp_path), tmp_path / "fig")
    reasons = {e["name"]: e["reason"] for e in entries}
    assert reasons["w4a16_speedup"] is None and "MoE" in reasons["moe_time_split"]


def _verdict(claim_id: str, rows, tmp_path) -> pd.Series:
    claims = [c for c in audit.load_registry() if c.id == claim_id]
    ctx = audit.Context()
    if rows is not None:
        ctx.ops["h200"] = _table(rows, tmp_path)
        ctx.ops_paths["h200"] = "ops.csv"
    return audit.audit(claims, ctx).iloc[0]


@pytest.mark.parametrize(
    "claim, rows, expected",
    [
        pytest.param("w4-bandwidth", _quant_rows(w4_ms=0.026), "holds", id="w4-bandwidth-holds"),
        pytest.param("w4-bandwidth", _quant_rows(w4_ms=0.05), "partly", id="w4-bandwidth-partly"),
        pytest.param("w4-bandwidth", _quant_rows(w4_ms=0.2), "fails", id="w4-bandwidth-fails"),
        pytest.param("w4-fusion", _quant_rows(), "holds", id="w4-fusion-holds"),
        pytest.param("w4-fusion", _quant_rows(dequant_ms=0.05), "fails", id="w4-fusion-fails"),
        pytest.param("w4-fusion", _quant_rows(w4_ms=0.2), "partly", id="w4-fusion-partly"),
        pytest.param("moe-dense-inside", _moe_rows(gemm_ms=0.05), "holds", id="dense-inside-holds"),
        pytest.param("moe-dense-inside", _moe_rows(gemm_ms=0.5), "fails", id="dense-inside-fails"),
        pytest.param("moe-grouped", _moe_rows(), "holds", id="grouped-holds"),
        pytest.param("moe-grouped", _moe_rows(gather_ms=0.8), "partly", id="grouped-partly"),
        pytest.param("moe-grouped", _moe_rows(gather_ms=0.3), "fails", id="grouped-fails"),
        pytest.param("moe-grouped", _quant_rows(), "untestable", id="grouped-no-moe-rows"),
        pytest.param("w4-fusion", None, "untestable", id="no-ops-table"),
    ],
)
def test_ops_evaluators(claim, rows, expected, tmp_path):
    v = _verdict(claim, rows, tmp_path)
    assert v["verdict"] == expected, v["note"]
    if expected == "untestable":
        assert v["note"]
    else:
        assert v["gpu"] == "h200" and v["evidence"].startswith("ops.csv")


def test_w4_bandwidth_observed_numbers(tmp_path):
    v = _verdict("w4-bandwidth", _quant_rows(w4_ms=0.026), tmp_path)
    assert v["observed"].startswith(f"{2 / 0.539:.2f}× fewer weight bytes")
    assert f"M=1 {0.10 / 0.026:.2f}× faster" in v["observed"]


def test_moe_dense_inside_share(tmp_path):
    v = _verdict("moe-dense-inside", _moe_rows(gemm_ms=0.08), tmp_path)
    assert v["verdict"] == "holds"  # (0.02 + 0.05 + 0.03) / 0.18 = 56% of the time
    assert v["observed"] == "routing + dispatch + combine 56% of the layer's time"
    assert "deepseek T=256 uniform: 56%" in v["note"]
    assert _verdict("moe-dense-inside", _moe_rows(gemm_ms=0.1), tmp_path)["verdict"] == "fails"  # exactly half
