"""The figures of the attention experiments, drawn from small synthetic tables with failed rows among them."""

from __future__ import annotations

import matplotlib
import pandas as pd
import pytest
from figure_helpers import ATTENTION, attention_row, is_png, render

from analysis import registry, report
from analysis.core.plotting import NoDataError, NotMeasured
from analysis.families._shared import attention_plots as plots
from analysis.families.attention import experiment_figures, fa2_figures

matplotlib.use("Agg")

CONFIGS = [
    "BLOCK_M=64,BLOCK_N=32,num_warps=4,num_stages=2",
    "BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=2",
    "BLOCK_M=128,BLOCK_N=128,num_warps=8,num_stages=2",
]
NEW = [
    "attention_tflops_bwd",
    "attention_tflops_fwd_bwd",
    "attention_memory_fwd_bwd",
    "fa1_figure3",
    "gain_surface",
    "block_sweep",
    "rescale_ablation",
    "decode_latency",
    "varlen_padding",
]


def make_rows() -> list[dict]:
    rows = []
    for mode in ("bwd", "fwd+bwd"):  # fa2-setting gradient modes, one failed point
        for n in (1024, 4096):
            for impl, rel in (("ours-fa2", 1.0), ("sdpa-flash", 1.2), ("naive", 3.0)):
                status = "oom" if (impl, n, mode) == ("naive", 4096, "bwd") else "ok"
                rows.append(
                    attention_row("fa2-setting", impl, n, b=16384 // n, mode=mode, ms=rel * n / 512, status=status)
                )
    for mode in ("fwd", "fwd+bwd"):  # fa1-setting: naive out of memory at the longest N
        for n in (256, 1024, 4096, 16384):
            for impl, rel, mem in (("ours-fa2", 1.0, 1.0), ("ours-fa1", 2.0, 1.0), ("naive", 4.0, n / 64)):
                status = "oom" if impl == "naive" and n == 16384 else "ok"
                rows.append(
                    attention_row(
                        "fa1-setting",
                        impl,
                        n,
                        d=64,
                        b=8,
                        h=12,
                        mode=mode,
                        ms=rel * n / 256,
                        status=status,
                        peak_mem_mib=mem * n / 128 if status == "ok" else float("nan"),
                    )
                )
    for d in (32, 128, 256):  # gain surface, one point failed
        for n in (512, 4096):
            rows.append(attention_row("gain-surface", "ours-fa2", n, d=d, b=16384 // n, ms=n / 512))
            status = "error" if (d, n) == (256, 4096) else "ok"
            rows.append(
                attention_row("gain-surface", "naive", n, d=d, b=16384 // n, ms=(n / 512) * 4 * 32 / d, status=status)
            )
    for n in (4096, 16384):  # block sweep, the largest tile failed at N=16384
        for i, cfg in enumerate(CONFIGS):
            status = "error" if (i, n) == (2, 16384) else "ok"
            rows.append(
                attention_row(
                    "block-sweep",
                    "ours-fa2",
                    n,
                    b=16384 // n,
                    ms=(1 + 0.2 * i) * n / 4096,
                    status=status,
                    kernel_config=cfg,
                )
            )
    for dtype in ("float16", "bfloat16"):  # rescale ablation
        for n in (1024, 4096, 16384):
            rows.append(attention_row("rescale-ablation", "ours-fa2", n, b=16384 // n, ms=n / 1024, dtype=dtype))
            rows.append(
                attention_row("rescale-ablation", "ours-fa2-eager", n, b=16384 // n, ms=1.1 * n / 1024, dtype=dtype)
            )
    for mode in ("fwd", "fwd+bwd"):  # memory
        for n in (4096, 16384, 32768):
            for impl, mib in (("ours-fa2", n / 100), ("sdpa-flash", n / 90), ("naive", n * n / 2**14)):
                status = "oom" if impl == "naive" and n == 32768 else "ok"
                rows.append(
                    attention_row(
                        "memory",
                        impl,
                        n,
                        mode=mode,
                        ms=n / 1024,
                        status=status,
                        peak_mem_mib=mib if status == "ok" else float("nan"),
                    )
                )
    for hk in (16, 2):  # decode; sdpa-cudnn refuses grouped-query heads
        for nk in (1024, 16384, 131072):
            kv = 2 * hk * nk * 128 * 2
            bandwidths = (("ours-decode", 3.0e12), ("ours-fa2", 0.4e12), ("sdpa-cudnn", 2.0e12), ("copy-kv", 4.0e12))
            for impl, bw in bandwidths:
                status = "unsupported" if impl == "sdpa-cudnn" and hk == 2 else "ok"
                model = 2 * kv if impl == "copy-kv" else kv + 2 * 16 * 128 * 2
                ms = model / bw * 1e3
                rows.append(
                    attention_row(
                        "decode",
                        impl,
                        1,
                        nk=nk,
                        hk=hk,
                        ms=ms,
                        status=status,
                        model_bytes=model,
                        gbps=model / (ms * 1e-3) / 1e9 if status == "ok" else float("nan"),
                        kernel_config="num_splits=16" if impl == "ours-decode" else "",
                    )
                )
    for mode in ("fwd", "fwd+bwd"):  # varlen, one batch; the padded SDPA run failed in fwd+bwd
        for impl, ms in (("ours-varlen", 1.0), ("ours-fa2-padded", 4.0), ("sdpa-efficient-padded", 9.0)):
            status = "error" if impl == "sdpa-efficient-padded" and mode == "fwd+bwd" else "ok"
            rows.append(
                attention_row(
                    "varlen",
                    impl,
                    3772,
                    b=16,
                    mode=mode,
                    causal=True,
                    ms=ms,
                    status=status,
                    tokens=17741,
                    pad_waste=0.85,
                )
            )
    return rows


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return ATTENTION.frame(make_rows())


@pytest.mark.parametrize("name", NEW)
def test_each_new_figure_renders_and_lists_its_failed_points(name, table, tmp_path):
    func = registry.family("attention").figures()[name].draw
    got = func(table, tmp_path / f"{name}.png")
    assert is_png(tmp_path / f"{name}.png")
    assert len(got) > 0
    assert "status" in got.columns or name.startswith("attention_tflops")


def test_gradient_mode_throughput_figures_keep_their_mode(table, tmp_path):
    bwd = fa2_figures.attention_tflops_bwd(table, tmp_path / "b.png")
    assert set(bwd["mode"]) == {"bwd"} and len(bwd) == 5  # six points, naive out of memory at one
    both = fa2_figures.attention_tflops_fwd_bwd(table, tmp_path / "f.png")
    assert set(both["mode"]) == {"fwd+bwd"} and len(both) == 6
    with pytest.raises(NotMeasured, match="this run measured no fwd rows"):
        fa2_figures.attention_tflops(table, tmp_path / "fwd.png")  # this table has no forward rows
    failed = table.assign(status="error", message="error: synthetic")  # rows that failed: not drawn, but measured
    with pytest.raises(NoDataError, match="no ok timed bwd rows") as info:
        fa2_figures.attention_tflops_bwd(failed, tmp_path / "b2.png")
    assert not isinstance(info.value, NotMeasured)


def test_fa1_figure3_ratios_and_naive_oom(table, tmp_path):
    got = experiment_figures.fa1_figure3(table, tmp_path / "f.png")
    ok = got[got["status"] == "ok"]
    fa1 = ok[(ok["impl"] == "ours-fa1") & (ok["mode"] == "fwd")].sort_values("seqlen_q")
    assert fa1["speedup"].tolist() == pytest.approx([2.0] * 3)
    assert fa1["memory_saving"].tolist() == pytest.approx([n / 64 for n in (256, 1024, 4096)])
    assert 16384 not in set(ok["seqlen_q"])  # no ratio where naive ran out of memory
    oom = got[got["status"] == "oom"]
    assert set(oom["impl"]) == {"naive"} and set(oom["seqlen_q"]) == {16384}


def test_gain_surface_values(table, tmp_path):
    got = experiment_figures.gain_surface(table, tmp_path / "g.png")
    ok = got[got["status"] == "ok"].set_index(["head_dim", "seqlen_q"])["speedup"]
    assert ok[(32, 512)] == pytest.approx(4.0) and ok[(256, 512)] == pytest.approx(0.5)
    assert (256, 4096) not in ok.index
    assert got[got["status"] == "error"][["impl", "head_dim", "seqlen_q"]].values.tolist() == [["naive", 256, 4096]]


def test_block_sweep_keeps_configs_and_failures(table, tmp_path):
    got = experiment_figures.block_sweep(table, tmp_path / "b.png")
    assert set(got[got["status"] == "ok"]["kernel_config"]) == set(CONFIGS)
    assert got[got["status"] == "error"]["kernel_config"].tolist() == [CONFIGS[2]]
    assert set(got["config"].dropna()) == {"64×32 w4 s2", "128×64 w8 s2", "128×128 w8 s2"}


def test_rescale_ratio(table, tmp_path):
    got = experiment_figures.rescale_ablation(table, tmp_path / "r.png")
    assert len(got) == 6 and got["ratio"].to_numpy() == pytest.approx(1.1)


def test_decode_has_copy_bandwidth_and_refusals(table, tmp_path):
    got = experiment_figures.decode_latency(table, tmp_path / "d.png")
    copy = got[got["impl"] == "copy-kv"]
    assert copy["gbps"].to_numpy() == pytest.approx(4000.0)
    refused = got[got["status"] == "unsupported"]
    assert set(refused["impl"]) == {"sdpa-cudnn"} and set(refused["heads_kv"]) == {2}


def test_varlen_bars_and_waste(table, tmp_path):
    got = experiment_figures.varlen_padding(table, tmp_path / "v.png")
    assert (got["pad_waste"] == 0.85).all()
    assert got[got["status"] == "error"]["impl"].tolist() == ["sdpa-efficient-padded"]


def test_missing_note_names_the_failed_points(table):
    d = plots.prepare(table, "decode")
    note = plots.missing_note(plots.failed(d))
    assert note.startswith("Not drawn, 3 point(s) that did not finish: sdpa-cudnn Nk=1k d=128 (unsupported)")
    assert plots.missing_note(d.iloc[:0]) == ""


def test_only_failed_rows_skip_every_new_figure(table, tmp_path):
    failed_only = table.assign(status="error")
    entries = render("attention", failed_only, tmp_path / "figs")
    assert all(e["png"] is None and e["reason"] for e in entries)


def test_render_all_sections_and_report_groups_figures(table, tmp_path):
    entries = render("attention", table, tmp_path / "figs")
    by_name = {e["name"]: e for e in entries}
    assert set(NEW) <= {n for n, e in by_name.items() if e["png"]}
    assert by_name["attention_tflops"]["png"] is None  # no forward rows of fa2-setting in this table
    assert by_name["gain_surface"]["section"] == "gain-surface" and by_name["decode_latency"]["section"] == "decode"
    assert all(e["section"] in dict(registry.family("attention").sections) for e in entries)
    out = tmp_path / "report.html"
    report.render_report(
        out,
        [{"slug": "h200", "source": "test", "provenance": {}, "figures": entries, "tables": {"attention": table}}],
        None,
    )
    html = out.read_text(encoding="utf-8")
    positions = [html.index(f'id="sec-h200-{s}"') for s in ("fa2-setting", "fa1-setting", "gain-surface", "decode")]
    assert positions == sorted(positions)
    for name in NEW:
        assert f'id="fig-h200-{name}"' in html and f"{name}.csv" in html
    assert html.index('id="sec-h200-decode"') < html.index('id="fig-h200-decode_latency"')
    assert "Not drawn" not in html  # notes are inside the images, the report lists failures in its table
