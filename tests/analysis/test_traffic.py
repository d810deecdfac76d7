"""DRAM-traffic experiment: ncu CSV parsing, splitting at markers, models, the run's failure paths, the profiled
program on the CPU, the figures, and the workflow's plan. Everything runs without a GPU or ncu: the CSV is a
fixture in ncu's format, and ``ncu`` itself is a fake script on PATH where a run needs one."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import matplotlib
import pandas as pd
import pytest

matplotlib.use("Agg")

# Lets the file run on its own (pytest puts only tests/analysis/ on sys.path).
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from snakemake_helpers import job_counts, snakemake  # noqa: E402

from analysis import traffic, traffic_figures  # noqa: E402
from analysis.core import models  # noqa: E402

B, H = 1, 16
N, D = 1024, 64
ENV = {"gpu_name": "NVIDIA H200", "gpu": "h200", "driver": "580.1", "cuda": "13.0", "torch": "2.11.0",
       "triton": "3.6.0", "git_sha": "abc1234", "python": "3.12.3"}  # fmt: skip
L2 = 50 * 2**20
OURS_CFG = "BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=3"

HEADER = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
    '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
)
GEMM = "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
SOFTMAX = (
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::Half, float, c10::Half, "
    "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(T4 *, const T2 *, int)"
)
FLASH = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false>>(Flash_fwd_params)"


def _metric_lines(kid: int, name: str, read: tuple[str, str], write: tuple[str, str], time: tuple[str, str]):
    pre = f'"{kid}","41877","python3.12","127.0.0.1","{name}","1","7","(128, 1, 1)","(8, 16, 1)","0","9.0",'
    sec = '"Command line profiler metrics",'
    return [
        pre + sec + f'"dram__bytes_read.sum","{read[0]}","{read[1]}"',
        pre + sec + f'"dram__bytes_write.sum","{write[0]}","{write[1]}"',
        pre + sec + f'"gpu__time_duration.sum","{time[0]}","{time[1]}"',
    ]


def _marker(kid: int):
    return _metric_lines(kid, "_traffic_point_marker", ("byte", "0"), ("byte", "32"), ("nsecond", "2,208"))


# Points of the fixture, in the order the target ran them: naive (three kernels), sdpa-flash (one), sdpa-cudnn
# (refused before its marker), ours (one), naive at a larger N (out of memory after its marker and one kernel).
SIDECAR = {
    "device": "NVIDIA H200",
    "l2_cache_bytes": L2,
    "points": [
        {"experiment": "traffic-scaling", "impl": "naive", "seqlen": N, "marked": True, "status": "ok"},
        {"experiment": "traffic-scaling", "impl": "sdpa-flash", "seqlen": N, "marked": True, "status": "ok"},
        {"experiment": "traffic-scaling", "impl": "sdpa-cudnn", "seqlen": N, "marked": False,
         "status": "unsupported", "message": "RuntimeError: No available kernel. Aborting execution."},
        {"experiment": "traffic-scaling", "impl": "ours-fa2", "seqlen": N, "marked": True, "status": "ok",
         "kernel_config": OURS_CFG},
        {"experiment": "traffic-scaling", "impl": "naive", "seqlen": 65536, "marked": True, "status": "oom",
         "message": "OutOfMemoryError: CUDA out of memory."},
    ],
}  # fmt: skip
for _p in SIDECAR["points"]:
    _p.update(dtype="float16", batch=B, heads=H, head_dim=D, causal=False, config=None)
    _p.setdefault("message", "")
    _p.setdefault("kernel_config", "")

NCU_CSV = "\n".join(
    [
        "==PROF== Connected to process 41877 (/usr/bin/python3.12)",
        '==PROF== Profiling "_traffic_point_marker" - 0: 0%....50%....100% - 1 pass',
        f'==PROF== Profiling "{GEMM}" - 1: 0%....50%....100% - 1 pass',
        "some line the profiled program printed, with, commas",
        "==PROF== Disconnected from process 41877",
        HEADER,
        *_marker(0),
        *_metric_lines(1, GEMM, ("Mbyte", "4.19"), ("Mbyte", "33.55"), ("usecond", "12.35")),
        *_metric_lines(2, SOFTMAX, ("Mbyte", "33.55"), ("byte", "33,554,432"), ("usecond", "20.10")),
        *_metric_lines(3, GEMM, ("Kbyte", "35,651.58"), ("Mbyte", "2.10"), ("msecond", "0.01")),
        *_marker(4),
        *_metric_lines(5, FLASH, ("Mbyte", "6.29"), ("Mbyte", "2.10"), ("usecond", "9.50")),
        *_marker(6),
        *_metric_lines(7, "_attn_fwd_kernel", ("Mbyte", "6.30"), ("Mbyte", "2.16"), ("usecond", "8.00")),
        *_marker(8),
        *_metric_lines(9, GEMM, ("Gbyte", "1.07"), ("Gbyte", "8.59"), ("msecond", "1.50")),
    ]
)


# ---- parsing -----------------------------------------------------------------------------------------


def test_numbers_with_thousands_separators_quotes_and_missing_values():
    assert traffic.parse_number('"33,554,432"') == 33554432
    assert traffic.parse_number("2,208") == 2208
    assert traffic.parse_number("35,651.58") == pytest.approx(35651.58)
    assert traffic.parse_number("12.5") == 12.5
    assert math.isnan(traffic.parse_number("n/a"))


def test_a_decimal_comma_is_refused_not_misread():
    with pytest.raises(traffic.NcuOutputError, match="thousands"):
        traffic.parse_number("9,00")


def test_units_convert_to_bytes_and_nanoseconds():
    assert traffic.to_base_unit("dram__bytes_read.sum", "byte", "1,024") == 1024
    assert traffic.to_base_unit("dram__bytes_read.sum", "Kbyte", "2") == 2e3  # ncu's prefixes are decimal
    assert traffic.to_base_unit("dram__bytes_write.sum", "Mbyte", "33.55") == pytest.approx(33.55e6)
    assert traffic.to_base_unit("dram__bytes_write.sum", "Gbyte", "1.5") == pytest.approx(1.5e9)
    assert traffic.to_base_unit("gpu__time_duration.sum", "nsecond", "2,208") == 2208
    assert traffic.to_base_unit("gpu__time_duration.sum", "usecond", "12.35") == pytest.approx(12350)
    assert traffic.to_base_unit("gpu__time_duration.sum", "msecond", "1.5") == pytest.approx(1.5e6)
    with pytest.raises(traffic.NcuOutputError, match="unknown unit"):
        traffic.to_base_unit("dram__bytes_read.sum", "sector", "3")


def test_parse_skips_preamble_and_program_output_and_groups_metrics_by_kernel():
    kernels = traffic.parse_ncu_csv(NCU_CSV)
    assert [k.id for k in kernels] == list(range(10))
    assert [traffic.is_marker(k) for k in kernels].count(True) == 4
    softmax = kernels[2]
    assert softmax.name == SOFTMAX  # commas inside the quoted name survive
    assert softmax.values == {
        "dram_read_bytes": pytest.approx(33.55e6),
        "dram_write_bytes": 33554432,
        "gpu_time_ns": pytest.approx(20100),
    }
    assert kernels[3].values["dram_read_bytes"] == pytest.approx(35651.58e3)
    assert kernels[3].values["gpu_time_ns"] == pytest.approx(1e4)


def test_parse_reads_the_raw_page_too():
    text = "\n".join(
        [
            "==PROF== Connected to process 7",
            '"ID","Kernel Name","dram__bytes_read.sum","dram__bytes_write.sum","gpu__time_duration.sum"',
            '"","","Mbyte","byte","usecond"',
            '"0","_traffic_point_marker","0","32","2.1"',
            '"1","_attn_fwd_kernel","6.30","2,162,688","8"',
        ]
    )
    kernels = traffic.parse_ncu_csv(text)
    assert [k.name for k in kernels] == ["_traffic_point_marker", "_attn_fwd_kernel"]
    assert kernels[1].values == {"dram_read_bytes": pytest.approx(6.3e6), "dram_write_bytes": 2162688,
                                 "gpu_time_ns": pytest.approx(8000)}  # fmt: skip


def test_no_table_means_no_kernels():
    assert traffic.parse_ncu_csv("==PROF== Connected\n==ERROR== ERR_NVGPUCTRPERM\n") == []


def test_split_at_markers_drops_the_markers():
    before, segments = traffic.split_points(traffic.parse_ncu_csv(NCU_CSV))
    assert before == []
    assert [[k.id for k in seg] for seg in segments] == [[1, 2, 3], [5], [7], [9]]


# ---- rows and models ---------------------------------------------------------------------------------


def _assembled():
    return traffic.assemble(SIDECAR, traffic.parse_ncu_csv(NCU_CSV), ENV)


def test_assemble_gives_one_row_per_kernel_and_one_per_failed_point():
    rows = _assembled()
    df = traffic.to_frame(rows)
    assert list(df.columns) == traffic.COLUMNS
    assert len(df) == 3 + 1 + 1 + 1 + 1
    assert list(df["impl"]) == ["naive"] * 3 + ["sdpa-flash", "sdpa-cudnn", "ours-fa2", "naive"]
    assert list(df["status"]) == ["ok"] * 4 + ["unsupported", "ok", "oom"]
    naive = df[(df["impl"] == "naive") & (df["status"] == "ok")]
    assert list(naive["kernel_index"]) == [0, 1, 2]
    assert list(naive["kernel_role"]) == ["qk", "softmax", "pv"]
    assert not df["kernel"].str.contains("_traffic_point_marker").any()
    # the out-of-memory point's marker segment (one GEMM) is not attributed to anything
    oom = df[df["status"] == "oom"].iloc[0]
    assert oom["kernel"] == "" and math.isnan(oom["dram_read_bytes"]) and "out of memory" in oom["message"]
    assert df["gpu"].eq("h200").all() and df["git_sha"].eq("abc1234").all() and df["timestamp"].ne("").all()


def test_models_are_attached_per_point_and_per_naive_kernel():
    df = traffic.to_frame(_assembled())
    naive = df[(df["impl"] == "naive") & (df["status"] == "ok")]
    total = models.standard_attention_total_bytes(N, D, B, H, 2)
    assert total == 2 * B * H * (4 * N * N + 4 * N * D)  # 8N² + 8Nd bytes per head in fp16
    assert (naive["model_bytes"] == total).all()
    parts = models.standard_attention_bytes(N, D, B, H, 2)
    assert list(naive["model_kernel_bytes"]) == [parts["qk"], parts["softmax"], parts["pv"]]
    flash = df[df["impl"] == "sdpa-flash"].iloc[0]
    assert flash["model_bytes"] == models.minimum_attention_bytes(N, D, B, H, 2) == 2 * B * H * 4 * N * D
    assert math.isnan(flash["model_bytes_nocache"])
    ours = df[df["impl"] == "ours-fa2"].iloc[0]
    assert (ours["block_m"], ours["block_n"], ours["num_warps"], ours["num_stages"]) == (128, 64, 8, 3)
    assert ours["model_bytes_nocache"] == models.fa2_forward_bytes(N, D, 128, B, H, 2)
    assert ours["model_bytes"] == models.minimum_attention_bytes(N, D, B, H, 2)


def test_l2_resident_follows_the_size_of_the_n_by_n_tensor():
    df = traffic.to_frame(_assembled())
    # 16 heads × 1024² × 2 B = 32 MiB fits a 50 MiB L2; at N = 65536 it does not
    assert df.loc[df["seqlen"] == N, "l2_resident"].eq(True).all()
    assert df.loc[df["seqlen"] == 65536, "l2_resident"].eq(False).all()
    assert (df["l2_cache_bytes"] == L2).all()


def test_causal_points_get_no_model():
    point = dict(SIDECAR["points"][0], causal=True)
    assert all(math.isnan(v) for v in traffic.point_models(point).values())


def test_a_marker_count_that_does_not_match_the_sidecar_is_an_error():
    kernels = [k for k in traffic.parse_ncu_csv(NCU_CSV) if k.id != 8]  # the oom point's marker is lost
    with pytest.raises(traffic.NcuOutputError, match="3 point markers but the target marked 4"):
        traffic.assemble(SIDECAR, kernels, ENV)


def test_a_kernel_without_a_value_is_an_error_row():
    text = NCU_CSV.replace('"dram__bytes_write.sum","Mbyte","2.10"', '"dram__bytes_write.sum","Mbyte","n/a"', 1)
    df = traffic.to_frame(traffic.assemble(SIDECAR, traffic.parse_ncu_csv(text), ENV))
    bad = df[df["status"] == "error"]
    assert len(bad) == 1 and "dram_write_bytes" in bad.iloc[0]["message"]


# ---- spec --------------------------------------------------------------------------------------------

SWEEP = [
    f"BLOCK_M={m},BLOCK_N={n},num_warps={4 if m == 64 else 8},num_stages=2" for m in (64, 128) for n in (32, 64, 128)
]


def _spec(**kw) -> traffic.Spec:
    fields = dict(impls=["naive", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "ours-fa2"],
                  seqlens=[1024, 2048, 4096, 8192, 16384], head_dims=[64, 128],
                  block_sweep={"seqlen": 4096, "head_dims": [128], "configs": SWEEP})  # fmt: skip
    fields.update(kw)
    return traffic.Spec(**fields)


def test_spec_plans_the_grid_then_the_block_sweep():
    points = _spec().points()
    assert len(points) == 5 * 5 * 2 + 6
    grid = [p for p in points if p["experiment"] == "traffic-scaling"]
    assert {p["config"] for p in grid} == {None}  # our kernel autotunes in the grid unless pinned
    sweep = [p for p in points if p["experiment"] == "traffic-blocks"]
    assert [p["config"] for p in sweep] == SWEEP
    assert {(p["impl"], p["seqlen"], p["head_dim"]) for p in sweep} == {("ours-fa2", 4096, 128)}
    pinned = _spec(fa2_config=OURS_CFG).points()
    assert {p["config"] for p in pinned if p["impl"] == "ours-fa2" and p["experiment"] == "traffic-scaling"} == {
        OURS_CFG
    }
    assert all(p["experiment"] == "traffic-scaling" for p in _spec(block_sweep={}).points())
    assert {p["batch"] for p in sweep} == {1}  # the grid's batch unless the sweep names its own
    bigger = _spec(block_sweep={"seqlen": 8192, "batch": 4, "configs": SWEEP}).points()
    assert {p["batch"] for p in bigger if p["experiment"] == "traffic-blocks"} == {4}
    assert {p["batch"] for p in bigger if p["experiment"] == "traffic-scaling"} == {1}


def test_spec_refuses_what_the_profiled_program_would_fail_on():
    with pytest.raises(ValueError, match="unknown implementations"):
        _spec(impls=["flash-9"])
    with pytest.raises(ValueError, match="cannot parse"):
        _spec(block_sweep={"seqlen": 4096, "configs": ["BLOCK_M=64;BLOCK_N=32"]})
    with pytest.raises(ValueError, match="does not set"):
        _spec(fa2_config="BLOCK_M=64,BLOCK_N=64")
    with pytest.raises(ValueError, match="unknown keys"):
        _spec(block_sweep={"seqlen": 4096, "configs": SWEEP, "batches": 4})


# ---- run: unsupported, errors, a fake ncu ------------------------------------------------------------

SMALL = dict(impls=["naive", "ours-fa2"], seqlens=[1024, 2048], head_dims=[64],
             block_sweep={"seqlen": 1024, "head_dims": [64], "configs": SWEEP[:2]})  # fmt: skip


def test_without_ncu_every_planned_point_is_an_unsupported_row(tmp_path, monkeypatch):
    monkeypatch.setattr(traffic.shutil, "which", lambda name: None)
    out = tmp_path / "h200" / "traffic.csv"
    df = traffic.run(SMALL, ENV, out, tmp_path / "raw")
    assert len(df) == 2 * 2 + 2
    assert set(df["status"]) == {"unsupported"}
    assert df["message"].str.contains("ncu").all()
    back = traffic.read_rows(out)
    assert list(back.columns) == traffic.COLUMNS and len(back) == len(df)
    # the models are a property of the shape and are there even though nothing was measured
    assert back["model_bytes"].notna().all()
    assert "ncu" in (tmp_path / "raw" / "unsupported.txt").read_text()


def test_without_a_gpu_every_planned_point_is_an_unsupported_row(tmp_path, monkeypatch):
    monkeypatch.setattr(traffic.shutil, "which", lambda name: "/usr/local/cuda/bin/ncu")
    monkeypatch.setattr(traffic, "_cuda_available", lambda: False)
    df = traffic.run(SMALL, ENV, tmp_path / "t.csv", tmp_path / "raw")
    assert set(df["status"]) == {"unsupported"} and df["message"].str.contains("GPU").all()


def test_required_traffic_fails_without_ncu(tmp_path, monkeypatch):
    monkeypatch.setattr(traffic.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="ncu"):
        traffic.run({**SMALL, "require": True}, ENV, tmp_path / "t.csv", tmp_path / "raw")
    assert not (tmp_path / "t.csv").exists()


def _fake_ncu(tmp_path: Path, body: str, monkeypatch) -> Path:
    """An executable ``ncu`` first on PATH, running ``body`` (Python) with the real argv."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "ncu"
    exe.write_text(f"#!{sys.executable}\nimport json, sys, time\nfrom pathlib import Path\n" + textwrap.dedent(body))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{__import__('os').environ.get('PATH', '')}")
    monkeypatch.setattr(traffic, "_cuda_available", lambda: True)
    return exe


def test_ncu_failing_gives_error_rows_with_its_message(tmp_path, monkeypatch):
    _fake_ncu(tmp_path, """
        print("==PROF== Connected to process 1")
        print("==ERROR== The application returned an error code (1).", file=sys.stderr)
        print("Traceback: RuntimeError: CUDA driver initialization failed", file=sys.stderr)
        sys.exit(1)
    """, monkeypatch)  # fmt: skip
    df = traffic.run(SMALL, ENV, tmp_path / "t.csv", tmp_path / "raw")
    assert len(df) == 6
    assert set(df["status"]) == {"error"}
    message = df["message"].iloc[0]
    assert "status 1" in message and "CUDA driver initialization failed" in message and "==ERROR==" in message
    assert (tmp_path / "raw" / "ncu_stderr.txt").read_text().count("CUDA driver") == 1
    assert "--profile-from-start off" in (tmp_path / "raw" / "command.txt").read_text()


def test_ncu_that_profiles_nothing_gives_error_rows_naming_the_cause(tmp_path, monkeypatch):
    # e.g. no permission for the performance counters: the program runs, ncu collects no kernel, exits 0
    _fake_ncu(tmp_path, """
        spec, sidecar = Path(sys.argv[-2]), Path(sys.argv[-1])
        points = json.loads(spec.read_text())["points"]
        done = [dict(p, status="ok", message="", marked=True, kernel_config="") for p in points]
        sidecar.write_text(json.dumps({"l2_cache_bytes": 52428800, "points": done}))
        print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
              "Performance Counters on the target device 0.")
    """, monkeypatch)  # fmt: skip
    df = traffic.run(SMALL, ENV, tmp_path / "t.csv", tmp_path / "raw")
    assert set(df["status"]) == {"error"}
    assert df["message"].str.contains("ERR_NVGPUCTRPERM").all()
    assert df["message"].str.contains("0 point markers").all()


def test_ncu_that_hangs_is_stopped_at_the_timeout(tmp_path, monkeypatch):
    _fake_ncu(tmp_path, """
        print("==PROF== Connected to process 1", flush=True)
        time.sleep(60)
    """, monkeypatch)  # fmt: skip
    df = traffic.run({**SMALL, "timeout_s": 1}, ENV, tmp_path / "t.csv", tmp_path / "raw")
    assert set(df["status"]) == {"error"} and df["message"].str.contains("timed out after 1 s").all()


def test_run_end_to_end_with_a_fake_ncu(tmp_path, monkeypatch):
    """The fake plays ncu and the target: it writes the sidecar from the spec it is given and prints a
    CSV with a marker and one kernel per point (three for naive); run() must turn that into rows."""
    _fake_ncu(tmp_path, f"""
        args = sys.argv[1:]
        assert args[:7] == ["--clock-control", "none", "--profile-from-start", "off", "--metrics",
                            "dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum", "--csv"], args
        assert args[-4:-2] == ["-m", "analysis.traffic_target"], args
        spec, sidecar = Path(args[-2]), Path(args[-1])
        points = json.loads(spec.read_text())["points"]
        print('{HEADER}')
        kid, done = 0, []
        for p in points:
            names = ["gemm", "softmax_warp_forward", "gemm"] if p["impl"] == "naive" else ["_attn_fwd_kernel"]
            for name in ["_traffic_point_marker"] + names:
                for metric, unit, value in (("dram__bytes_read.sum", "Mbyte", "1.5"),
                                            ("dram__bytes_write.sum", "byte", "1,000"),
                                            ("gpu__time_duration.sum", "usecond", "2")):
                    print(f'"{{kid}}","1","python","h","{{name}}","1","7","(1,1,1)","(1,1,1)","0","9.0","s",'
                          f'"{{metric}}","{{unit}}","{{value}}"')
                kid += 1
            tuned = p["config"] or "BLOCK_M=128,BLOCK_N=128,num_warps=8,num_stages=3"
            done.append(dict(p, status="ok", message="", marked=True,
                             kernel_config=tuned if p["impl"] == "ours-fa2" else ""))
        sidecar.write_text(json.dumps({{"l2_cache_bytes": 52428800, "points": done}}))
    """, monkeypatch)  # fmt: skip
    df = traffic.run(SMALL, ENV, tmp_path / "t.csv", tmp_path / "raw")
    assert set(df["status"]) == {"ok"}, df["message"].tolist()
    assert len(df) == 2 * 3 + 2 + 2  # naive: three kernels per N; ours: one per N and per sweep config
    assert (df["dram_read_bytes"] == 1.5e6).all() and (df["dram_write_bytes"] == 1000).all()
    assert (df["gpu_time_ns"] == 2000).all()
    sweep = df[df["experiment"] == "traffic-blocks"]
    assert list(sweep["block_n"]) == [32, 64]
    grid_ours = df[(df["experiment"] == "traffic-scaling") & (df["impl"] == "ours-fa2")]
    assert (grid_ours["block_m"] == 128).all()  # the configuration the autotuner chose, from the sidecar
    assert json.loads((tmp_path / "raw" / "spec.json").read_text())["points"][0]["impl"] == "naive"


# ---- the profiled program, on the CPU ----------------------------------------------------------------


TINY_CFG = "BLOCK_M=16,BLOCK_N=16,num_warps=4,num_stages=1"


def test_target_runs_points_marks_them_and_records_failures(tmp_path, monkeypatch):
    import torch

    from analysis import traffic_target

    real = traffic_target._implementation

    def implementation(point):
        if point["impl"] == "sdpa-efficient":

            def oom(q, k, v):
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")

            return oom
        return real(point)

    monkeypatch.setattr(traffic_target, "_implementation", implementation)
    base = dict(experiment="traffic-scaling", dtype="float16", batch=1, heads=2, seqlen=40, head_dim=16, causal=False)
    points = [
        dict(base, impl="naive", config=None),
        dict(base, impl="sdpa-efficient", config=None),
        dict(base, impl="ours-fa2", experiment="traffic-blocks", config=TINY_CFG),
    ]
    sidecar = traffic_target.run_points(points, tmp_path / "sidecar.json", device="cpu")
    assert json.loads((tmp_path / "sidecar.json").read_text()) == sidecar
    got = [(p["impl"], p["status"], p["marked"]) for p in sidecar["points"]]
    assert got == [("naive", "ok", True), ("sdpa-efficient", "oom", False), ("ours-fa2", "ok", True)]
    assert "out of memory" in sidecar["points"][1]["message"]
    assert sidecar["points"][2]["kernel_config"] == TINY_CFG
    assert sidecar["finished"]


def test_the_marker_kernel_has_the_name_the_parser_looks_for():
    from analysis import traffic_target

    assert traffic_target.MARKER_NAME == traffic.MARKER
    assert traffic_target._traffic_point_marker.fn.__name__ == traffic.MARKER


# ---- figures -----------------------------------------------------------------------------------------


def _figure_rows() -> pd.DataFrame:
    """Measured rows built to follow the models: naive = 8N²+8Nd split over three kernels, tiled = 4Nd
    (ours a little more), and a block sweep whose bytes fall as BLOCK_M grows."""
    rows = []
    for d in (64, 128):
        for n in (1024, 2048, 4096):
            for impl in ("naive", "sdpa-flash", "ours-fa2"):
                point = dict(experiment="traffic-scaling", impl=impl, dtype="float16", batch=B, heads=H, seqlen=n,
                             head_dim=d, causal=False, config=OURS_CFG if impl == "ours-fa2" else None)  # fmt: skip
                base = traffic._base_row(point, ENV, L2)
                if impl == "naive":
                    parts = models.standard_attention_bytes(n, d, B, H, 2)
                    for j, role in enumerate(("qk", "softmax", "pv")):
                        rows.append({**base, "kernel": role, "kernel_index": j, "kernel_role": role, "status": "ok",
                                     "dram_read_bytes": parts[role] / 2, "dram_write_bytes": parts[role] / 2,
                                     "gpu_time_ns": 1e4})  # fmt: skip
                else:
                    m = models.minimum_attention_bytes(n, d, B, H, 2) * (1.1 if impl == "ours-fa2" else 1.0)
                    rows.append({**base, "kernel": "k", "kernel_index": 0, "kernel_role": "attention",
                                 "status": "ok", "dram_read_bytes": 0.75 * m, "dram_write_bytes": 0.25 * m,
                                 "gpu_time_ns": 5e3})  # fmt: skip
        for cfg in SWEEP:
            point = dict(experiment="traffic-blocks", impl="ours-fa2", dtype="float16", batch=B, heads=H, seqlen=4096,
                         head_dim=d, causal=False, config=cfg)  # fmt: skip
            base = traffic._base_row(point, ENV, L2)
            rows.append({**base, "kernel": "_attn_fwd_kernel", "kernel_index": 0, "kernel_role": "attention",
                         "status": "ok", "dram_read_bytes": 1e8 / base["block_m"] * 64, "dram_write_bytes": 1.7e7,
                         "gpu_time_ns": 3e5 / base["block_n"] * 64})  # fmt: skip
    failed = dict(experiment="traffic-scaling", impl="sdpa-cudnn", dtype="float16", batch=B, heads=H, seqlen=1024,
                  head_dim=64, causal=False, config=None)  # fmt: skip
    rows += traffic.planned_rows([failed], ENV, "unsupported", "No available kernel")
    return traffic.to_frame(rows)


def test_point_totals_sum_kernels_and_compare_with_the_model(tmp_path):
    path = tmp_path / "traffic.csv"
    traffic.write_rows(_figure_rows().to_dict("records"), path)
    totals = traffic_figures.point_totals(traffic.read_rows(path))  # through a CSV round trip
    naive = totals[totals["impl"] == "naive"]
    assert (naive["n_kernels"] == 3).all()
    assert naive["measured_over_model"].to_numpy() == pytest.approx(1.0)
    flash = totals[(totals["impl"] == "sdpa-flash")]
    assert flash["measured_over_model"].to_numpy() == pytest.approx(1.0)
    assert "sdpa-cudnn" not in set(totals["impl"])  # a point that did not finish has no total


def test_render_all_writes_figures_tables_and_manifest(tmp_path):
    entries = traffic_figures.render_all(_figure_rows(), tmp_path)
    assert [e["name"] for e in entries] == ["traffic_bytes", "traffic_blocks"]
    for e in entries:
        assert e["reason"] is None
        assert Path(e["png"]).stat().st_size > 10_000
        assert Path(e["csv"]).is_file()
    assert json.loads((tmp_path / "manifest.json").read_text()) == entries
    table = pd.read_csv(tmp_path / "traffic_bytes.csv")
    naive = table[table["impl"] == "naive"]
    n, d = naive["seqlen"], naive["head_dim"]
    assert naive["model_standard"].to_numpy() == pytest.approx((B * H * (8 * n * n + 8 * n * d)).to_numpy())
    assert naive["model_standard_6"].to_numpy() == pytest.approx((B * H * (6 * n * n + 8 * n * d)).to_numpy())
    blocks = pd.read_csv(tmp_path / "traffic_blocks.csv")
    assert len(blocks) == 2 * 6
    assert list(blocks.loc[blocks["head_dim"] == 64, "block_m"]) == [64, 64, 64, 128, 128, 128]
    m64 = models.fa2_forward_bytes(4096, 64, 64, B, H, 2)
    assert blocks.loc[(blocks["head_dim"] == 64) & (blocks["block_m"] == 64), "model_bytes_nocache"].eq(m64).all()


def test_render_all_skips_figures_without_ok_rows(tmp_path):
    (tmp_path / "traffic_bytes.png").write_bytes(b"stale")  # from an earlier, fuller run
    df = traffic.to_frame(traffic.planned_rows(_spec().points(), ENV, "unsupported", "ncu is not on PATH"))
    entries = traffic_figures.render_all(df, tmp_path)
    assert all(e["png"] is None and e["reason"] for e in entries)
    assert not (tmp_path / "traffic_bytes.png").exists()
    assert json.loads((tmp_path / "manifest.json").read_text())[0]["reason"].startswith("no ok rows")


# ---- workflow ----------------------------------------------------------------------------------------


def _dry_run(*args) -> subprocess.CompletedProcess:
    return snakemake("-n", "--cores", "1", *args)


def test_dry_run_for_a_named_gpu_plans_the_traffic_job_and_its_figures(tmp_path):
    r = _dry_run("--config", "gpus=[h200]", f"results_dir={tmp_path}", f"report={tmp_path}/report.html")
    assert r.returncode == 0, r.stderr + r.stdout
    counts = job_counts(r.stdout)
    assert counts["hbm_traffic"] == 1
    assert counts["traffic_figures"] == 1
    assert f"{tmp_path}/h200/traffic.csv" in r.stdout
    assert f"{tmp_path}/report/traffic/h200" in r.stdout


def test_dry_run_without_a_gpu_plans_no_traffic_job(tmp_path):
    r = _dry_run("--profile", "workflow/profiles/cpu", "--config", f"results_dir={tmp_path}",
                 f"report={tmp_path}/report.html")  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    assert "hbm_traffic" not in job_counts(r.stdout)


def test_traffic_can_be_switched_off(tmp_path):
    off = tmp_path / "off.yaml"
    off.write_text("gpus: [h200]\nattention:\n  traffic:\n    enabled: false\n")
    r = _dry_run("--configfile", str(off), "--config", f"results_dir={tmp_path}", f"report={tmp_path}/r.html")
    assert r.returncode == 0, r.stderr + r.stdout
    assert "hbm_traffic" not in job_counts(r.stdout)
