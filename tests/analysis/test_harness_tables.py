"""The harness's failure statuses, progress and telemetry; the tidy tables; the attention experiment end to end.

The experiment runs its ``interpreter-check`` kind here: tiny shapes through Triton's interpreter on the
CPU (``tests/conftest.py`` sets ``TRITON_INTERPRET``), correctness only, nothing timed.
"""

from __future__ import annotations

import math
import re
import time

import pandas as pd
import pytest
import torch

from analysis.core import harness, tables
from analysis.core.provenance import ROW_FIELDS, nvml_gpu
from analysis.experiments import attention as experiment
from kernels.attention.fa2 import FA2Config

HAS_CUDA = torch.cuda.is_available()
cpu_only = pytest.mark.skipif(HAS_CUDA, reason="asserts what SDPA backends do on a CPU; a CUDA GPU is present")

NO_VIABLE_BACKEND = (
    "No viable backend for scaled_dot_product_attention was found. "
    "This is likely due to turning off both the math kernel and the fused kernels."
)


# ---------------------------------------------------------------------------------------------------
# harness.classify
# ---------------------------------------------------------------------------------------------------


def _out_of_resources():
    from triton.runtime.errors import OutOfResources

    return OutOfResources(262144, 232448, "shared memory")


@pytest.mark.parametrize(
    "make_exc, status, prefix",
    [
        pytest.param(
            lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has ..."),
            "oom",
            "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
            id="torch-oom",
        ),
        pytest.param(
            lambda: RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be reported later"),
            "oom",
            "RuntimeError: CUDA error: out of memory",
            id="runtime-out-of-memory",
        ),
        pytest.param(
            lambda: RuntimeError("Triton Error [CUDA]: Out Of Memory"),
            "oom",
            "RuntimeError: Triton Error",
            id="runtime-out-of-memory-capitalised",
        ),
        pytest.param(
            lambda: RuntimeError("out of resource: shared memory, Required: 262144, Hardware limit: 232448"),
            "error",
            "RuntimeError: out of resource: shared memory",
            id="runtime-shared-memory",
        ),
        pytest.param(
            lambda: RuntimeError("out of memory: shared memory exceeds the limit"),
            "error",
            "RuntimeError: out of memory: shared memory",
            id="runtime-shared-memory-out-of-memory",
        ),
        pytest.param(_out_of_resources, "error", "OutOfResources: out of resource: shared memory", id="triton-smem"),
        pytest.param(
            lambda: ValueError("head_dim 300 is not supported"), "unsupported", "ValueError: head_dim", id="value-error"
        ),
        pytest.param(lambda: TypeError("bfloat16 needs sm80"), "unsupported", "TypeError: bfloat16", id="type-error"),
        pytest.param(
            lambda: NotImplementedError("no backward pass"), "unsupported", "NotImplementedError: no", id="not-impl"
        ),
        pytest.param(
            lambda: RuntimeError("No available kernel. Aborting execution."),
            "unsupported",
            "RuntimeError: No available kernel. Aborting execution.",
            id="sdpa-no-available-kernel",
        ),
        pytest.param(lambda: RuntimeError("illegal memory access"), "error", "RuntimeError: illegal", id="runtime"),
        pytest.param(lambda: KeyError("BLOCK_M"), "error", "KeyError: 'BLOCK_M'", id="key-error"),
        pytest.param(lambda: ZeroDivisionError("division by zero"), "error", "ZeroDivisionError: div", id="zero-div"),
        pytest.param(lambda: RuntimeError(""), "error", "RuntimeError: ", id="empty-message"),
    ],
)
def test_classify(make_exc, status, prefix):
    got_status, message = harness.classify(make_exc())
    assert got_status == status
    assert message.startswith(prefix)


def test_classify_sdpa_cpu_refusal_is_unsupported():
    assert harness.classify(RuntimeError(NO_VIABLE_BACKEND))[0] == "unsupported"


def test_classify_message_first_line_only():
    _, message = harness.classify(ValueError("\n  first line\nsecond line\nthird"))
    assert message == "ValueError: first line"


@pytest.mark.parametrize(
    "exc",
    [
        pytest.param(ValueError("x" * 1000), id="value-error"),
        pytest.param(torch.OutOfMemoryError("CUDA out of memory. " + "y" * 1000), id="oom"),
    ],
)
def test_classify_truncates(exc):
    _, message = harness.classify(exc)
    assert len(message) == 300
    assert message.startswith(type(exc).__name__ + ": ")


@pytest.mark.parametrize(
    "exc, expected",
    [
        pytest.param(torch.OutOfMemoryError("anything"), True, id="torch-oom-any-text"),
        pytest.param(RuntimeError("CUDA out of memory"), True, id="text"),
        pytest.param(RuntimeError("out of memory (shared memory)"), False, id="shared-memory"),
        pytest.param(MemoryError(), False, id="host-memory-error-no-text"),
        pytest.param(RuntimeError("memory"), False, id="memory-word"),
    ],
)
def test_is_oom(exc, expected):
    assert harness.is_oom(exc) is expected


# ---------------------------------------------------------------------------------------------------
# Progress, telemetry, GPU-only measurement helpers
# ---------------------------------------------------------------------------------------------------


def test_progress_lines():
    lines: list[str] = []
    progress = harness.Progress(3, lines.append)
    progress.step("ours-fa2 N=1024", "ok 120.5 TFLOP/s")
    progress.step("naive N=1024", "oom")
    progress.step("sdpa-flash N=1024", "unsupported")
    assert len(lines) == 3
    assert re.fullmatch(r"\[1/3\] ours-fa2 N=1024: ok 120\.5 TFLOP/s \(\d+\.\d s\)", lines[0])
    assert re.fullmatch(r"\[2/3\] naive N=1024: oom \(\d+\.\d s\)", lines[1])
    assert lines[2].startswith("[3/3] sdpa-flash N=1024: unsupported (")
    assert progress.done == 3


@pytest.mark.skipif(nvml_gpu() is not None, reason="NVML sees a GPU here; this checks the no-GPU fallback")
def test_telemetry_without_nvml_is_nan():
    with harness.Telemetry(interval_s=0.001) as tel:
        torch.ones(16).sum()
    summary = tel.summary()
    assert set(summary) == set(harness.Telemetry.FIELDS)
    assert all(math.isnan(x) for x in summary.values())
    assert tel.samples == []


def test_telemetry_summary_from_samples():
    tel = harness.Telemetry.__new__(harness.Telemetry)  # no NVML needed to summarise samples
    tel.samples = [(1500.0, 2600.0, 50.0, 300.0), (1700.0, 2600.0, 55.0, 500.0)]
    assert tel.summary() == {"sm_clock_mhz": 1600.0, "mem_clock_mhz": 2600.0, "temp_c": 55.0, "power_w": 400.0}


@pytest.mark.gpu
def test_time_gpu_quantiles_ordered():
    x = torch.randn(1024, 1024, device="cuda")
    timing = harness.time_gpu(lambda: x @ x, warmup_ms=5, rep_ms=20)
    assert 0 < timing.ms_p20 <= timing.ms_median <= timing.ms_p80


@pytest.mark.gpu
def test_time_gpu_leaves_out_the_host_side():
    """A call that spends 50 µs on the host before launching a few µs of GPU work is timed at the GPU work
    (the GPU-side wait before each start event covers the host side), and far below the host time."""
    x = torch.zeros(1024, device="cuda")

    def call():
        t = time.perf_counter()
        while time.perf_counter() - t < 50e-6:
            pass
        x.add_(1.0)

    assert harness.time_gpu(call, warmup_ms=2, rep_ms=10).ms_median < 0.02


@pytest.mark.gpu
def test_host_ms_is_what_the_gpu_time_leaves_out():
    """The same call: 50 µs on the host, a few µs on the GPU; host_ms sees the 50 µs. A call that
    synchronises pays the GPU work before it on the host too."""
    x = torch.zeros(1024, device="cuda")

    def call():
        t = time.perf_counter()
        while time.perf_counter() - t < 50e-6:
            pass
        x.add_(1.0)

    timing = harness.time_gpu(call, warmup_ms=2, rep_ms=10)
    assert 0.05 <= timing.host_ms < 1.0 and timing.host_ms > 2 * timing.ms_median
    a = torch.randn(4096, 4096, device="cuda")

    def synchronising():
        a @ a
        return (a[0, 0] > 0).item()  # a host synchronisation: waits for the product

    product = harness.time_gpu(lambda: a @ a, warmup_ms=2, rep_ms=10)
    assert harness.host_time(synchronising) >= 0.8 * product.ms_median
    metrics = harness.measure(lambda: a @ a, warmup_ms=2, rep_ms=10)
    assert 0 < metrics["host_ms"] < metrics["ms_median"]  # launching a 4096³ product is quick


@pytest.mark.gpu
def test_peak_extra_memory_counts_the_call():
    mib = harness.peak_extra_memory_mib(lambda: torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda"))
    assert 64.0 <= mib < 80.0


# ---------------------------------------------------------------------------------------------------
# analysis.tables
# ---------------------------------------------------------------------------------------------------


def _row(**overrides) -> dict:
    row = dict.fromkeys(tables.COLUMNS, math.nan)
    row.update(
        experiment="memory",
        family="attention",
        op="attention",
        impl="ours-fa2",
        dtype="float16",
        mode="fwd",
        inputs="normal",
        batch=1,
        heads=16,
        heads_kv=16,
        seqlen_q=1024,
        seqlen_k=1024,
        head_dim=64,
        causal=True,
        status="ok",
        message="",
        timed=True,
        ms_median=1.25,
        ms_p20=1.125,
        ms_p80=1.5,
        tflops=55.5,
        max_abs_err=0.000244140625,
        err_bound=0.001953125,
        gpu_name="NVIDIA H200",
        gpu="h200",
        torch="2.11.0",
        git_sha="abc123",
        kernel_config="BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=3",
    )
    row.update(overrides)
    return row


def test_to_frame_columns_in_schema_order():
    df = tables.to_frame([{"status": "ok", "impl": "naive"}, _row()])
    assert list(df.columns) == tables.COLUMNS
    assert df.loc[0, "impl"] == "naive" and math.isnan(df.loc[0, "ms_median"])
    assert df.loc[1, "ms_median"] == 1.25


def test_to_frame_rejects_unknown_columns():
    with pytest.raises(ValueError, match=r"outside the result schema: \['speedup'\]"):
        tables.to_frame([_row(speedup=2.0)])


@pytest.mark.parametrize(
    "status",
    [pytest.param("fine", id="unknown"), pytest.param("OK", id="upper-case"), pytest.param(None, id="none")],
)
def test_to_frame_rejects_bad_status(status):
    with pytest.raises(ValueError, match="row status must be one of"):
        tables.to_frame([_row(), _row(status=status)])


def test_to_frame_rejects_missing_status():
    row = _row()
    del row["status"]
    with pytest.raises(ValueError, match="row status must be one of"):
        tables.to_frame([row])


def test_write_read_round_trip(tmp_path):
    rows = [
        _row(),
        _row(
            impl="naive",
            status="oom",
            message="OutOfMemoryError: CUDA out of memory.",
            causal=False,
            ms_median=math.nan,
            ms_p20=math.nan,
            ms_p80=math.nan,
            tflops=math.nan,
            kernel_config="",
        ),
        _row(impl="sdpa-flash", status="unsupported", message="RuntimeError: No available kernel.", seqlen_q=4096),
    ]
    path = tmp_path / "nested" / "dir" / "shard.csv"
    written = tables.write_rows(rows, path)
    assert path.exists()
    assert sorted(p.name for p in path.parent.iterdir()) == ["shard.csv"]  # no .tmp left behind
    back = tables.read_rows([path])
    assert list(back.columns) == tables.COLUMNS
    assert list(written.columns) == tables.COLUMNS
    assert len(back) == 3
    assert back["impl"].tolist() == ["ours-fa2", "naive", "sdpa-flash"]
    assert back["status"].tolist() == ["ok", "oom", "unsupported"]
    assert back["seqlen_q"].tolist() == [1024, 1024, 4096]
    assert back["causal"].tolist() == [True, False, True]
    assert back["timed"].tolist() == [True, True, True]
    assert back.loc[0, "ms_median"] == 1.25 and math.isnan(back.loc[1, "ms_median"])
    assert back.loc[0, "max_abs_err"] == 0.000244140625
    assert back.loc[1, "message"] == "OutOfMemoryError: CUDA out of memory."
    assert back.loc[0, "kernel_config"] == "BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=3"
    assert back.loc[0, "gpu"] == "h200"


def test_write_rows_replaces_existing_file(tmp_path):
    path = tmp_path / "shard.csv"
    tables.write_rows([_row(), _row()], path)
    tables.write_rows([_row(impl="naive")], path)
    back = tables.read_rows([path])
    assert back["impl"].tolist() == ["naive"]
    assert [p.name for p in tmp_path.iterdir()] == ["shard.csv"]


def test_read_rows_concatenates_in_order(tmp_path):
    tables.write_rows([_row(seqlen_q=1)], tmp_path / "a.csv")
    tables.write_rows([], tmp_path / "empty.csv")
    tables.write_rows([_row(seqlen_q=2), _row(seqlen_q=3)], tmp_path / "b.csv")
    back = tables.read_rows([tmp_path / "a.csv", tmp_path / "empty.csv", tmp_path / "b.csv"])
    assert back["seqlen_q"].tolist() == [1, 2, 3]
    assert list(back.index) == [0, 1, 2]


def test_read_rows_of_nothing_has_the_schema(tmp_path):
    assert list(tables.read_rows([]).columns) == tables.COLUMNS
    tables.write_rows([], tmp_path / "empty.csv")
    back = tables.read_rows([tmp_path / "empty.csv"])
    assert len(back) == 0 and list(back.columns) == tables.COLUMNS


def test_read_rows_missing_column(tmp_path):
    path = tmp_path / "old.csv"
    tables.to_frame([_row()]).drop(columns=["tflops", "kernel_config"]).to_csv(path, index=False)
    missing = r"old.csv, line 1: required columns \['tflops', 'kernel_config'\] are missing"
    with pytest.raises(ValueError, match=missing):
        tables.read_rows([path])


def test_read_rows_refuses_extra_columns(tmp_path):
    """A column outside the schema is an error, not dropped: nothing in a table is passed over silently."""
    path = tmp_path / "extra.csv"
    tables.to_frame([_row()]).assign(note="hand-added").to_csv(path, index=False)
    with pytest.raises(ValueError, match=r"extra.csv, line 1: columns \['note'\] are not in the schema"):
        tables.read_rows([path])


# ---------------------------------------------------------------------------------------------------
# analysis.experiments.attention
# ---------------------------------------------------------------------------------------------------


def _spec(**overrides) -> experiment.Spec:
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
    return experiment.Spec(**fields)


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
    spec = experiment.Spec(dtype="float16", causal=False, impls=["ours-fa2"], **fields)
    assert spec.shape(index) == expected


def test_spec_shape_hidden_not_multiple_of_head_dim():
    spec = experiment.Spec(
        experiment="fa2-setting", dtype="float16", head_dim=96, causal=False, seqlens=[1024], impls=["naive"]
    )
    with pytest.raises(ValueError, match="hidden 2048 is not a multiple of head_dim 96"):
        spec.shape(0)


def test_unknown_implementation():
    with pytest.raises(ValueError, match="unknown implementation 'flash3'"):
        experiment.implementation("flash3")


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
    rows = experiment.run(spec, env, device=device, log_line=lines.append)

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
    df = tables.to_frame(rows)
    assert list(df.columns) == tables.COLUMNS and len(df) == 4


@cpu_only
def test_run_sdpa_backends_on_cpu(env):
    """What SDPA's pinned backends do on a CPU, row by row, without the run raising.

    PyTorch ships a CPU flash-attention kernel, so ``sdpa-flash`` (and ``sdpa-math``) run and pass the
    gate; ``efficient`` and ``cudnn`` have no CPU kernel and are refused with "No viable backend",
    which ``classify`` files as ``unsupported``.
    """
    spec = _spec(impls=["sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math"], seqlens=[33], seqlen_k=[97])
    rows = experiment.run(spec, env, device="cpu", log_line=lambda line: None)
    by_impl = {r["impl"]: r for r in rows}
    assert list(by_impl) == spec.impls
    for impl in ("sdpa-flash", "sdpa-math"):
        assert by_impl[impl]["status"] == "ok", by_impl[impl]["message"]
        assert by_impl[impl]["max_abs_err"] <= by_impl[impl]["err_bound"]
    for impl in ("sdpa-efficient", "sdpa-cudnn"):
        assert by_impl[impl]["status"] == "unsupported"
        assert by_impl[impl]["message"] == f"RuntimeError: {NO_VIABLE_BACKEND}"
        assert math.isnan(by_impl[impl]["max_abs_err"])
    tables.to_frame(rows)


def test_run_gate_records_mismatch(env, device, monkeypatch):
    from kernels.attention import reference

    def broken(name):
        return lambda q, k, v, causal: reference.naive_attention(q, k, v, causal) + 0.1

    monkeypatch.setattr(experiment, "implementation", broken)
    rows = experiment.run(
        _spec(impls=["naive"], seqlens=[33], seqlen_k=[33]), env, device=device, log_line=lambda line: None
    )
    assert len(rows) == 1
    row = rows[0]
    assert row["status"] == "mismatch"
    assert "max-abs" in row["message"] and row["message"].startswith("naive output")
    assert row["max_abs_err"] > row["err_bound"]
    assert row["max_abs_err"] == pytest.approx(0.1, abs=2e-3)
    assert math.isnan(row["ms_median"])
    tables.to_frame(rows)


def test_run_records_oom_instead_of_raising(env, device, monkeypatch):
    def exhausted(name):
        def fn(q, k, v, causal):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")

        return fn

    monkeypatch.setattr(experiment, "implementation", exhausted)
    rows = experiment.run(
        _spec(impls=["naive", "ours-fa2"], seqlens=[17], seqlen_k=[17]), env, device=device, log_line=lambda line: None
    )
    assert [r["status"] for r in rows] == ["oom", "oom"]
    assert all(r["message"].startswith("OutOfMemoryError: CUDA out of memory.") for r in rows)
    assert all(math.isnan(r["max_abs_err"]) for r in rows)
    tables.to_frame(rows)


def test_run_reference_failure_marks_every_impl(env, device, monkeypatch):
    from kernels.attention import reference

    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 GiB")

    monkeypatch.setattr(reference, "reference_attention", no_memory)
    lines: list[str] = []
    rows = experiment.run(_spec(seqlens=[17, 33], seqlen_k=[17, 33]), env, device=device, log_line=lines.append)
    assert len(rows) == 4 and len(lines) == 4
    assert [r["status"] for r in rows] == ["oom"] * 4
    assert all(r["message"].startswith("inputs/reference: OutOfMemoryError:") for r in rows)
    assert [r["impl"] for r in rows] == ["ours-fa2", "naive"] * 2
    tables.to_frame(rows)


def test_run_rows_survive_a_round_trip(env, device, tmp_path):
    rows = experiment.run(_spec(seqlens=[17], seqlen_k=[33]), env, device=device, log_line=lambda line: None)
    tables.write_rows(rows, tmp_path / "shard.csv")
    back = tables.read_rows([tmp_path / "shard.csv"])
    assert back["status"].tolist() == ["ok", "ok"]
    assert back["max_abs_err"].tolist() == pytest.approx([r["max_abs_err"] for r in rows], rel=1e-12)
    assert isinstance(back, pd.DataFrame) and list(back.columns) == tables.COLUMNS


def test_read_rows_of_an_older_table_without_the_optional_columns(tmp_path):
    """Tables written before the OPTIONAL columns existed still load, with those as NaN (inputs: normal)."""
    old = tmp_path / "old.csv"
    tables.to_frame([_row()]).drop(columns=tables.OPTIONAL).to_csv(old, index=False)
    new = tmp_path / "new.csv"
    tables.write_rows([_row(experiment="decode", model_bytes=4096.0, gbps=2.0)], new)
    back = tables.read_rows([old, new])
    assert list(back.columns) == tables.COLUMNS
    numeric = [c for c in tables.OPTIONAL if c not in tables.OPTIONAL_DEFAULTS]
    assert back[numeric].iloc[0].isna().all()
    assert back.loc[0, "inputs"] == "normal"
    assert (back.loc[1, "model_bytes"], back.loc[1, "gbps"]) == (4096.0, 2.0)


def test_shipped_reference_table_still_loads():
    from pathlib import Path

    shipped = Path(__file__).resolve().parents[2] / "reports" / "reference" / "h200" / "attention.csv"
    back = tables.read_rows([shipped])
    assert len(back) > 0 and list(back.columns) == tables.COLUMNS
    # bandwidth is a decoding measure: NaN on every other experiment's rows
    assert back.loc[back["experiment"] != "decode", "gbps"].isna().all()


def test_result_schema_describes_every_column():
    from pathlib import Path

    import yaml

    schema = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "result.schema.yaml").read_text()
    )
    assert list(schema["properties"]) == tables.COLUMNS
    assert set(schema["required"]) == set(tables.COLUMNS) - set(tables.OPTIONAL)
    assert all(p.get("description") for p in schema["properties"].values())
    assert schema["properties"]["status"]["enum"] == list(tables.STATUSES)
