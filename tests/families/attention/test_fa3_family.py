"""The FA-3 wiring of the attention grid: implementations, the ablation's shards, its figures and the
names the torch-free spec keeps in step with the kernel's schedules."""

from __future__ import annotations

import matplotlib
import pandas as pd
import pytest
from figure_helpers import ATTENTION
from figure_helpers import attention_row as _row

from analysis.core.plotting import NoDataError
from analysis.families._shared import fa3_ablation
from analysis.families.attention import fa3_figures, plan
from analysis.families.attention.plan import Spec

matplotlib.use("Agg")


def test_spec_names_follow_the_kernel():
    from kernels.attention import fa3

    assert set(fa3_ablation.FA3_ABLATIONS) | {"fa3"} == set(fa3.SCHEDULES)
    assert set(fa3_ablation.ABLATION_ORDER) == set(fa3_ablation.FA3_IMPLS) == set(fa3_ablation.ABLATED) | {"ours-fa3"}


def test_every_fa3_name_is_an_implementation():
    from analysis.families._shared.attention_measure import implementation

    for impl in fa3_ablation.FA3_IMPLS:
        assert callable(implementation(impl))
    with pytest.raises(ValueError, match="unknown implementation"):
        implementation("ours-fa3-no-such-switch")


def test_ablation_shards_from_the_config():
    att = {
        "warmup_ms": 25,
        "rep_ms": 100,
        "spread_rounds": 3,
        "check_rows": 128,
        "fa3_ablation": {
            "enabled": True,
            "tokens": 16384,
            "hidden": 2048,
            "dtype": "float16",
            "head_dims": [64, 128],
            "causal": [False],
            "seqlens": [8192],
            "impls": list(fa3_ablation.FA3_IMPLS) + ["ours-fa2"],
            "warmup_ms": None,
            "rep_ms": None,
        },
    }
    for key in (
        "fa2_setting",
        "fa1_setting",
        "gain_surface",
        "block_sweep",
        "rescale_ablation",
        "memory",
        "decode",
        "decode_serving",
        "fp8_speed",
        "fp8_accuracy",
        "varlen",
        "llama3_70b_heads",
    ):
        att[key] = {"enabled": False, "configs": None}
    shards = plan.shards({"attention": att, "traffic": {"block_sweep": {"configs": []}}})
    assert sorted(shards) == ["fa3-ablation_float16_d128_full", "fa3-ablation_float16_d64_full"]
    s = Spec(**shards["fa3-ablation_float16_d128_full"])
    assert s.shape(0) == (2, 16, 8192, 8192) and s.points() == len(fa3_ablation.FA3_IMPLS) + 1
    assert s.spread_rounds == 3  # the section's repeat rounds (the harness's step 6)
    with pytest.raises(ValueError, match="forward pass only"):
        Spec(**{**shards["fa3-ablation_float16_d128_full"], "mode": "bwd"})
    with pytest.raises(ValueError, match="do not belong"):
        Spec(**{**shards["fa3-ablation_float16_d128_full"], "impls": ["naive"]})


def _table() -> pd.DataFrame:
    rows = []
    for dtype in ("float16", "bfloat16"):
        for causal in (False, True):
            for n in (1024, 4096, 16384):
                for impl, tf in (
                    ("ours-fa1", 60),
                    ("ours-fa2", 450),
                    ("ours-fa3", 600),
                    ("sdpa-cudnn", 590),
                    ("sdpa-flash", 340),
                    ("naive", 120),
                ):
                    if impl == "ours-fa1" and dtype == "bfloat16":
                        continue
                    status = "unsupported" if (impl, n, causal) == ("ours-fa3", 1024, True) else "ok"
                    ms = 4 * (16384 // n) * 16 * n * n * 128 / (2 if causal else 1) / (tf * 1e12) * 1e3
                    rows.append(
                        _row("fa2-setting", impl, n, b=16384 // n, causal=causal, ms=ms, status=status, dtype=dtype)
                    )
    for d in (64, 128):
        impls = fa3_ablation.ABLATION_ORDER + ["ours-fa2", "sdpa-cudnn"]
        for impl, tf in zip(impls, (600, 590, 570, 480, 430, 450, 590), strict=True):
            ms = 4 * 2 * (2048 // d) * 8192 * 8192 * d / (tf * 1e12) * 1e3
            rows.append(_row("fa3-ablation", impl, 8192, d=d, b=2, h=2048 // d, ms=ms))
    return ATTENTION.frame(rows)


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
        with pytest.raises(NoDataError):
            draw(t, tmp_path / "x.png")
