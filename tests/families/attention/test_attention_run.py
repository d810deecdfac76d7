"""Every attention experiment's run at tiny sizes, through Triton's interpreter on the CPU.

The GPU-only parts of the harness (CUDA-event timing, CUDA peak memory) are replaced by a fake that
still calls the timed callable (tests/fake_harness.py, through the ``fake_timing`` fixture), so each
experiment's whole path runs: inputs, references, the output and gradient gates, the timed callable of
every mode, and the derived columns (TFLOP/s of the mode, model bytes and GB/s, pad waste). bfloat16
cannot run in the interpreter, so these use float16.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from fake_harness import MS

from analysis import registry
from analysis.core import harness
from analysis.core.flops import attention_flops
from analysis.core.models import attention_io_bytes
from analysis.core.points import DTYPES
from analysis.families._shared import attention_measure, attention_plan
from analysis.families.attention import plan, varlen
from analysis.families.attention.run import run as run_shard
from kernels.attention import reference

ATTENTION = registry.table("attention")

ROOT = Path(__file__).resolve().parents[3]


def _spec(**kw) -> plan.Spec:
    fields = dict(
        experiment="fa2-setting",
        dtype="float16",
        head_dim=16,
        causal=True,
        seqlens=[40],
        impls=["ours-fa2", "naive"],
        tokens=80,
        hidden=32,
        check_rows=16,
    )
    fields.update(kw)
    return plan.Spec(**fields)


def _run(spec, env, lines=None):
    rows = run_shard(spec, env, device="cpu", log_line=(lines.append if lines is not None else lambda s: None))
    ATTENTION.frame(rows)  # every row fits the table's schema
    return rows


# ---------------------------------------------------------------------------------------------------
# Spec
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, match",
    [
        pytest.param({"mode": "both"}, "unknown mode 'both'", id="unknown-mode"),
        pytest.param({"impls": ["copy-kv"]}, r"implementations \['copy-kv'\] do not belong", id="copy-kv-elsewhere"),
        pytest.param(
            {"experiment": "decode", "mode": "bwd", "impls": ["ours-decode"]}, "forward pass only", id="decode-bwd"
        ),
        pytest.param({"experiment": "block-sweep", "impls": ["ours-fa2"]}, "needs a list of configs", id="no-configs"),
        pytest.param(
            {"experiment": "block-sweep", "impls": ["ours-fa2"], "configs": ["BLOCK_M=64"]},
            "cannot parse FA-2 config 'BLOCK_M=64'",
            id="sweep-bad-config",
        ),
        pytest.param(
            {"configs": ["BLOCK_M=64,BLOCK_N=64,num_warps=4,num_stages=2"]},
            "apply to block-sweep only",
            id="configs-elsewhere",
        ),
        pytest.param(
            {"experiment": "memory", "heads": 16, "heads_kv": 3}, "heads_kv 3 must divide heads 16", id="heads-kv"
        ),
        pytest.param(
            {"experiment": "varlen", "impls": ["ours-varlen"], "seqlens": []},
            "at least one sequence",
            id="varlen-empty",
        ),
    ],
)
def test_spec_validation(overrides, match):
    with pytest.raises(ValueError, match=match):
        _spec(**overrides)


@pytest.mark.parametrize(
    "fields, index, expected",
    [
        pytest.param(
            dict(experiment="gain-surface", head_dim=256, seqlens=[512, 16384], heads=16),
            0,
            (32, 16, 512, 512),
            id="gain-surface",
        ),
        pytest.param(
            dict(experiment="rescale-ablation", head_dim=64, seqlens=[4096]),
            0,
            (4, 32, 4096, 4096),
            id="rescale-fa2-shapes",
        ),
        pytest.param(
            dict(experiment="fa1-setting", head_dim=64, seqlens=[128, 8192], batch=8, heads=12),
            1,
            (8, 12, 8192, 8192),
            id="fa1-setting",
        ),
        pytest.param(
            dict(experiment="decode", head_dim=128, seqlens=[1, 1], seqlen_k=[1024, 131072], heads=16, heads_kv=2),
            1,
            (1, 16, 1, 131072),
            id="decode",
        ),
    ],
)
def test_spec_shapes(fields, index, expected):
    impls = ["ours-decode"] if fields["experiment"] == "decode" else ["ours-fa2"]
    spec = plan.Spec(dtype="float16", causal=False, impls=impls, tokens=16384, hidden=2048, **fields)
    assert spec.shape(index) == expected


def test_spec_defaults_are_the_harness_defaults_and_config_form():
    from kernels.attention.fa2 import FA2Config

    assert (attention_plan.DEFAULT_WARMUP_MS, attention_plan.DEFAULT_REP_MS) == (
        harness.DEFAULT_WARMUP_MS,
        harness.DEFAULT_REP_MS,
    )
    assert attention_plan.CONFIG_PATTERN.match(str(FA2Config(128, 64, 8, 3)))
    assert set(attention_plan.DTYPE_NAMES) == set(DTYPES)


def test_block_sweep_points_are_configs_times_seqlens():
    configs = ["BLOCK_M=64,BLOCK_N=32,num_warps=4,num_stages=2", "BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=2"]
    spec = _spec(experiment="block-sweep", impls=["ours-fa2"], configs=configs, seqlens=[4096, 16384], heads=16)
    assert spec.points() == 4
    assert spec.variants() == [("ours-fa2", c) for c in configs]


# ---------------------------------------------------------------------------------------------------
# Modes and the gradient gate
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["bwd", "fwd+bwd"])
def test_gradient_modes(mode, env, fake_timing):
    spec = _spec(mode=mode, impls=["ours-fa2", "ours-fa1", "naive"], warmup_ms=3, rep_ms=7)
    lines: list[str] = []
    rows = _run(spec, env, lines)
    assert [r["impl"] for r in rows] == spec.impls
    b, h, n, _ = spec.shape(0)
    flops = attention_flops(b, h, n, n, 16, True, mode)
    for r in rows:
        assert r["status"] == "ok", r["message"]
        assert r["mode"] == mode and r["message"] == ""
        assert 0 <= r["max_abs_err"] <= r["err_bound"]
        assert r["tflops"] == pytest.approx(flops / (MS * 1e-3) / 1e12)
        assert r["peak_mem_mib"] == 1.5
        assert math.isnan(r["model_bytes"]) and math.isnan(r["gbps"]) and math.isnan(r["pad_waste"])
    assert fake_timing == [(3, 7)] * 3  # the experiment's own warm-up and repetition times
    assert re.fullmatch(r"fwd: BLOCK_M=\S+; bwd: dkdv=BLOCK_M=\S+;dq=BLOCK_M=\S+", rows[0]["kernel_config"])
    assert rows[1]["kernel_config"].startswith("BLOCK_R=")
    assert all(mode in line for line in lines)


def test_repeat_rounds_of_a_point(env, fake_timing, monkeypatch):
    """With spread_rounds, every implementation of a point is timed again in rounds after all were measured
    (the harness's step 6), at a quarter of the point's times; the backward alone builds a forward graph for
    each round. The rows record the rounds; their median stays the main timing's."""
    import fake_harness

    real, forwards = attention_measure.implementation, []

    def counting(name, config=None):
        fn = real(name, config)
        return lambda *args: forwards.append(name) or fn(*args)

    monkeypatch.setattr(attention_measure, "implementation", counting)
    spec = _spec(mode="bwd", impls=["ours-fa2", "naive"], warmup_ms=4, rep_ms=8, spread_rounds=2)
    rows = _run(spec, env)
    assert [(w, r) for _, w, r in fake_timing.rounds] == [(1.0, 2.0)] * 4
    assert forwards == ["ours-fa2", "naive", "ours-fa2", "naive", "ours-fa2", "naive"]  # the gates', then 2 rounds
    # interleaved: ours-fa2 was timed in the fake's rounds 1 and 3, naive in 2 and 4
    given = fake_harness.ROUND_MS
    for r, mine in zip(rows, ((given[0], given[2]), (given[1], given[0])), strict=True):
        assert r["status"] == "ok" and r["spread_rounds"] == 2 and r["ms_median"] == MS
        assert (r["ms_round_min"], r["ms_round_max"]) == (min(mine), max(mine))


class _WrongDV(torch.autograd.Function):
    """Three-step attention whose forward is right and whose dV is 1.5 times too large."""

    @staticmethod
    def forward(ctx, q, k, v, causal):
        ctx.save_for_backward(q, k, v)
        ctx.causal = causal
        return reference.naive_attention(q, k, v, causal)

    @staticmethod
    def backward(ctx, do):
        leaves = [t.detach().requires_grad_(True) for t in ctx.saved_tensors]
        with torch.enable_grad():
            dq, dk, dv = torch.autograd.grad(reference.naive_attention(*leaves, ctx.causal), leaves, do)
        return dq, dk, 1.5 * dv, None


def test_gradient_gate_catches_a_wrong_gradient(env, fake_timing, monkeypatch):
    monkeypatch.setattr(attention_measure, "implementation", lambda name, config=None: _WrongDV.apply)
    rows = _run(_spec(mode="bwd", impls=["naive"]), env)
    (row,) = rows
    assert row["status"] == "mismatch"
    assert row["message"].startswith("dv naive: max-abs error") and "dq" not in row["message"]
    assert row["max_abs_err"] > row["err_bound"]
    assert math.isnan(row["ms_median"]) and fake_timing == []  # a failed gate is never timed


def test_gradient_gate_skipped_when_the_float64_slice_does_not_fit(env, fake_timing, monkeypatch):
    def too_big(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 32.00 GiB")

    monkeypatch.setattr(reference, "attention_grads", too_big)
    (row,) = _run(_spec(mode="fwd+bwd", impls=["ours-fa2"]), env)
    assert row["status"] == "ok"
    assert row["message"].startswith("gradient gate skipped: the float64 reference of one (batch, head) slice")
    assert 0 <= row["max_abs_err"] <= row["err_bound"]  # the output is still checked on sampled rows
    assert row["ms_median"] == MS


def test_gradient_gate_of_grouped_query_heads(env, fake_timing):
    """With K/V shared by two query heads, dK and dV of K/V head 0 sum over both: the slice holds both."""
    spec = _spec(experiment="memory", mode="bwd", batch=1, heads=4, heads_kv=2, impls=["ours-fa2", "naive"])
    rows = _run(spec, env)
    assert [r["status"] for r in rows] == ["ok", "ok"], [r["message"] for r in rows]
    assert all(r["heads_kv"] == 2 for r in rows)


# ---------------------------------------------------------------------------------------------------
# The experiments
# ---------------------------------------------------------------------------------------------------


def test_fa1_setting_records_out_of_memory_as_a_row(env, fake_timing, monkeypatch):
    real = attention_measure.implementation

    def naive_runs_out(name, config=None):
        if name != "naive":
            return real(name)

        def fn(q, k, v, causal):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 48.00 GiB")

        return fn

    monkeypatch.setattr(attention_measure, "implementation", naive_runs_out)
    spec = _spec(
        experiment="fa1-setting",
        mode="fwd+bwd",
        causal=False,
        batch=1,
        heads=2,
        seqlens=[24, 40],
        impls=["ours-fa2", "ours-fa1", "naive", "sdpa-math"],
    )
    rows = _run(spec, env)
    assert [(r["seqlen_q"], r["impl"], r["status"]) for r in rows] == [
        (n, impl, "oom" if impl == "naive" else "ok") for n in (24, 40) for impl in spec.impls
    ]
    assert all(r["message"].startswith("OutOfMemoryError") for r in rows if r["status"] == "oom")
    assert all((r["batch"], r["heads"]) == (1, 2) for r in rows)


def test_gain_surface(env, fake_timing):
    rows = _run(_spec(experiment="gain-surface", causal=False, heads=2, seqlens=[16, 32], tokens=64), env)
    assert [(r["batch"], r["seqlen_q"], r["status"]) for r in rows] == [(4, 16, "ok")] * 2 + [(2, 32, "ok")] * 2


def test_block_sweep_pins_each_config(env, fake_timing):
    configs = ["BLOCK_M=16,BLOCK_N=16,num_warps=4,num_stages=1", "BLOCK_M=32,BLOCK_N=16,num_warps=4,num_stages=1"]
    spec = _spec(experiment="block-sweep", impls=["ours-fa2"], configs=configs, causal=False, heads=2, tokens=40)
    lines: list[str] = []
    rows = _run(spec, env, lines)
    assert [r["kernel_config"] for r in rows] == configs
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert "[BLOCK_M=16,BLOCK_N=16" in lines[0]


def test_rescale_ablation(env, fake_timing):
    spec = _spec(experiment="rescale-ablation", impls=["ours-fa2", "ours-fa2-eager"], causal=False)
    rows = _run(spec, env)
    assert [r["status"] for r in rows] == ["ok", "ok"], [r["message"] for r in rows]
    assert all(0 <= r["max_abs_err"] <= r["err_bound"] for r in rows)
    assert all(r["kernel_config"].startswith("BLOCK_M=") for r in rows)


def test_decode(env, fake_timing):
    impls = ["ours-decode", "ours-decode-unsplit", "ours-fa2", "naive", "sdpa-math", "copy-kv"]
    spec = _spec(
        experiment="decode",
        impls=impls,
        causal=False,
        head_dim=32,
        heads=4,
        heads_kv=2,
        seqlens=[1, 3],
        seqlen_k=[100, 160],
    )
    rows = _run(spec, env)
    assert [(r["seqlen_q"], r["seqlen_k"], r["impl"]) for r in rows] == [
        (nq, nk, impl) for nq, nk in ((1, 100), (3, 160)) for impl in impls
    ]
    for r in rows:
        assert r["status"] == "ok", r["message"]
        assert (r["heads"], r["heads_kv"], r["mode"]) == (4, 2, "fwd")
        kv_bytes = 2 * 1 * 2 * r["seqlen_k"] * 32 * 2  # K and V, fp16
        if r["impl"] == "copy-kv":
            assert r["model_bytes"] == 2 * kv_bytes and math.isnan(r["tflops"])
        else:
            assert r["model_bytes"] == attention_io_bytes(1, 4, 2, r["seqlen_q"], r["seqlen_k"], 32, 2)
            assert r["model_bytes"] == kv_bytes + 2 * 4 * r["seqlen_q"] * 32 * 2
            assert 0 <= r["max_abs_err"] <= r["err_bound"]
        assert r["gbps"] == pytest.approx(r["model_bytes"] / (MS * 1e-3) / 1e9)
    configs = {r["impl"]: r["kernel_config"] for r in rows[: len(impls)]}
    assert re.fullmatch(r"num_splits=\d+", configs["ours-decode"]) and configs["ours-decode-unsplit"] == "num_splits=1"


def test_decode_query_too_long_is_unsupported(env, fake_timing):
    rows = _run(_spec(experiment="decode", impls=["ours-decode"], causal=False, seqlens=[17], seqlen_k=[40]), env)
    assert rows[0]["status"] == "unsupported" and "1 to 16 query rows" in rows[0]["message"]


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen(mode, causal, env, fake_timing, monkeypatch):
    from kernels.attention import fa2

    monkeypatch.setattr(varlen, "PADDED_SDPA_BACKEND", "MATH")  # the efficient backend has no CPU kernel
    lengths = [17, 40, 5]
    spec = _spec(experiment="varlen", impls=list(plan.VARLEN_IMPLS), causal=causal, mode=mode, heads=2, seqlens=lengths)
    rows = _run(spec, env)
    by_impl = {r["impl"]: r for r in rows}
    useful, padded = varlen.useful_and_padded_flops(lengths, 2, 16, causal, mode)
    for r in rows:
        assert (r["batch"], r["seqlen_q"], r["seqlen_k"], r["tokens"], r["mode"]) == (3, 40, 40, 62, mode)
        assert r["pad_waste"] == pytest.approx(1 - useful / padded)
    for impl in ("ours-fa2-padded", "sdpa-efficient-padded"):
        r = by_impl[impl]
        assert r["status"] == "ok", r["message"]
        assert r["tflops"] == pytest.approx(useful / (MS * 1e-3) / 1e12)  # useful FLOPs, not padded ones
        assert 0 <= r["max_abs_err"] <= r["err_bound"]
    assert "measures the cost of padding" in by_impl["ours-fa2-padded"]["message"]
    assert ("attend to the zero padding keys" in by_impl["ours-fa2-padded"]["message"]) is not causal
    assert "checked on the real tokens" in by_impl["sdpa-efficient-padded"]["message"]
    if not hasattr(fa2, "attention_varlen"):
        pytest.skip("kernels.attention.fa2.attention_varlen is not there yet (being added)")
    assert by_impl["ours-varlen"]["status"] == "ok", by_impl["ours-varlen"]["message"]
    assert by_impl["ours-varlen"]["message"] == ""


def test_varlen_padded_sdpa_without_the_mask_is_caught(env, fake_timing, monkeypatch):
    """The padded SDPA row is checked on the real tokens: dropping its key-padding mask is a mismatch."""
    monkeypatch.setattr(varlen, "PADDED_SDPA_BACKEND", "MATH")
    monkeypatch.setattr(varlen._Batch, "mask", lambda self: None)
    spec = _spec(experiment="varlen", impls=["sdpa-efficient-padded"], causal=False, heads=2, seqlens=[17, 40])
    (row,) = _run(spec, env)
    assert row["status"] == "mismatch" and row["message"].startswith("sdpa-efficient-padded output")


def test_inputs_that_do_not_fit_mark_every_variant(env, fake_timing, monkeypatch):
    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 GiB")

    monkeypatch.setattr(attention_measure, "randn", no_memory)
    monkeypatch.setattr(varlen, "randn", no_memory)
    configs = ["BLOCK_M=16,BLOCK_N=16,num_warps=4,num_stages=1", "BLOCK_M=32,BLOCK_N=16,num_warps=4,num_stages=1"]
    rows = _run(_spec(experiment="block-sweep", impls=["ours-fa2"], configs=configs, heads=2), env)
    assert [(r["status"], r["kernel_config"]) for r in rows] == [("oom", c) for c in configs]
    rows = _run(_spec(experiment="varlen", impls=["ours-varlen", "ours-fa2-padded"], heads=2, seqlens=[3, 9]), env)
    assert [r["status"] for r in rows] == ["oom", "oom"]
    assert all(r["message"].startswith("inputs/reference: OutOfMemoryError") for r in rows)
