"""The W4A16 family: its plan and config section, its run in Triton's interpreter (float16, tiny odd shapes),
its figures and its evaluators, on synthetic operator tables (``ops_helpers``).

The GPU-only parts of the harness (CUDA-event timing, CUDA peak memory) are replaced by a fake that still
calls the timed callable once (``fake_harness``, the ``fake_timing`` fixture).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml
from fake_harness import MS
from figure_helpers import render
from ops_helpers import COPY_GBPS, OPS, quant_rows, table, verdict

from analysis import budget, configuration, registry
from analysis.core import models
from analysis.families.w4a16 import plan as w4plan
from analysis.families.w4a16 import run as w4run

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "workflow" / "config.yaml"
FULL = ROOT / "workflow" / "config-full.yaml"
DEFAULT = configuration.load_config([CONFIG])


def test_default_shards_and_budget():
    shards = w4plan.shards(DEFAULT)
    assert set(shards) == {
        "w4a16_llama3-8b-up_bfloat16_g128",
        "w4a16_llama3-70b-up_bfloat16_g128",
        "w4a16_llama3-8b-down_bfloat16_g128",
    }
    up = shards["w4a16_llama3-70b-up_bfloat16_g128"]
    assert (up["n"], up["k"]) == (28672, 8192)  # 8192 → 28672: the weight is [out, in]
    assert budget.budget(registry.family("w4a16"), DEFAULT)["w4a16"]["seconds"] <= 70  # the default grid stays small


def test_full_config_has_every_shape():
    shards = w4plan.shards(configuration.load_config([CONFIG, FULL]))
    assert {f["model"] for f in shards.values()} == set(w4plan.SHAPES)
    assert shards["w4a16_llama3-8b-kv_bfloat16_g64"]["ms"] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096]


@pytest.mark.parametrize(
    "fields, match",
    [
        pytest.param({"impls": ["marlin"]}, "unknown w4a16 implementations", id="impl"),
        pytest.param({"group_size": 48}, "group_size must be", id="group"),
        pytest.param({"k": 100}, "multiple of group_size", id="k"),
    ],
)
def test_spec_validation(fields, match):
    base = dict(model="t", n=40, k=96, dtype="float16", group_size=32, ms=[1], impls=["ours-w4a16"])
    with pytest.raises(ValueError, match=match):
        w4plan.W4A16Spec(**{**base, **fields})


def test_disabled_section_makes_no_shards():
    off = copy.deepcopy(DEFAULT)
    off["w4a16"]["enabled"] = False
    assert registry.family("w4a16").shards(off) == {}


def test_schema_names_the_catalogue():
    section = registry.family("w4a16").config_schema()
    schema = configuration.schema()
    assert schema["$defs"]["w4a16_model"]["enum"] == list(w4plan.SHAPES)
    assert section["properties"]["impls"]["items"]["enum"] == list(w4plan.IMPLS)


@pytest.mark.parametrize("bad", [{"models": ["llama3-8b-mlp"]}, {"group_sizes": [48]}], ids=["model", "group"])
def test_schema_rejects_bad_values(tmp_path, bad):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"w4a16": bad}))
    with pytest.raises(configuration.ConfigError):
        configuration.load_config([CONFIG, path])


def _quant_spec(**kw) -> w4plan.W4A16Spec:
    fields = dict(
        model="tiny", n=40, k=96, dtype="float16", group_size=32, ms=[1, 3, 33], impls=list(w4plan.IMPLS), check_rows=8
    )
    return w4plan.W4A16Spec(**{**fields, **kw})


def test_quant_rows_untimed(env):
    spec = _quant_spec()
    rows = w4run.run(spec, env, device="cpu", log_line=lambda s: None, timed=False)
    df = OPS.frame(rows)
    assert len(df) == spec.points() == 3 * 5 + 1
    ok = df[df["status"] == "ok"]
    assert set(ok["impl"]) == set(w4plan.IMPLS) - {"torch-int4pack"}
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
    spec = _quant_spec(
        ms=[5], impls=["ours-w4a16", "torch-linear", "copy-weight"], warmup_ms=3, rep_ms=7, spread_rounds=2
    )
    df = OPS.frame(w4run.run(spec, env, device="cpu", log_line=lambda s: None))
    assert (df["status"] == "ok").all() and df["timed"].all()
    w4 = df[df["impl"] == "ours-w4a16"].iloc[0]
    assert w4["tflops"] == pytest.approx(2 * 5 * 40 * 96 / (MS * 1e-3) / 1e12)
    assert w4["gbps"] == pytest.approx(w4["model_bytes"] / (MS * 1e-3) / 1e9)
    assert w4["peak_mem_mib"] == 1.5 and set(fake_timing) == {(3, 7)}
    # repeat rounds: the M point's two implementations interleaved, then copy-weight's on their own
    assert [(w, r) for _, w, r in fake_timing.rounds] == [(0.75, 1.75)] * 6
    assert df["spread_rounds"].eq(2).all() and (df["ms_round_min"] <= df["ms_round_max"]).all()


def test_quant_wrong_kernel_is_a_mismatch_never_timed(env, fake_timing, monkeypatch):
    from kernels import w4a16

    real = w4a16.matmul
    monkeypatch.setattr(w4a16, "matmul", lambda x, pw, bias=None, config=None: real(x, pw) * 1.01)
    spec = _quant_spec(ms=[2], impls=["ours-w4a16", "dequant-linear"])
    df = OPS.frame(w4run.run(spec, env, device="cpu", log_line=lambda s: None))
    bad = df[df["impl"] == "ours-w4a16"].iloc[0]
    assert bad["status"] == "mismatch" and "max-abs error" in bad["message"]
    assert math.isnan(bad["ms_median"]) and len(fake_timing) == 1  # only dequant-linear was timed


def test_copy_bandwidth_is_matched_by_group_size(tmp_path):
    """Two group sizes per layer (as config-full runs): each kernel row is compared with the copy row of its
    own layer, dtype and group size, in the figure and in the audit."""
    _rows = quant_rows(group_sizes=(64, 128))
    df = table(_rows, tmp_path)
    render("w4a16", df, tmp_path / "fig")
    bw = pd.read_csv(tmp_path / "fig" / "w4a16_bandwidth.csv")
    assert (bw["copy_gbps"] == bw["group_size"].map(COPY_GBPS)).all() and set(bw["group_size"]) == {64, 128}
    note = verdict("w4-bandwidth", _rows, tmp_path)["note"]
    w4 = df[(df["impl"] == "ours-w4a16") & (df["m"] == 1)]
    share = 100 * w4["gbps"] / w4["group_size"].map(COPY_GBPS)
    assert f"{share.min():.0f}–{share.max():.0f}% of the copy bandwidth" in note


def test_w4_bandwidth_observed_numbers(tmp_path):
    v = verdict("w4-bandwidth", quant_rows(w4_ms=0.026), tmp_path)
    assert v["observed"].startswith(f"{2 / 0.539:.2f}× fewer weight bytes")
    assert f"M=1 {0.10 / 0.026:.2f}× faster" in v["observed"]


def test_figures_from_a_synthetic_table(tmp_path):
    entries = render("w4a16", table(quant_rows(), tmp_path), tmp_path / "fig")
    assert [e["name"] for e in entries] == ["w4a16_speedup", "w4a16_bandwidth"]
    assert all(e["reason"] is None and Path(e["png"]).stat().st_size > 10_000 for e in entries)
    speed = pd.read_csv(tmp_path / "fig" / "w4a16_speedup.csv")
    w4 = speed[(speed["impl"] == "ours-w4a16")]
    assert w4["speedup"].round(6).eq(round(0.10 / 0.03, 6)).all()
    bw = pd.read_csv(tmp_path / "fig" / "w4a16_bandwidth.csv")
    assert (bw["copy_gbps"] == 4000.0).all()
    assert {e["section"] for e in entries} == {"w4a16"}


def test_figures_without_rows_are_skipped(tmp_path):
    entries = render("w4a16", OPS.frame([]), tmp_path / "fig")
    assert all(e["png"] is None and e["reason"] for e in entries)


@pytest.mark.parametrize(
    "claim, rows, expected",
    [
        pytest.param("w4-bandwidth", quant_rows(w4_ms=0.026), "holds", id="w4-bandwidth-holds"),
        pytest.param("w4-bandwidth", quant_rows(w4_ms=0.05), "partly", id="w4-bandwidth-partly"),
        pytest.param("w4-bandwidth", quant_rows(w4_ms=0.2), "fails", id="w4-bandwidth-fails"),
        pytest.param("w4-fusion", quant_rows(), "holds", id="w4-fusion-holds"),
        pytest.param("w4-fusion", quant_rows(dequant_ms=0.05), "fails", id="w4-fusion-fails"),
        pytest.param("w4-fusion", quant_rows(w4_ms=0.2), "partly", id="w4-fusion-partly"),
        pytest.param("w4-fusion", None, "untestable", id="no-ops-table"),
    ],
)
def test_evaluators(claim, rows, expected, tmp_path):
    v = verdict(claim, rows, tmp_path)
    assert v["verdict"] == expected, v["note"]
    if expected == "untestable":
        assert v["note"]
    else:
        assert v["gpu"] == "h200" and v["evidence"].startswith("ops.csv")
