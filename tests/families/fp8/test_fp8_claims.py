"""The FP8 family's claim evaluators on small fixture tables: the FP8/bf16 GEMM ratio, the accuracy against
float64 and the per-tensor scales."""

from __future__ import annotations

import math

import pytest
from audit_helpers import audit_one, fixture_ctx, fixture_row, measured_row

from analysis import audit


def _fp8_speed_rows(fp8_mm=1440.0, bf16_mm=790.0, ours_ms=0.65, fa2_ms=1.0):
    common = dict(experiment="fp8-speed", dtype="bfloat16", seqlen_q=4096, seqlen_k=4096, causal=False)
    return [
        fixture_row("fp8-mm", tflops=fp8_mm, **common),
        fixture_row("bf16-mm", tflops=bf16_mm, **common),
        fixture_row("ours-fp8-block", ms_median=ours_ms, tflops=700.0, **common),
        fixture_row("ours-fa2", ms_median=fa2_ms, tflops=470.0, **common),
    ]


@pytest.mark.parametrize("fp8_mm, expected", [(1580.0, "holds"), (1440.0, "partly"), (700.0, "fails")])
def test_fp8_2pf_measured_gemm_ratio(claims, fp8_mm, expected):
    df = audit_one(claims, "fp8-2pf", fixture_ctx(_fp8_speed_rows(fp8_mm=fp8_mm)))
    assert df[df["gpu"] == audit.ANALYTIC].iloc[0]["verdict"] == "holds"  # the datasheet's 1979 ≈ 2000
    row = measured_row(df)
    assert row["verdict"] == expected
    assert f"{fp8_mm / 790:.2f}×" in row["observed"]
    assert "1.54×" in row["note"]  # attention: 1.0 / 0.65


def _acc_row(impl, rms, inputs="normal", under=math.nan, mass=math.nan, n=8192):
    return fixture_row(
        impl,
        experiment="fp8-accuracy",
        timed=False,
        ms_median=math.nan,
        tflops=math.nan,
        rms_err=rms,
        inputs=inputs,
        p_underflow=under,
        p_mass_lost=mass,
        seqlen_q=n,
        seqlen_k=n,
    )


@pytest.mark.parametrize(
    "p1_rms, p1_under, expected",
    [(2.0e-2, 0.3, "holds"), (1.01e-2, 0.3, "partly"), (1.0e-2, 0.0, "fails")],
    ids=["costs-accuracy", "underflow-harmless", "no-underflow"],
)
def test_fp8_accuracy_measured(claims, p1_rms, p1_under, expected):
    rows = [
        _acc_row("ours-fa2", 1e-4),
        _acc_row("ours-fp8-block", 1.0e-2, under=0.0, mass=0.0),
        _acc_row("ours-fp8-block-p1", p1_rms, under=p1_under, mass=1e-4),
        _acc_row("ours-fp8-block-p1", 5e-1, under=0.0, mass=0.0, n=1024),
    ]  # smaller N: ignored
    df = audit_one(claims, "fp8-accuracy", fixture_ctx(rows))
    assert df[df["gpu"] == audit.ANALYTIC].iloc[0]["verdict"] == "holds"  # 2⁻⁹
    assert measured_row(df)["verdict"] == expected
    assert "N(0,1) inputs" in measured_row(df)["note"]
    # with FlashAttention-3's outlier rows present, those are judged (here an underflow that costs accuracy)
    outliers = [dict(r, inputs="outliers") for r in rows[:2]]
    outliers.append(dict(_acc_row("ours-fp8-block-p1", 3.0e-2, under=0.4, mass=1e-2), inputs="outliers"))
    row = measured_row(audit_one(claims, "fp8-accuracy", fixture_ctx(rows + outliers)))
    assert row["verdict"] == "holds" and "outlier" in row["note"]


def test_fp8_accuracy_without_rows_keeps_the_analytic_verdict_and_marks_gpu_untestable(claims):
    df = audit_one(claims, "fp8-accuracy", fixture_ctx([fixture_row("ours-fa2")]))
    assert measured_row(df)["verdict"] == "untestable"


@pytest.mark.parametrize(
    "normal, large, expected",
    [
        ((3e-2, 1e-2), (5e-1, 1e-2), "holds"),
        ((1e-2, 1e-2), (5e-1, 1e-2), "partly"),
        ((1e-2, 1e-2), (1e-2, 1e-2), "fails"),
    ],
    ids=["always", "only-large", "never"],
)
def test_fp8_scales(claims, normal, large, expected):
    rows = [
        _acc_row("ours-fp8-none", normal[0]),
        _acc_row("ours-fp8-tensor", normal[1]),
        _acc_row("ours-fp8-none", large[0], inputs="large"),
        _acc_row("ours-fp8-tensor", large[1], inputs="large"),
    ]
    row = measured_row(audit_one(claims, "fp8-scales", fixture_ctx(rows)))
    assert row["verdict"] == expected
    assert "large" in row["observed"]


def test_fp8_scales_untestable_without_large_inputs(claims):
    rows = [_acc_row("ours-fp8-none", 1e-2), _acc_row("ours-fp8-tensor", 1e-2)]
    assert measured_row(audit_one(claims, "fp8-scales", fixture_ctx(rows)))["verdict"] == "untestable"
