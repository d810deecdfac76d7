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
    """Every implementation at every M, the candidate paths in their ranges (stream-K up to 64, tc from 64)."""
    spec = _quant_spec(ms=[1, 3, 64, 65])
    rows = w4run.run(spec, env, device="cpu", log_line=lambda s: None, timed=False)
    df = OPS.frame(rows)
    assert len(df) == spec.points() == 4 * 5 + 3 * 2 + 2 * 2 + 1
    for impl, ms in (("ours-w4a16-streamk", {1, 3, 64}), ("ours-w8a16-tc", {64, 65})):
        cand = df[df["impl"] == impl]
        assert set(cand["m"]) == ms and cand["kernel_config"].str.contains(f"path='{impl.split('-')[-1]}'").all()
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


def test_candidate_paths_are_measured_in_their_ranges():
    assert w4plan.measured_at("ours-w4a16", 1) and w4plan.measured_at("ours-w4a16", 4096)
    assert w4plan.measured_at("ours-w4a16-streamk", 64) and not w4plan.measured_at("ours-w4a16-streamk", 65)
    assert w4plan.measured_at("ours-w8a16-tc", 64) and not w4plan.measured_at("ours-w8a16-tc", 63)
    assert w4plan.CANDIDATES == {
        "ours-w4a16": ("ours-w4a16-tc", "ours-w4a16-streamk"),
        "ours-w8a16": ("ours-w8a16-tc", "ours-w8a16-streamk"),
    }
    full = _quant_spec(ms=[1, 16, 64, 256])
    assert full.impls_at(1) == [i for i in w4plan.IMPLS if "-tc" not in i and i != "copy-weight"]
    assert "ours-w4a16-tc" in full.impls_at(64) and "ours-w4a16-streamk" in full.impls_at(64)


def _target_rows(streamk_host_ms=0.05):
    """quant_rows (ours 0.03 ms, F.linear 0.10 ms, scaled by 1 + M/64) with host times, tinygemm 1.2× ours'
    time, and the candidate paths in their ranges: stream-K 0.8× ours' time, tc 0.5×."""
    rows = quant_rows()
    extra = []
    for r in rows:
        if r["impl"] != "ours-w4a16":
            continue
        r["host_ms"] = 0.02
        extra.append({**r, "impl": "torch-int4pack", "ms_median": 1.2 * r["ms_median"], "host_ms": None})
        for impl, factor, ok in (("ours-w4a16-streamk", 0.8, r["m"] <= 64), ("ours-w4a16-tc", 0.5, r["m"] >= 64)):
            if ok:
                t = factor * r["ms_median"]
                extra.append({**r, "impl": impl, "ms_median": t, "gbps": r["model_bytes"] / t / 1e6})
                extra[-1]["host_ms"] = streamk_host_ms if impl.endswith("streamk") else 0.02
    return rows + extra


def test_targets_judge_the_default_path(tmp_path):
    """The targets hold ours-w4a16 to tinygemm, the copy bandwidth of the 117 MB layer, bf16 F.linear and its
    GPU time (host ≤ GPU); W8A16's, with no int8 rows, are left out (untestable)."""
    from analysis import summary

    judged = summary.targets({"ops": table(_target_rows(), tmp_path)}, "h200").set_index("claim_id")["verdict"]
    assert judged["w4a16-m1-vs-tinygemm"] == "holds"
    assert judged["w4a16-copy-bandwidth"] == "holds"  # 4155 GB/s of 4000
    assert judged["w4a16-batched-vs-bf16"] == "holds" and judged["w4a16-prefill-vs-bf16"] == "holds"
    assert judged["w4a16-eager-host"] == "holds"  # 20 µs of host against 30 µs of GPU time at M = 1
    assert judged["w8a16-decode-vs-bf16"] == "untestable" == judged["w8a16-prefill-vs-bf16"]
    slow_host = [dict(r, host_ms=0.05) if r["impl"] == "ours-w4a16" else r for r in _target_rows()]
    judged = summary.targets({"ops": table(slow_host, tmp_path)}, "h200").set_index("claim_id")
    assert judged.loc["w4a16-eager-host", "verdict"] == "fails"
    assert judged.loc["w4a16-eager-host", "observed"].startswith("1.64× the GPU time (host 50 µs, GPU 30 µs)")


def test_candidate_lines_say_which_path_would_meet_which_target(tmp_path):
    """Each candidate is judged by the targets of the kernel it may replace, where it has rows: stream-K at
    M = 1 would beat tinygemm but not the host-time target; tc would meet the prefill target; no line has a
    target of its own (the README's table stays the default path's)."""
    from analysis import registry
    from analysis.families.w4a16 import summary as w4summary

    tables = {"ops": table(_target_rows(), tmp_path)}
    lines = w4summary.lines(tables, registry.targets()["w4a16"].by_id())
    found = {line.what: line for line in lines if line.what.startswith("candidate ")}
    assert all(not line.target and not line.met for line in found.values())

    def line(impl, start):
        (hit,) = [v for k, v in found.items() if k.startswith(f"candidate {impl}: {start}")]
        return hit.measured

    assert line("ours-w4a16-streamk", "fused W4A16 at M = 1 vs PyTorch's int4").endswith("would meet it: yes")
    assert line("ours-w4a16-streamk", "an eager call").endswith("would meet it: no")
    assert line("ours-w4a16-tc", "fused W4A16 vs bf16 F.linear at M ≥ 256").endswith("would meet it: yes")
    assert not [k for k in found if k.startswith("candidate ours-w4a16-tc: fused W4A16 at M = 1")]  # no M = 1 rows
    assert not [k for k in found if "w8a16" in k]


def test_figures_draw_the_candidates_as_variants(tmp_path):
    from analysis.families.w4a16.figures import QUANT_STYLES

    assert QUANT_STYLES["ours-w4a16-tc"]["color"] == QUANT_STYLES["ours-w4a16"]["color"]
    assert QUANT_STYLES["ours-w4a16-tc"]["linestyle"] != QUANT_STYLES["ours-w4a16-streamk"]["linestyle"]
    render("w4a16", table(_target_rows(), tmp_path), tmp_path / "fig")
    speed = pd.read_csv(tmp_path / "fig" / "w4a16_speedup.csv")
    assert {"ours-w4a16-tc", "ours-w4a16-streamk"} <= set(speed["impl"])
