"""The traffic family's plan and run: the spec, the run's failure paths (no ncu, no GPU, ncu failing or hanging,
a fake ncu end to end), the profiled program on the CPU, the figures, and the workflow's plan. Everything runs
without a GPU or ncu: ``ncu`` is a fake script on PATH where a run needs one."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import matplotlib
import pandas as pd
import pytest
from figure_helpers import render
from snakemake_helpers import job_counts, snakemake
from traffic_fixture import ENV, HEADER, L2, OURS_CFG, B, H

from analysis import registry
from analysis.core import models
from analysis.families.traffic import figures as traffic_figures
from analysis.families.traffic import plan
from analysis.families.traffic import run as traffic

matplotlib.use("Agg")
TRAFFIC = registry.table("traffic")


def _run(fields: dict, tmp_path: Path) -> pd.DataFrame:
    """The family's run of one shard, its side files in ``tmp_path / "raw"``."""
    return TRAFFIC.frame(traffic.run(plan.spec(fields), ENV, "cuda", lambda s: None, tmp_path / "raw"))


# ---- spec --------------------------------------------------------------------------------------------

SWEEP = [
    f"BLOCK_M={m},BLOCK_N={n},num_warps={4 if m == 64 else 8},num_stages=2" for m in (64, 128) for n in (32, 64, 128)
]


def _spec(**kw) -> plan.Spec:
    fields = dict(
        impls=["naive", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "ours-fa2"],
        seqlens=[1024, 2048, 4096, 8192, 16384],
        head_dims=[64, 128],
        block_sweep={"seqlen": 4096, "head_dims": [128], "configs": SWEEP},
    )
    fields.update(kw)
    return plan.Spec(**fields)


def test_spec_plans_the_grid_then_the_block_sweep():
    points = _spec().planned()
    assert len(points) == 5 * 5 * 2 + 6
    grid = [p for p in points if p["experiment"] == "traffic-scaling"]
    assert {p["config"] for p in grid} == {None}  # our kernel autotunes in the grid unless pinned
    sweep = [p for p in points if p["experiment"] == "traffic-blocks"]
    assert [p["config"] for p in sweep] == SWEEP
    assert {(p["impl"], p["seqlen"], p["head_dim"]) for p in sweep} == {("ours-fa2", 4096, 128)}
    pinned = _spec(fa2_config=OURS_CFG).planned()
    assert {p["config"] for p in pinned if p["impl"] == "ours-fa2" and p["experiment"] == "traffic-scaling"} == {
        OURS_CFG
    }
    assert all(p["experiment"] == "traffic-scaling" for p in _spec(block_sweep={}).planned())
    assert {p["batch"] for p in sweep} == {1}  # the grid's batch unless the sweep names its own
    bigger = _spec(block_sweep={"seqlen": 8192, "batch": 4, "configs": SWEEP}).planned()
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

SMALL = dict(
    impls=["naive", "ours-fa2"],
    seqlens=[1024, 2048],
    head_dims=[64],
    block_sweep={"seqlen": 1024, "head_dims": [64], "configs": SWEEP[:2]},
)


def test_without_ncu_every_planned_point_is_an_unsupported_row(tmp_path, monkeypatch):
    monkeypatch.setattr(traffic.shutil, "which", lambda name: None)
    out = tmp_path / "h200" / "traffic.csv"
    df = TRAFFIC.write_rows(_run(SMALL, tmp_path).to_dict("records"), out)
    assert len(df) == 2 * 2 + 2
    assert set(df["status"]) == {"unsupported"}
    assert df["message"].str.contains("ncu").all()
    back = TRAFFIC.read_rows([out])
    assert list(back.columns) == list(traffic.COLUMNS) and len(back) == len(df)
    # the models are a property of the shape and are there even though nothing was measured
    assert back["model_bytes"].notna().all()
    assert "ncu" in (tmp_path / "raw" / "unsupported.txt").read_text()


def test_without_a_gpu_every_planned_point_is_an_unsupported_row(tmp_path, monkeypatch):
    monkeypatch.setattr(traffic.shutil, "which", lambda name: "/usr/local/cuda/bin/ncu")
    monkeypatch.setattr(traffic, "_cuda_available", lambda: False)
    df = _run(SMALL, tmp_path)
    assert set(df["status"]) == {"unsupported"} and df["message"].str.contains("GPU").all()


def test_required_traffic_fails_without_ncu(tmp_path, monkeypatch):
    monkeypatch.setattr(traffic.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="ncu"):
        _run({**SMALL, "require": True}, tmp_path)


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
    _fake_ncu(
        tmp_path,
        """
        print("==PROF== Connected to process 1")
        print("==ERROR== The application returned an error code (1).", file=sys.stderr)
        print("Traceback: RuntimeError: CUDA driver initialization failed", file=sys.stderr)
        sys.exit(1)
    """,
        monkeypatch,
    )
    df = _run(SMALL, tmp_path)
    assert len(df) == 6
    assert set(df["status"]) == {"error"}
    message = df["message"].iloc[0]
    assert "status 1" in message and "CUDA driver initialization failed" in message and "==ERROR==" in message
    assert (tmp_path / "raw" / "ncu_stderr.txt").read_text().count("CUDA driver") == 1
    assert "--profile-from-start off" in (tmp_path / "raw" / "command.txt").read_text()


def test_ncu_that_profiles_nothing_gives_error_rows_naming_the_cause(tmp_path, monkeypatch):
    # e.g. no permission for the performance counters: the program runs, ncu collects no kernel, exits 0
    _fake_ncu(
        tmp_path,
        """
        spec, sidecar = Path(sys.argv[-2]), Path(sys.argv[-1])
        points = json.loads(spec.read_text())["points"]
        done = [dict(p, status="ok", message="", marked=True, kernel_config="") for p in points]
        sidecar.write_text(json.dumps({"l2_cache_bytes": 52428800, "points": done}))
        print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
              "Performance Counters on the target device 0.")
    """,
        monkeypatch,
    )
    df = _run(SMALL, tmp_path)
    assert set(df["status"]) == {"error"}
    assert df["message"].str.contains("ERR_NVGPUCTRPERM").all()
    assert df["message"].str.contains("0 point markers").all()


def test_ncu_that_hangs_is_stopped_at_the_timeout(tmp_path, monkeypatch):
    _fake_ncu(
        tmp_path,
        """
        print("==PROF== Connected to process 1", flush=True)
        time.sleep(60)
    """,
        monkeypatch,
    )
    df = _run({**SMALL, "timeout_s": 1}, tmp_path)
    assert set(df["status"]) == {"error"} and df["message"].str.contains("timed out after 1 s").all()


def test_run_end_to_end_with_a_fake_ncu(tmp_path, monkeypatch):
    """The fake plays ncu and the target: it writes the sidecar from the spec it is given and prints a
    CSV with a marker and one kernel per point (three for naive); run() must turn that into rows."""
    _fake_ncu(
        tmp_path,
        f"""
        args = sys.argv[1:]
        assert args[:7] == ["--clock-control", "none", "--profile-from-start", "off", "--metrics",
                            "dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum", "--csv"], args
        assert args[-4:-2] == ["-m", "analysis.families.traffic.target"], args
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
    """,
        monkeypatch,
    )
    df = _run(SMALL, tmp_path)
    assert set(df["status"]) == {"ok"}, df["message"].tolist()
    assert len(df) == 2 * 3 + 2 + 2  # naive: three kernels per N; ours: one per N and per sweep config
    assert (df["dram_read_bytes"] == 1.5e6).all() and (df["dram_write_bytes"] == 1000).all()
    assert (df["gpu_time_ns"] == 2000).all()
    sweep = df[df["experiment"] == "traffic-blocks"]
    assert list(sweep["block_n"]) == [32, 64]
    grid_ours = df[(df["experiment"] == "traffic-scaling") & (df["impl"] == "ours-fa2")]
    assert (grid_ours["block_m"] == 128).all()  # the configuration the autotuner chose, from the sidecar
    assert json.loads((tmp_path / "raw" / "spec.json").read_text())["points"][0]["impl"] == "naive"


def test_spec_plans_the_instruction_mix_point_last():
    points = _spec(inst_mix={"seqlen": 8192, "head_dim": 128, "batch": 2}).planned()
    assert points[-1] == dict(
        experiment="traffic-inst-mix",
        impl="ours-fa2",
        seqlen=8192,
        head_dim=128,
        config=None,
        dtype="float16",
        batch=2,
        heads=16,
        causal=False,
    )
    assert [p for p in _spec(inst_mix={"seqlen": 0}).planned() if p["experiment"] == "traffic-inst-mix"] == []
    with pytest.raises(ValueError, match=r"inst_mix has unknown keys \['n'\]"):
        _spec(inst_mix={"n": 1})


MIX_NCU = f"""
    args = sys.argv[1:]
    metrics = args[args.index("--metrics") + 1].split(",")
    mix = "smsp__inst_executed.sum" in metrics
    if mix and "--print-units" not in args:
        sys.exit("the instruction counts must be printed in base units")
    if mix and FAIL_MIX:
        print("==ERROR== Failed to find metric sm__inst_executed_pipe_tensor_op_gmma.sum", file=sys.stderr)
        sys.exit(1)
    spec, sidecar = Path(args[-2]), Path(args[-1])
    points = json.loads(spec.read_text())["points"]
    assert all((p["experiment"] == "traffic-inst-mix") == mix for p in points), points
    print('{HEADER}')
    kid, done = 0, []
    for p in points:
        for name in ["_traffic_point_marker", "_attn_fwd_kernel"]:
            for i, metric in enumerate(metrics):
                unit, value = ("inst", str(1000 * (i + 1))) if mix else ("byte", "1,000")
                if metric == "gpu__time_duration.sum":
                    unit, value = "usecond", "2"
                print(f'"{{kid}}","1","python","h","{{name}}","1","7","(1,1,1)","(1,1,1)","0","9.0","s",'
                      f'"{{metric}}","{{unit}}","{{value}}"')
            kid += 1
        done.append(dict(p, status="ok", message="", marked=True, kernel_config=""))
    sidecar.write_text(json.dumps({{"l2_cache_bytes": 52428800, "points": done}}))
"""


@pytest.mark.parametrize("fail_mix", [False, True], ids=["both-passes", "mix-pass-fails"])
def test_the_instruction_mix_is_a_second_ncu_pass(tmp_path, monkeypatch, fail_mix):
    """Its own metrics in base units, Hopper's wgmma among them, its own side files; when it fails, its rows
    say why and the DRAM rows stand."""
    _fake_ncu(tmp_path, f"\n    FAIL_MIX = {fail_mix}" + MIX_NCU, monkeypatch)
    monkeypatch.setattr(traffic, "_capability", lambda: (9, 0))
    fields = {**SMALL, "impls": ["ours-fa2"], "block_sweep": {}, "inst_mix": {"seqlen": 4096, "head_dim": 64}}
    df = _run(fields, tmp_path)
    dram, mix = df[df["experiment"] != "traffic-inst-mix"], df[df["experiment"] == "traffic-inst-mix"]
    assert len(dram) == 2 and set(dram["status"]) == {"ok"} and dram["inst_executed"].isna().all()
    command = (tmp_path / "raw" / "command-inst-mix.txt").read_text()
    assert "sm__inst_executed_pipe_tensor_op_gmma.sum" in command and "--print-units base" in command
    assert len(mix) == 1
    if fail_mix:
        assert mix["status"].iloc[0] == "error" and "Failed to find metric" in mix["message"].iloc[0]
        return
    row = mix.iloc[0]
    assert row["status"] == "ok" and row["inst_executed"] == 1000 and row["inst_tensor_hmma"] == 2000
    assert row["inst_tensor_gmma"] == 8000  # the last metric asked for, Hopper's
    assert json.loads((tmp_path / "raw" / "spec-inst-mix.json").read_text())["points"][0]["seqlen"] == 4096


def test_instruction_counts_without_base_units_still_convert():
    assert traffic.to_base_unit("smsp__inst_executed.sum", "Minst", "1.5") == 1.5e6
    assert traffic.mix_metrics((8, 0)) == traffic.MIX_METRICS
    assert "sm__inst_executed_pipe_tensor_op_gmma.sum" in traffic.mix_metrics((9, 0))


# ---- the profiled program, on the CPU ----------------------------------------------------------------


TINY_CFG = "BLOCK_M=16,BLOCK_N=16,num_warps=4,num_stages=1"


def test_target_runs_points_marks_them_and_records_failures(tmp_path, monkeypatch):
    import torch

    from analysis.families.traffic import target as traffic_target

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
    from analysis.families.traffic import target as traffic_target

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
                point = dict(
                    experiment="traffic-scaling",
                    impl=impl,
                    dtype="float16",
                    batch=B,
                    heads=H,
                    seqlen=n,
                    head_dim=d,
                    causal=False,
                    config=OURS_CFG if impl == "ours-fa2" else None,
                )
                base = traffic.base_row(point, ENV, L2)
                if impl == "naive":
                    parts = models.standard_attention_bytes(n, d, B, H, 2)
                    for j, role in enumerate(("qk", "softmax", "pv")):
                        rows.append(
                            {
                                **base,
                                "kernel": role,
                                "kernel_index": j,
                                "kernel_role": role,
                                "status": "ok",
                                "dram_read_bytes": parts[role] / 2,
                                "dram_write_bytes": parts[role] / 2,
                                "gpu_time_ns": 1e4,
                            }
                        )
                else:
                    m = models.minimum_attention_bytes(n, d, B, H, 2) * (1.1 if impl == "ours-fa2" else 1.0)
                    rows.append(
                        {
                            **base,
                            "kernel": "k",
                            "kernel_index": 0,
                            "kernel_role": "attention",
                            "status": "ok",
                            "dram_read_bytes": 0.75 * m,
                            "dram_write_bytes": 0.25 * m,
                            "gpu_time_ns": 5e3,
                        }
                    )
        for cfg in SWEEP:
            point = dict(
                experiment="traffic-blocks",
                impl="ours-fa2",
                dtype="float16",
                batch=B,
                heads=H,
                seqlen=4096,
                head_dim=d,
                causal=False,
                config=cfg,
            )
            base = traffic.base_row(point, ENV, L2)
            rows.append(
                {
                    **base,
                    "kernel": "_attn_fwd_kernel",
                    "kernel_index": 0,
                    "kernel_role": "attention",
                    "status": "ok",
                    "dram_read_bytes": 1e8 / base["block_m"] * 64,
                    "dram_write_bytes": 1.7e7,
                    "gpu_time_ns": 3e5 / base["block_n"] * 64,
                }
            )
    failed = dict(
        experiment="traffic-scaling",
        impl="sdpa-cudnn",
        dtype="float16",
        batch=B,
        heads=H,
        seqlen=1024,
        head_dim=64,
        causal=False,
        config=None,
    )
    rows += traffic.planned_rows([failed], ENV, "unsupported", "No available kernel")
    return TRAFFIC.frame(rows)


def test_point_totals_sum_kernels_and_compare_with_the_model(tmp_path):
    path = tmp_path / "traffic.csv"
    TRAFFIC.write_rows(_figure_rows().to_dict("records"), path)
    totals = traffic_figures.point_totals(TRAFFIC.read_rows([path]))  # through a CSV round trip
    naive = totals[totals["impl"] == "naive"]
    assert (naive["n_kernels"] == 3).all()
    assert naive["measured_over_model"].to_numpy() == pytest.approx(1.0)
    flash = totals[(totals["impl"] == "sdpa-flash")]
    assert flash["measured_over_model"].to_numpy() == pytest.approx(1.0)
    assert "sdpa-cudnn" not in set(totals["impl"])  # a point that did not finish has no total


def test_render_all_writes_figures_tables_and_manifest(tmp_path):
    entries = render("traffic", _figure_rows(), tmp_path)
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
    df = TRAFFIC.frame(traffic.planned_rows(_spec().planned(), ENV, "unsupported", "ncu is not on PATH"))
    entries = render("traffic", df, tmp_path)
    assert all(e["png"] is None and e["reason"] for e in entries)
    assert not (tmp_path / "traffic_bytes.png").exists()
    assert json.loads((tmp_path / "manifest.json").read_text())[0]["reason"].startswith("no ok rows")


# ---- workflow ----------------------------------------------------------------------------------------


def _dry_run(*args) -> subprocess.CompletedProcess:
    return snakemake("-n", "--cores", "1", *args)


def test_dry_run_for_a_named_gpu_plans_the_traffic_job_and_its_figures(tmp_path):
    r = _dry_run("--config", "gpus=[h200]", f"results_dir={tmp_path}", f"report={tmp_path}/report.html")
    assert r.returncode == 0, r.stderr + r.stdout
    assert f"{tmp_path}/h200/traffic/traffic.csv" in r.stdout  # its one benchmark job
    assert f"{tmp_path}/h200/traffic.csv" in r.stdout  # collected
    assert f"{tmp_path}/report/h200/traffic" in r.stdout  # its figures


def test_dry_run_without_a_gpu_plans_no_traffic_job(tmp_path):
    r = _dry_run(
        "--profile", "workflow/profiles/cpu", "--config", f"results_dir={tmp_path}", f"report={tmp_path}/report.html"
    )
    assert r.returncode == 0, r.stderr + r.stdout
    assert "benchmark" not in job_counts(r.stdout) and "/traffic/traffic.csv" not in r.stdout


def test_traffic_can_be_switched_off(tmp_path):
    off = tmp_path / "off.yaml"
    off.write_text("gpus: [h200]\ntraffic:\n  enabled: false\n")
    r = _dry_run("--configfile", str(off), "--config", f"results_dir={tmp_path}", f"report={tmp_path}/r.html")
    assert r.returncode == 0, r.stderr + r.stdout
    assert "/traffic/traffic.csv" not in r.stdout and job_counts(r.stdout)["benchmark"] > 0
