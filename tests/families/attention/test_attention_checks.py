"""The attention family's run on its ``interpreter-check`` kind: tiny shapes through Triton's interpreter on
the CPU (``tests/conftest.py`` sets ``TRITON_INTERPRET``), correctness only, nothing timed; the gates that
record a mismatch, an out-of-memory point or a failed reference as rows."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest
import torch

from analysis import registry
from analysis.core.provenance import ROW_FIELDS
from analysis.families._shared import attention_measure
from analysis.families.attention import plan
from analysis.families.attention.run import run as run_shard
from kernels.attention.fa2 import FA2Config

ATTENTION = registry.table("attention")
HAS_CUDA = torch.cuda.is_available()
cpu_only = pytest.mark.skipif(HAS_CUDA, reason="asserts what SDPA backends do on a CPU; a CUDA GPU is present")

NO_VIABLE_BACKEND = (
    "No viable backend for scaled_dot_product_attention was found. "
    "This is likely due to turning off both the math kernel and the fused kernels."
)


def _spec(**overrides) -> plan.Spec:
    fields = dict(
        experiment="interpreter-check",
        dtype="float16",
        head_dim=59,
        causal=True,
        seqlens=[17, 97],
        seqlen_k=[33, 33],
        impls=["ours-fa2", "naive"],
        batch=2,
        heads=2,
        check_rows=16,
    )
    fields.update(overrides)
    return plan.Spec(**fields)


@pytest.mark.parametrize(
    "overrides, match",
    [
        pytest.param({"impls": ["ours-fa2", "flash3"]}, r"unknown implementations \['flash3'\]", id="unknown-impl"),
        pytest.param({"experiment": "speed"}, "unknown experiment 'speed'", id="unknown-experiment"),
        pytest.param({"dtype": "float64"}, "unknown dtype 'float64'", id="unknown-dtype"),
        pytest.param({"seqlen_k": [33]}, "seqlen_k must list one key length per entry", id="seqlen-k-too-short"),
        pytest.param({"seqlen_k": [1, 2, 3]}, "seqlen_k must list one key length per entry", id="seqlen-k-too-long"),
    ],
)
def test_spec_validation(overrides, match):
    with pytest.raises(ValueError, match=match):
        _spec(**overrides)


@pytest.mark.parametrize(
    "fields, index, expected",
    [
        pytest.param(
            dict(experiment="fa2-setting", head_dim=128, seqlens=[512, 4096]),
            1,
            (4, 16, 4096, 4096),
            id="fa2-setting-d128-n4096",
        ),
        pytest.param(
            dict(experiment="fa2-setting", head_dim=64, seqlens=[512, 4096]),
            0,
            (32, 32, 512, 512),
            id="fa2-setting-d64-n512",
        ),
        pytest.param(
            dict(experiment="fa2-setting", head_dim=128, seqlens=[32768]),
            0,
            (1, 16, 32768, 32768),
            id="fa2-setting-batch-at-least-1",
        ),
        pytest.param(dict(experiment="memory", head_dim=64, seqlens=[1024, 8192]), 1, (1, 16, 8192, 8192), id="memory"),
        pytest.param(
            dict(experiment="interpreter-check", head_dim=59, seqlens=[1, 97], seqlen_k=[1, 70], batch=2, heads=2),
            1,
            (2, 2, 97, 70),
            id="interpreter-seqlen-k",
        ),
    ],
)
def test_spec_shape(fields, index, expected):
    spec = plan.Spec(dtype="float16", causal=False, impls=["ours-fa2"], **fields)
    assert spec.shape(index) == expected


def test_spec_shape_hidden_not_multiple_of_head_dim():
    spec = plan.Spec(
        experiment="fa2-setting", dtype="float16", head_dim=96, causal=False, seqlens=[1024], impls=["naive"]
    )
    with pytest.raises(ValueError, match="hidden 2048 is not a multiple of head_dim 96"):
        spec.shape(0)


def test_unknown_implementation():
    with pytest.raises(ValueError, match="unknown implementation 'flash3'"):
        attention_measure.implementation("flash3")


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({}, id="nq17-97-nk33-d59-causal-f16"),
        pytest.param(
            dict(dtype="float32", causal=False, head_dim=80, seqlens=[1, 130], seqlen_k=[1, 70]),
            id="nq1-130-nk1-70-d80-f32",
        ),
    ],
)
def test_run_interpreter_check(overrides, env, device):
    spec = _spec(**overrides)
    lines: list[str] = []
    rows = run_shard(spec, env, device=device, log_line=lines.append)

    points = [(spec.shape(i), impl) for i in range(len(spec.seqlens)) for impl in spec.impls]
    assert len(rows) == len(points) == 4
    for row, ((b, h, nq, nk), impl) in zip(rows, points, strict=True):
        assert row["impl"] == impl
        assert (row["batch"], row["heads"], row["heads_kv"], row["seqlen_q"], row["seqlen_k"]) == (b, h, h, nq, nk)
        assert row["status"] == "ok", row["message"]
        assert row["message"] == ""
        assert row["timed"] is False
        assert row["experiment"] == "interpreter-check" and row["mode"] == "fwd" and row["dtype"] == spec.dtype
        assert row["causal"] is spec.causal and row["head_dim"] == spec.head_dim
        for key in ("ms_median", "ms_p20", "ms_p80", "tflops", "peak_mem_mib", "sm_clock_mhz", "power_w"):
            assert math.isnan(row[key]), key
        assert math.isfinite(row["max_abs_err"]) and math.isfinite(row["err_bound"])
        assert 0.0 <= row["max_abs_err"] <= row["err_bound"]
        assert row["rms_err"] <= row["max_abs_err"]
        for key in ROW_FIELDS:
            assert row[key] == env[key], key
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", row["timestamp"])
        if impl == "ours-fa2":
            assert str(FA2Config.parse(row["kernel_config"])) == row["kernel_config"]
        else:
            assert row["kernel_config"] == ""

    assert [line.split("]")[0] for line in lines] == ["[1/4", "[2/4", "[3/4", "[4/4"]
    assert all(": ok (" in line for line in lines)
    df = ATTENTION.frame(rows)
    assert list(df.columns) == list(ATTENTION.columns) and len(df) == 4


@cpu_only
def test_run_sdpa_backends_on_cpu(env):
    """What SDPA's pinned backends do on a CPU, row by row, without the run raising.

    PyTorch ships a CPU flash-attention kernel, so ``sdpa-flash`` (and ``sdpa-math``) run and pass the
    gate; ``efficient`` and ``cudnn`` have no CPU kernel and are refused with "No viable backend",
    which ``classify`` files as ``unsupported``.
    """
    spec = _spec(impls=["sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math"], seqlens=[33], seqlen_k=[97])
    rows = run_shard(spec, env, device="cpu", log_line=lambda line: None)
    by_impl = {r["impl"]: r for r in rows}
    assert list(by_impl) == spec.impls
    for impl in ("sdpa-flash", "sdpa-math"):
        assert by_impl[impl]["status"] == "ok", by_impl[impl]["message"]
        assert by_impl[impl]["max_abs_err"] <= by_impl[impl]["err_bound"]
    for impl in ("sdpa-efficient", "sdpa-cudnn"):
        assert by_impl[impl]["status"] == "unsupported"
        assert by_impl[impl]["message"] == f"RuntimeError: {NO_VIABLE_BACKEND}"
        assert math.isnan(by_impl[impl]["max_abs_err"])
    ATTENTION.frame(rows)


def test_run_gate_records_mismatch(env, device, monkeypatch):
    from kernels.attention import reference

    def broken(name):
        return lambda q, k, v, causal: reference.naive_attention(q, k, v, causal) + 0.1

    monkeypatch.setattr(attention_measure, "implementation", broken)
    rows = run_shard(
        _spec(impls=["naive"], seqlens=[33], seqlen_k=[33]), env, device=device, log_line=lambda line: None
    )
    assert len(rows) == 1
    row = rows[0]
    assert row["status"] == "mismatch"
    assert "max-abs" in row["message"] and row["message"].startswith("naive output")
    assert row["max_abs_err"] > row["err_bound"]
    assert row["max_abs_err"] == pytest.approx(0.1, abs=2e-3)
    assert math.isnan(row["ms_median"])
    ATTENTION.frame(rows)


def test_run_records_oom_instead_of_raising(env, device, monkeypatch):
    def exhausted(name):
        def fn(q, k, v, causal):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")

        return fn

    monkeypatch.setattr(attention_measure, "implementation", exhausted)
    rows = run_shard(
        _spec(impls=["naive", "ours-fa2"], seqlens=[17], seqlen_k=[17]), env, device=device, log_line=lambda line: None
    )
    assert [r["status"] for r in rows] == ["oom", "oom"]
    assert all(r["message"].startswith("OutOfMemoryError: CUDA out of memory.") for r in rows)
    assert all(math.isnan(r["max_abs_err"]) for r in rows)
    ATTENTION.frame(rows)


def test_run_reference_failure_marks_every_impl(env, device, monkeypatch):
    from kernels.attention import reference

    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 GiB")

    monkeypatch.setattr(reference, "reference_attention", no_memory)
    lines: list[str] = []
    rows = run_shard(_spec(seqlens=[17, 33], seqlen_k=[17, 33]), env, device=device, log_line=lines.append)
    assert len(rows) == 4 and len(lines) == 4
    assert [r["status"] for r in rows] == ["oom"] * 4
    assert all(r["message"].startswith("inputs/reference: OutOfMemoryError:") for r in rows)
    assert [r["impl"] for r in rows] == ["ours-fa2", "naive"] * 2
    ATTENTION.frame(rows)


def test_run_rows_survive_a_round_trip(env, device, tmp_path):
    rows = run_shard(_spec(seqlens=[17], seqlen_k=[33]), env, device=device, log_line=lambda line: None)
    ATTENTION.write_rows(rows, tmp_path / "shard.csv")
    back = ATTENTION.read_rows([tmp_path / "shard.csv"])
    assert back["status"].tolist() == ["ok", "ok"]
    assert back["max_abs_err"].tolist() == pytest.approx([r["max_abs_err"] for r in rows], rel=1e-12)
    assert isinstance(back, pd.DataFrame) and list(back.columns) == list(ATTENTION.columns)
