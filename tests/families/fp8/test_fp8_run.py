"""The FP8 family's experiments (``analysis.families.fp8.run``) on tiny shapes in Triton's interpreter."""

from __future__ import annotations

import math

import pytest
import torch
from figure_helpers import ATTENTION

from analysis.core.plotting import NoDataError
from analysis.families._shared import attention_measure as attention
from analysis.families.fp8 import figures as fp8_figures
from analysis.families.fp8 import run as fp8
from analysis.families.fp8.plan import Fp8Spec as Spec
from kernels.attention import reference

ACC_IMPLS = [
    "naive",
    "ours-fa2",
    "ours-fp8-none",
    "ours-fp8-tensor",
    "ours-fp8-block",
    "ours-fp8-block-rot",
    "ours-fp8-block-p1",
]


def test_parse_impl():
    # (schedule None: FP8's default, fa3.FP8_SCHEDULE; "fa3": FA-3's full one, pinned)
    assert fp8.parse_impl("ours-fp8-block") == ("block", False, 256.0, "auto", False, None)
    assert fp8.parse_impl("ours-fp8-tensor-rot") == ("tensor", True, 256.0, "auto", False, None)
    assert fp8.parse_impl("ours-fp8-block-p1") == ("block", False, 1.0, "auto", False, None)
    assert fp8.parse_impl("ours-fp8-block-rot-triton-e2e") == ("block", True, 256.0, "triton", True, None)
    assert fp8.parse_impl("ours-fp8-head-e2e") == ("head", False, 256.0, "auto", True, None)
    assert fp8.parse_impl("ours-fp8-block-no-tma") == ("block", False, 256.0, "auto", False, "no-tma")
    assert fp8.parse_impl("ours-fp8-block-fa3") == ("block", False, 256.0, "auto", False, "fa3")
    assert fp8.parse_impl("ours-fp8-block-no-pingpong-e2e").schedule == "no-pingpong"
    for bad in (
        "ours-fa2",
        "ours-fp8-channel",
        "ours-fp8-",
        "ours-fp8-block-e2e-triton",
        "ours-fp8-e2e",
        "ours-fp8-no-tma",
        "ours-fp8-block-no-such-switch",
    ):
        with pytest.raises(ValueError, match="not an FP8"):
            fp8.parse_impl(bad)
    for name in ("ours-fp8-block-no-tma-triton", "ours-fp8-block-fa3-triton"):
        with pytest.raises(ValueError, match="FA-3 kernel's, not Triton's"):
            fp8.parse_impl(name)


def test_every_fp8_name_parses_and_every_switch_is_the_kernels():
    from analysis.families.fp8 import plan
    from kernels.attention import fa3

    for name in plan.FP8_IMPLS:
        impl = fp8.parse_impl(name)
        assert impl.schedule is None or impl.schedule in fa3.SCHEDULES, name
    assert fa3.FP8_SCHEDULE in fa3.SCHEDULES
    assert [fp8.parse_impl(n).schedule for n in plan.FP8_ABLATION_IMPLS] == list(fa3.SCHEDULES)
    assert fp8_figures.FP8_ABLATION_ORDER[0] == fp8_figures.FP8_FULL == plan.FP8_ABLATION_IMPLS[0]
    assert set(fp8_figures.FP8_ABLATION_ORDER) == set(plan.FP8_ABLATION_IMPLS)


def test_ablation_shards_and_their_cpu_rows(env):
    """fp8-ablation makes one shard per (head_dim, causal) of its section; in the interpreter (no FA-3 kernel)
    its switch rows are unsupported, naming the kernel they need, and the plain FP8 row runs the Triton one."""
    from analysis.families.fp8 import plan

    timed = {
        "enabled": True,
        "tokens": 16384,
        "hidden": 2048,
        "dtype": "bfloat16",
        "head_dims": [64, 128],
        "causal": [False],
        "seqlens": [8192],
        "impls": ["ours-fp8-block", "ours-fp8-block-no-tma", "ours-fa3"],
        "check_rows": 128,
        "warmup_ms": 25,
        "rep_ms": 100,
    }
    shards = plan.shards(
        {
            "fp8": {
                "spread_rounds": 3,
                "speed": {**timed, "enabled": False},
                "ablation": timed,
                "accuracy": {"enabled": False},
            }
        }
    )
    assert sorted(shards) == ["fp8-ablation_bfloat16_d128_full", "fp8-ablation_bfloat16_d64_full"]
    assert Spec(**shards["fp8-ablation_bfloat16_d128_full"]).shape(0) == (2, 16, 8192, 8192)
    assert shards["fp8-ablation_bfloat16_d64_full"]["spread_rounds"] == 3
    with pytest.raises(ValueError, match="fp8.ablation"):
        plan.shards(
            {
                "fp8": {
                    "spread_rounds": 3,
                    "speed": {**timed, "enabled": False},
                    "accuracy": {"enabled": False},
                    "ablation": {**timed, "impls": ["ours-fp8-block-triton-e2e"]},
                }
            }
        )
    spec = Spec(
        experiment="fp8-ablation",
        dtype="float16",
        head_dim=32,
        causal=False,
        seqlens=[64],
        tokens=128,
        hidden=64,
        impls=["ours-fp8-block", "ours-fp8-block-no-overlap"],
        check_rows=16,
    )
    df = ATTENTION.frame(fp8.run(spec, env, device="cpu", log_line=lambda s: None)).set_index("impl")
    assert df.loc["ours-fp8-block", "status"] == "ok" and not df["timed"].any()
    assert df.loc["ours-fp8-block-no-overlap", "status"] == "unsupported"
    assert "needs the FA-3 kernel" in df.loc["ours-fp8-block-no-overlap", "message"]


@pytest.mark.parametrize("kind", ["normal", "outliers", "large", "small"])
def test_make_inputs(kind):
    gen = torch.Generator().manual_seed(0)
    q, k, v = fp8.make_inputs(kind, [(1, 2, 4096, 64)] * 3, torch.float32, "cpu", gen)
    big = lambda t: (t.abs() > 8).float().mean().item()  # noqa: E731  (beyond 8σ of N(0, 1))
    if kind == "outliers":
        assert all(3e-4 < big(t) < 2e-3 for t in (q, k, v))  # ~0.1 % outliers of N(0, 100)
    elif kind == "large":
        assert big(q) == big(k) == 0 and v.abs().max() > 1000
    elif kind == "small":
        assert max(t.abs().max().item() for t in (q, k, v)) < 0.01
    else:
        assert big(q) == big(k) == big(v) == 0
    with pytest.raises(ValueError, match="unknown inputs"):
        fp8.make_inputs("huge", [(1, 1, 2, 2)], torch.float32, "cpu", gen)


def test_spec_checks_inputs():
    with pytest.raises(ValueError, match="unknown inputs"):
        Spec(
            experiment="fp8-accuracy",
            dtype="float16",
            head_dim=32,
            causal=False,
            seqlens=[8],
            impls=["naive"],
            inputs="weird",
        )
    with pytest.raises(ValueError, match="apply to fp8-accuracy only"):
        Spec(
            experiment="fp8-speed",
            dtype="float16",
            head_dim=32,
            causal=False,
            seqlens=[8],
            impls=["naive"],
            inputs="outliers",
        )


def test_accuracy_rows(env):
    """Errors are ordered as they must be: 16-bit kernels far below FP8; the unscaled control worst on small
    inputs; only FP8 rows carry P's underflow."""
    rows = []
    for kind in ("normal", "small"):
        spec = Spec(
            experiment="fp8-accuracy",
            dtype="float16",
            head_dim=32,
            causal=True,
            seqlens=[70, 130],
            batch=1,
            heads=2,
            impls=ACC_IMPLS,
            inputs=kind,
            check_rows=32,
        )
        rows += fp8.run(spec, env, device="cpu", log_line=lambda s: None)
    df = ATTENTION.frame(rows)
    assert (df["status"] == "ok").all() and not df["timed"].any()
    assert set(df["inputs"]) == {"normal", "small"}
    at = df[df["seqlen_q"] == 130].set_index(["inputs", "impl"])
    normal = at.loc["normal"]
    assert normal.loc["ours-fa2", "rms_err"] < normal.loc["ours-fp8-block", "rms_err"] / 10
    assert math.isnan(normal.loc["ours-fa2", "p_underflow"]) and normal.loc["ours-fp8-block", "p_underflow"] >= 0
    small = at.loc["small"]
    assert small.loc["ours-fp8-none", "rms_err"] > 2 * small.loc["ours-fp8-tensor", "rms_err"]
    assert "granularity=block" in normal.loc["ours-fp8-block", "kernel_config"]


def test_accuracy_rows_report_p_underflow_per_p_scale(env):
    """Sharp softmax rows (Q × 3, scores of spread 3): without P's scale e4m3 flushes a share of P; the
    scale of 256 keeps most of it, and the flushed share of the mass is what the rows say it is."""
    spec = Spec(
        experiment="fp8-accuracy",
        dtype="float16",
        head_dim=32,
        causal=False,
        seqlens=[130],
        batch=1,
        heads=2,
        impls=["ours-fp8-block"],
        check_rows=32,
    )
    gen = torch.Generator().manual_seed(4)
    q, k, v = fp8.make_inputs("normal", [(1, 2, 130, 32)] * 3, torch.float16, "cpu", gen)
    q = q * 3
    sample = torch.arange(130)
    ref = reference.reference_attention(q, k, v, False, rows=sample)
    base = attention.base_row(spec, {}, False, family="fp8", batch=1, heads=2, heads_kv=2, seqlen_q=130, seqlen_k=130)
    scaled = fp8._accuracy(spec, "ours-fp8-block", q, k, v, sample, ref, base)
    unscaled = fp8._accuracy(spec, "ours-fp8-block-p1", q, k, v, sample, ref, base)
    assert scaled["status"] == unscaled["status"] == "ok"
    assert unscaled["p_underflow"] > 0.05 and scaled["p_underflow"] < unscaled["p_underflow"] / 2
    assert 0 < unscaled["p_mass_lost"] < unscaled["p_underflow"]  # the flushed entries are the small ones
    assert "p_scale=1" in unscaled["kernel_config"] and "p_scale=256" in scaled["kernel_config"]


def test_speed_rows_on_cpu_are_gated_not_timed(env):
    spec = Spec(
        experiment="fp8-speed",
        dtype="float16",
        head_dim=32,
        causal=False,
        seqlens=[64],
        tokens=128,
        hidden=64,
        impls=[
            "ours-fp8-tensor",
            "ours-fp8-block",
            "ours-fp8-block-e2e",
            "ours-fp8-tensor-triton-e2e",
            "ours-fa2",
            "fp8-mm",
            "bf16-mm",
        ],
        check_rows=16,
    )
    df = ATTENTION.frame(fp8.run(spec, env, device="cpu", log_line=lambda s: None))
    assert (df["status"] == "ok").all(), df[["impl", "status", "message"]]
    assert not df["timed"].any() and df["tflops"].isna().all()
    fp8_rows = df[df["impl"].str.startswith("ours-fp8")]
    # "ok" already means within the gate's bound; beyond it, the kernel's error stays close to that of the
    # float64 replica of P's e4m3 rounding on the dequantised inputs (ref_err), not merely within the policy's 2×
    assert (fp8_rows["max_abs_err"] <= 1.25 * fp8_rows["ref_err"]).all(), fp8_rows[["max_abs_err", "ref_err"]]
    assert df[df["impl"] == "fp8-mm"]["message"].str.contains("_scaled_mm").all()
    e2e = df[df["impl"].str.endswith("-e2e")]
    assert len(e2e) == 2 and e2e["message"].str.startswith("end to end").all()
    assert e2e["kernel_config"].str.contains("quantised in the call").all()
    # the interpreter has no FA-3: every FP8 row ran the Triton kernel, and says so
    assert fp8_rows["kernel_config"].str.startswith("triton: ").all(), fp8_rows["kernel_config"]


def test_quantiser_and_copy_rows_on_cpu(env, monkeypatch):
    """fp8-quantize-<granularity> times fp8.attention's quantisation alone, gated against e4m3's rounding and
    fp8.quantize's descales; copy-qkv copies the same bytes. Both carry model_bytes; a quantiser that
    writes wrong values or wrong descales is a mismatch row, naming the tensor."""
    from kernels.attention import fp8 as kernels_fp8

    spec = Spec(
        experiment="fp8-speed",
        dtype="float16",
        head_dim=32,
        causal=False,
        seqlens=[64],
        tokens=128,
        hidden=64,
        impls=["fp8-quantize-block", "fp8-quantize-tensor", "copy-qkv"],
        check_rows=16,
    )
    df = ATTENTION.frame(fp8.run(spec, env, device="cpu", log_line=lambda s: None)).set_index("impl")
    assert (df["status"] == "ok").all(), df[["status", "message"]]
    elements = 2 * 2 * 64 * 32  # batch 2, heads 2, N 64, d 32 per tensor
    assert df.loc["copy-qkv", "model_bytes"] == 2 * 3 * elements * 2
    # 16-bit in, e4m3 out (V's keys already a multiple of 32: no padding), plus the fp32 descales
    blocks = kernels_fp8.blocks("triton", 32)
    nscales = 4 * (math.ceil(64 / blocks[0]) + 2 * math.ceil(64 / blocks[1]))
    assert df.loc["fp8-quantize-block", "model_bytes"] == 3 * elements * 3 + 4 * nscales
    assert df.loc["fp8-quantize-tensor", "model_bytes"] == 3 * elements * 3 + 4 * 3
    assert 0 < df.loc["fp8-quantize-block", "max_abs_err"] < 0.5 and df.loc["copy-qkv", "max_abs_err"] == 0
    assert "blocks=" in df.loc["fp8-quantize-block", "kernel_config"]

    real = kernels_fp8.quantize_qkv

    def off_by(scale_factor, value_factor):
        def broken(*args, **kwargs):
            q8, k8, v8, qs, ks, vs = real(*args, **kwargs)
            return q8, k8, (v8.float() * value_factor).to(v8.dtype), qs, ks * scale_factor, vs

        return broken

    for broken, what in ((off_by(2.0, 1.0), "k's descales"), (off_by(1.0, 0.5), "of v's values")):
        monkeypatch.setattr(kernels_fp8, "quantize_qkv", broken)
        spec = Spec(
            experiment="fp8-speed",
            dtype="float16",
            head_dim=32,
            causal=False,
            seqlens=[64],
            tokens=128,
            hidden=64,
            impls=["fp8-quantize-block"],
            check_rows=16,
        )
        (row,) = fp8.run(spec, env, device="cpu", log_line=lambda s: None)
        assert row["status"] == "mismatch" and what in row["message"], row["message"]


def test_fp8_ceiling_is_unsupported_without_fp8_tensor_cores(env, monkeypatch):
    """On a GPU of compute capability < 8.9 the fp8-mm row says why it was not measured (before any work)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    spec = Spec(
        experiment="fp8-speed",
        dtype="bfloat16",
        head_dim=32,
        causal=False,
        seqlens=[64],
        tokens=64,
        hidden=32,
        impls=["fp8-mm"],
    )
    base = attention.base_row(spec, {}, True, family="fp8", batch=1, heads=1, heads_kv=1, seqlen_q=64, seqlen_k=64)
    row = fp8._ceiling(spec, "fp8-mm", base, "cuda:0", True)
    assert row["status"] == "unsupported" and "compute capability ≥ 8.9" in row["message"], row["message"]


def _table_row(impl, experiment, **over):
    r = {c: math.nan for c in ATTENTION.columns}
    r.update(
        experiment=experiment,
        family="fp8",
        op="attention",
        impl=impl,
        dtype="bfloat16",
        mode="fwd",
        batch=4,
        heads=16,
        heads_kv=16,
        seqlen_q=4096,
        seqlen_k=4096,
        head_dim=128,
        causal=False,
        inputs="normal",
        status="ok",
        message="",
        timed=experiment == "fp8-speed",
        gpu="h200",
        gpu_name="NVIDIA H200",
        kernel_config="",
    )
    r.update(over)
    return r


def test_fp8_figures_from_a_synthetic_table(tmp_path):
    speed = [
        _table_row("ours-fa2", "fp8-speed", ms_median=1.5, tflops=400.0),
        _table_row("ours-fp8-block", "fp8-speed", ms_median=1.0, tflops=600.0),
        _table_row("sdpa-cudnn", "fp8-speed", ms_median=1.2, tflops=500.0),
        _table_row("fp8-mm", "fp8-speed", ms_median=0.8, tflops=1300.0),
        _table_row("ours-fp8-tensor", "fp8-speed", status="oom", message="out of memory"),
    ]
    df = ATTENTION.frame(speed)
    t = fp8_figures.fp8_speed(df, tmp_path / "speed.png").set_index("impl")
    assert (tmp_path / "speed.png").stat().st_size > 0
    assert t.loc["ours-fp8-block", "speedup_vs_fa2"] == pytest.approx(1.5)
    assert t.loc["sdpa-cudnn", "speedup_vs_fa2"] == pytest.approx(1.25)
    assert t.loc["ours-fa2", "speedup_vs_fa2"] == 1.0 and math.isnan(t.loc["fp8-mm", "speedup_vs_fa2"])
    assert t.loc["ours-fp8-tensor", "status"] == "oom"  # the failed point stays in the table

    acc = [
        _table_row(i, "fp8-accuracy", inputs=kind, rms_err=e, p_underflow=u)
        for kind in ("normal", "outliers")
        for i, e, u in (("ours-fa2", 1e-5, math.nan), ("ours-fp8-block", 1e-2, 0.01), ("ours-fp8-block-p1", 1e-2, 0.2))
    ]
    t = fp8_figures.fp8_accuracy(ATTENTION.frame(acc), tmp_path / "acc.png")
    assert set(t["inputs"]) == {"normal", "outliers"} and len(t) == 6
    assert t.set_index(["inputs", "impl"]).loc[("outliers", "ours-fp8-block-p1"), "p_underflow"] == 0.2
    with pytest.raises(NoDataError):
        fp8_figures.fp8_accuracy(ATTENTION.frame(speed), tmp_path / "none.png")

    abl = [
        _table_row(i, "fp8-ablation", seqlen_q=8192, seqlen_k=8192, batch=2, timed=True, ms_median=1.0, tflops=tf)
        for i, tf in (("ours-fp8-block-fa3", 680.0), ("ours-fp8-block-no-tma", 612.0), ("ours-fa3", 620.0))
    ]
    abl.append(
        _table_row(
            "ours-fp8-block-no-pingpong",
            "fp8-ablation",
            seqlen_q=8192,
            seqlen_k=8192,
            batch=2,
            timed=True,
            status="error",
            message="ptxas",
        )
    )
    t = fp8_figures.fp8_ablation(ATTENTION.frame(abl), tmp_path / "abl.png").set_index("impl")
    assert (tmp_path / "abl.png").stat().st_size > 10_000
    assert t.loc["ours-fp8-block-no-tma", "change_pct"] == pytest.approx(-10.0)
    assert t.loc["ours-fa3", "change_pct"] == pytest.approx(100 * (620 / 680 - 1))
    assert t.loc["ours-fp8-block-no-pingpong", "status"] == "error"  # the failed variant stays listed
    with pytest.raises(NoDataError):  # no full FP8 kernel row: nothing to measure the change against
        fp8_figures.fp8_ablation(ATTENTION.frame(abl[1:]), tmp_path / "none.png")
