"""The FA-2 setting's figures and the HTML report, on a synthetic table whose expected values are known by
construction."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib
import pandas as pd
import pytest
from figure_helpers import ATTENTION, is_png, render

from analysis import registry
from analysis.families.attention import fa2_figures as figures
from analysis.families.attention import figures as attention_figures
from analysis.families.attention import report as attention_report
from analysis.report import render as report

matplotlib.use("Agg")
COLUMNS = ATTENTION.columns
FAMILY = registry.family("attention")

NS = [512, 1024, 2048, 4096]
MEM_NS = [1024, 2048, 4096, 8192]
# Times relative to ours: the speed-ups over naive and ours' ratio to sdpa-flash follow from these.
REL_MS = {"ours-fa2": 1.0, "sdpa-flash": 1.37, "sdpa-math": 2.5, "naive": 4.0}
OURS_OVER_FLASH = 1.37
ERROR_MESSAGE = "cuDNN backend refused <shape> & dtype"
PEER_MESSAGE = "FlashAttention's own kernels (flash-attn-4, CuTe DSL) is not installed here (pip install '.[peers]')"


def _row(**kw) -> dict:
    row = dict.fromkeys(COLUMNS, float("nan"))
    row.update(
        family="attention",
        op="attention",
        mode="fwd",
        inputs="normal",
        heads_kv=None,
        message="",
        timed=True,
        gpu="h200",
        gpu_name="NVIDIA H200",
        driver="550.0",
        cuda="12.4",
        torch="2.4.0",
        triton="3.0.0",
        python="3.12.3",
        git_sha="abc1234",
        timestamp="2025-01-01T00:00:00",
        kernel_config="",
    )
    row.update(kw)
    row["heads_kv"] = row["heads"]
    return row


def _timed(experiment, impl, dtype, batch, heads, n, d, causal, ms, **kw) -> dict:
    flops = 4 * batch * heads * n * n * d * (0.5 if causal else 1.0)
    return _row(
        experiment=experiment,
        impl=impl,
        dtype=dtype,
        batch=batch,
        heads=heads,
        seqlen_q=n,
        seqlen_k=n,
        head_dim=d,
        causal=causal,
        status="ok",
        ms_median=ms,
        ms_p20=0.95 * ms,
        ms_p80=1.1 * ms,
        tflops=flops / (ms * 1e-3) / 1e12,
        **kw,
    )


def make_rows() -> list[dict]:
    rows = []
    for dtype in ("float16", "bfloat16"):
        for d in (64, 128):
            for causal in (False, True):
                for n in NS:
                    base = 0.4 * (n / 512) * (d / 64)
                    for impl, rel in REL_MS.items():
                        rows.append(_timed("fa2-setting", impl, dtype, 16384 // n, 2048 // d, n, d, causal, base * rel))
    rows.append(
        _row(
            experiment="fa2-setting",
            impl="sdpa-cudnn",
            dtype="float16",
            batch=4,
            heads=16,
            seqlen_q=4096,
            seqlen_k=4096,
            head_dim=128,
            causal=True,
            status="error",
            message=ERROR_MESSAGE,
        )
    )
    rows.append(  # an official kernel beside ours that is not installed: its row says so
        _row(
            experiment="fa2-setting",
            impl="upstream-fa",
            dtype="float16",
            batch=4,
            heads=16,
            seqlen_q=4096,
            seqlen_k=4096,
            head_dim=128,
            causal=True,
            status="absent",
            message=PEER_MESSAGE,
        )
    )
    for n in MEM_NS:
        for impl, mib in (("ours-fa2", n / 256), ("sdpa-flash", n / 200), ("naive", n * n / 2**16)):
            if impl == "naive" and n == MEM_NS[-1]:
                rows.append(
                    _row(
                        experiment="memory",
                        impl=impl,
                        dtype="float16",
                        batch=1,
                        heads=16,
                        seqlen_q=n,
                        seqlen_k=n,
                        head_dim=128,
                        causal=False,
                        status="oom",
                        message="CUDA out of memory. Tried to allocate 4.00 GiB",
                    )
                )
            else:
                rows.append(_timed("memory", impl, "float16", 1, 16, n, 128, False, 0.1 * n / 1024, peak_mem_mib=mib))
    rows.append(
        _row(
            experiment="interpreter-check",
            impl="ours-fa2",
            dtype="float32",
            batch=1,
            heads=2,
            seqlen_q=64,
            seqlen_k=64,
            head_dim=16,
            causal=True,
            status="ok",
            timed=False,
            max_abs_err=3.1e-6,
            rms_err=1e-6,
            ref_err=2e-6,
            err_bound=4.2e-5,
        )
    )
    return rows


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return ATTENTION.frame(make_rows())


@pytest.fixture(scope="module")
def rendered(table, tmp_path_factory):
    out = tmp_path_factory.mktemp("figures")
    return out, render("attention", table, out)


def test_tflops_plots_ok_timed_rows_with_percentile_band(table, tmp_path):
    out = tmp_path / "t.png"
    got = figures.attention_tflops(table, out)
    assert is_png(out)
    assert len(got) == 2 * 2 * 2 * len(NS) * len(REL_MS)  # the error row is not plotted
    assert set(got["impl"]) == set(REL_MS)
    assert set(got["panel"]) == {"d=64, non-causal", "d=64, causal", "d=128, non-causal", "d=128, causal"}
    # slower percentile time -> lower throughput
    assert (got["tflops_lo"] < got["tflops"]).all() and (got["tflops"] < got["tflops_hi"]).all()


def test_speedup_is_naive_time_over_impl_time(table, tmp_path):
    out = tmp_path / "s.png"
    got = figures.attention_speedup(table, out)
    assert is_png(out)
    assert "naive" not in set(got["impl"])
    assert len(got) == 2 * 2 * 2 * len(NS) * (len(REL_MS) - 1)
    expected = got["impl"].map(lambda i: REL_MS["naive"] / REL_MS[i])
    assert got["speedup"].to_numpy() == pytest.approx(expected.to_numpy())


def test_speedup_skips_points_naive_did_not_finish(table):
    t = table.copy()
    dropped = (t["impl"] == "naive") & (t["experiment"] == "fa2-setting") & (t["seqlen_q"] == NS[-1])
    t.loc[dropped, "status"] = "oom"
    got = figures.speedup_table(t)
    assert NS[-1] not in set(got["seqlen_q"])
    assert set(got["seqlen_q"]) == set(NS[:-1])


def test_memory_marks_oom_and_returns_it(table, tmp_path):
    out = tmp_path / "m.png"
    got = figures.attention_memory(table, out)
    assert is_png(out)
    oom = got[got["status"] == "oom"]
    assert oom[["impl", "seqlen_q"]].values.tolist() == [["naive", MEM_NS[-1]]]
    assert len(got[got["status"] == "ok"]) == 3 * len(MEM_NS) - 1
    assert set(got["status"]) == {"ok", "oom"}


def test_csv_round_trip_gives_back_the_booleans(table, tmp_path):
    """The reader types ``causal`` and ``timed`` as bools, so a figure drawn from the file is the one drawn
    from the rows before they were written."""
    csv = tmp_path / "rows.csv"
    ATTENTION.write_rows(make_rows(), csv)
    back = ATTENTION.read_rows([csv])
    assert back["causal"].dtype == bool and back["timed"].dtype == bool
    direct = figures.attention_tflops(table, tmp_path / "a.png")
    got = figures.attention_tflops(back, tmp_path / "b.png")
    assert len(got) == len(direct)
    assert got["causal"].sum() == direct["causal"].sum() > 0


# The figures this table (forward FA-2 setting and the forward memory experiment) can draw; the others
# (test_attention_figures.py) are skipped with their reason.
DRAWN = ["attention_tflops", "attention_speedup", "attention_memory"]


def test_render_all_writes_png_and_csv(rendered, table):
    out, entries = rendered
    assert [e["name"] for e in entries] == list(attention_figures.FIGURES)
    for e in entries:
        if e["name"] not in DRAWN:
            # figures of experiments the table has no row of are not measured; the others failed to draw
            assert e["png"] is None and e["reason"].startswith(("no ok", "this run measured no"))
            assert e["measured"] is (
                not e["reason"].startswith("this run measured no") and e["section"] in set(table["experiment"])
            )
            continue
        assert e["reason"] is None
        assert is_png(e["png"])
        assert len(pd.read_csv(e["csv"])) > 0
        assert Path(e["png"]).parent == out


def test_render_all_skips_missing_experiment(table, tmp_path):
    entries = render("attention", table[table["experiment"] != "memory"], tmp_path)
    by_name = {e["name"]: e for e in entries}
    assert by_name["attention_memory"]["png"] is None
    assert "memory" in by_name["attention_memory"]["reason"]
    assert by_name["attention_tflops"]["png"] is not None
    assert not (tmp_path / "attention_memory.png").exists()


def test_render_all_on_empty_table(tmp_path):
    entries = render("attention", ATTENTION.frame([]), tmp_path)
    assert all(e["png"] is None and e["reason"] for e in entries)


def test_throughput_summary_ratio(table):
    got = attention_report.throughput_summary(table)
    assert len(got) == 8
    assert (got["N"] == NS[-1]).all()
    assert got[attention_report.RATIO_COLUMN].to_numpy() == pytest.approx(OURS_OVER_FLASH)
    assert got[attention_report.CUDNN_RATIO_COLUMN].isna().all()  # no sdpa-cudnn row finished at the largest N
    assert attention_report.throughput_summary(table, "bwd").empty


@pytest.fixture(scope="module")
def html(table, rendered, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "report.html"
    _, entries = rendered
    gpu = {
        "slug": "h200",
        "source": "measured in this run",
        "provenance": {"gpu_name": "NVIDIA H200", "driver": "550.0", "sm_count": 132, "extra": {"a": 1}},
        "figures": entries,
        "tables": {"attention": table[table["experiment"] != "interpreter-check"]},
    }
    checks = table[table["experiment"] == "interpreter-check"]
    report.render_report(
        out,
        [gpu],
        checks,
        generated={"git_sha": "deadbeef", "timestamp": "2025-02-03T04:05:06Z"},
        extra_sections=[{"title": "Claims", "html": "<p id='claims-marker'>verdicts</p>"}],
    )
    return out.read_text(encoding="utf-8")


def test_report_embeds_images_and_no_external_resources(html):
    assert html.count("data:image/png;base64,") == len(DRAWN)
    assert not re.search(r"https?://", html)
    for target in re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)""", html):
        assert target.startswith(("data:", "#")), target


def test_report_shows_failures_escaped(html):
    assert "cuDNN backend refused &lt;shape&gt; &amp; dtype" in html
    assert ERROR_MESSAGE not in html
    assert "CUDA out of memory" in html


def test_report_content(html):
    assert f'<td class="num">{OURS_OVER_FLASH}</td>' in html
    assert "deadbeef" in html and "2025-02-03T04:05:06Z" in html
    # extra sections lead, before the GPU sections
    assert html.index("claims-marker") < html.index('id="gpu-h200"')
    for name in DRAWN:
        assert f"{name}.csv" in html
    assert "4.2e-05" in html  # the interpreter check's error bound
    assert "sm_count" in html and "132" in html
    for caption in ("attention_tflops.rst", "attention_speedup.rst", "attention_memory.rst"):
        first_words = " ".join((FAMILY.captions / caption).read_text().split()[:6])
        assert first_words in html


def test_the_first_screen_names_where_the_numbers_come_from(html, table):
    measured = int((table["experiment"] != "interpreter-check").sum())
    top = html[html.index('<div id="origin">') : html.index("</header>")]
    # a GPU type whose tables have no shipped set's manifest beside them was measured by this run
    assert (
        f"<b>NVIDIA H200</b></a> (h200): measured by this run: {measured} rows measured at commit abc1234 on "
        "2025-01-01.</li>" in top
    )
    assert 'data-shipped="false"' in top and "shipped result set" not in top
    assert "run by this run on this machine, in Triton&#39;s interpreter: 1 row checked at commit abc1234" in top


def test_the_report_says_which_official_kernels_ran(html):
    top = html[html.index('<div id="origin">') : html.index("</header>")]
    assert "Official kernels beside ours on NVIDIA H200: upstream-fa not installed (1 row absent).</li>" in top
    section = html[html.index('id="gpu-h200"') :]
    assert "Official kernels beside ours: upstream-fa not installed (1 row absent)." in section
    # its row is listed with the points that did not finish, with why, and counted under its status
    assert 'is not installed here (pip install <span class="nw">&#39;.[peers]&#39;)</span>' in section
    assert "<th>absent</th>" in section


def test_words_break_only_between_words():
    words = report.words
    # a word a browser could break inside (beside a hyphen, a slash, a brace) is kept whole
    assert words("4.001e-16, ours-fa2 TFLOP/s") == (
        '<span class="nw">4.001e-16,</span> <span class="nw">ours-fa2</span> <span class="nw">TFLOP/s</span>'
    )
    assert words("1.37 bfloat16 causal x_y=z,w (a) ≥") == "1.37 bfloat16 causal x_y=z,w (a) ≥"  # nothing to keep
    # a long word breaks after a path's slash, an identifier's underscore, a comma or equals sign before a letter
    assert words("reports/reference/h200/attention.csv") == (
        '<span class="nw">reports/</span><wbr><span class="nw">reference/</span><wbr><span class="nw">h200/</span>'
        "<wbr>attention.csv"
    )
    assert words("experiment=fa2-setting,fa1-setting") == (
        'experiment=<wbr><span class="nw">fa2-setting,</span><wbr><span class="nw">fa1-setting</span>'
    )
    assert words("standard_attention_total_bytes") == "standard_<wbr>attention_<wbr>total_<wbr>bytes"
    assert words("N=131,072,000,000,000,000,000") == "N=131,072,000,000,000,000,000"  # no break inside a number
    # escaped; Chinese left to break between its characters, the Latin words inside it kept whole
    assert words("<b> & 显存15%~20%的") == '&lt;b&gt; &amp; 显存<span class="nw">15%~20%</span>的'


def test_failures_and_status_include_the_ops_rows(table):
    """The W4A16/MoE rows that did not finish are listed beside the attention ones, with their own shape."""
    import math

    ops_table = registry.table("ops")

    def ops_row(**over):
        r = {c: math.nan for c in ops_table.columns}
        r.update(
            experiment="moe",
            family="moe",
            op="moe-layer",
            impl="gather-moe",
            dtype="bfloat16",
            model="qwen",
            tokens=4096,
            routing="zipf",
            stage="total",
            status="unsupported",
            message="above the <cap>",
            timed=True,
            gpu="h200",
        )
        r.update(over)
        return r

    ops = ops_table.frame(
        [
            ops_row(),
            ops_row(impl="ours-moe", status="ok", message=""),
            ops_row(
                experiment="w4a16",
                impl="ours-w4a16",
                model="llama3-8b-up",
                m=16,
                n=14336,
                k=4096,
                status="mismatch",
                message="off",
            ),
        ]
    )
    bad = report.failures([table, ops])
    tail = bad[bad["experiment"].isin(["moe", "w4a16"])]
    assert list(tail["shape"]) == ["qwen 4096 tokens, zipf routing, stage total", "llama3-8b-up M=16 N=14336 K=4096"]
    assert len(bad) == len(report.failures([table])) + 2
    both = pd.concat([table[["experiment", "impl", "status"]], ops[["experiment", "impl", "status"]]])
    counts = report.status_summary(both).set_index(["experiment", "impl"])
    assert counts.loc[("moe", "gather-moe"), "unsupported"] == 1 and counts.loc[("moe", "ours-moe"), "ok"] == 1
