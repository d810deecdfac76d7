"""The GPU device pool (workflow/scripts/_gpu_pool.py), on the CPU with simulated devices: every GPU job
gets a device of its own, no two running jobs share one, a job that dies gives its device back, and the
workflow's GPU jobs take theirs from a pool of `--resources gpu=N` devices."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "workflow" / "scripts"
sys.path.insert(0, str(SCRIPTS))

import _gpu_pool  # noqa: E402
from _gpu_pool import Device  # noqa: E402


def fake_nvml(*names):
    return lambda: list(enumerate(names))


def test_visible_devices_from_nvml_are_typed_and_in_bus_order():
    nvml = fake_nvml("NVIDIA H200", "NVIDIA H200", "NVIDIA A100-SXM4-80GB")
    devices, nvml_order = _gpu_pool.visible_devices({}, nvml)
    assert devices == [Device("0", "h200"), Device("1", "h200"), Device("2", "a100-sxm4-80gb")]
    assert nvml_order
    # each type's jobs get that type's devices; the limit takes the first N
    assert _gpu_pool.pool_for("h200", None, devices) == devices[:2]
    assert _gpu_pool.pool_for("a100-sxm4-80gb", None, devices) == devices[2:]
    assert _gpu_pool.pool_for("h200", 1, devices) == devices[:1]
    assert _gpu_pool.pool_for("h200", 0, devices) == []


def test_cuda_visible_devices_is_the_pool_when_set():
    devices, nvml_order = _gpu_pool.visible_devices({"CUDA_VISIBLE_DEVICES": "2, 3"}, fake_nvml(*["NVIDIA H200"] * 4))
    assert devices == [Device("2", "h200"), Device("3", "h200")] and not nvml_order
    # without NVML (a CPU machine): simulated devices of unknown type, which any GPU type's job may take
    devices, _ = _gpu_pool.visible_devices({"CUDA_VISIBLE_DEVICES": "0,1,GPU-3f2a"}, lambda: None)
    assert devices == [Device("0", None), Device("1", None), Device("GPU-3f2a", None)]
    assert _gpu_pool.pool_for("h200", None, devices) == devices
    for hidden in ("", "-1", "-1,0"):
        assert _gpu_pool.visible_devices({"CUDA_VISIBLE_DEVICES": hidden}, lambda: None)[0] == []


def test_each_claim_gets_a_free_device_and_waits_when_none_is(tmp_path):
    pool = [Device("0", None), Device("1", None)]
    a = _gpu_pool.acquire(pool, tmp_path)
    b = _gpu_pool.acquire(pool, tmp_path)
    assert (a.device.id, b.device.id) == ("0", "1")
    assert json.loads((tmp_path / "1.lock").read_text())["pid"] == os.getpid()  # who holds it

    got = []
    waiter = threading.Thread(target=lambda: got.append(_gpu_pool.acquire(pool, tmp_path, poll_s=0.05)))
    waiter.start()
    time.sleep(0.5)
    assert not got and waiter.is_alive()  # both taken: it waits
    a._lock.close()  # the first job ends
    waiter.join(timeout=10)
    assert [c.device.id for c in got] == ["0"]
    assert got[0].provenance() == {"gpu_count": 2}


def test_a_process_that_dies_gives_its_device_back(tmp_path):
    code = (
        f"import os, signal, sys; sys.path.insert(0, {str(SCRIPTS)!r}); import _gpu_pool; "
        f"_gpu_pool.acquire([_gpu_pool.Device('0', None)], _gpu_pool.Path({str(tmp_path)!r})); "
        "print('held', flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "held" and r.returncode == -signal.SIGKILL
    claim = _gpu_pool.acquire([Device("0", None)], tmp_path, poll_s=0.05)  # at once, not after a wait
    assert claim.device.id == "0"


SNAKEFILE = """
rule all:
    input:
        expand("out/{i}.json", i=range(N)),


rule work:
    output:
        "out/{i}.json",
    resources:
        gpu=1,
    script:
        "work.py"
"""

WORK = """
import json, os, signal, sys, time
sys.path[:0] = [SCRIPTS, ROOT]
import _gpu_pool

_gpu_pool.claim(snakemake)  # as the job scripts call it: the return value dropped, the lock must stay held
claim = _gpu_pool.held()
start = time.time()
if snakemake.wildcards.i == os.environ.get("DIE"):  # a job that crashes while it holds its GPU
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(float(os.environ.get("HOLD_S", "1")))
record = {"device": os.environ["CUDA_VISIBLE_DEVICES"], "pool": len(claim.pool), "start": start, "end": time.time()}
with open(snakemake.output[0], "w") as f:
    json.dump(record, f)
"""


def toy_workflow(tmp_path: Path, jobs: int) -> Path:
    work = tmp_path / "toy"
    work.mkdir()
    (work / "Snakefile").write_text(SNAKEFILE.replace("N", str(jobs)))
    (work / "work.py").write_text(WORK.replace("SCRIPTS", repr(str(SCRIPTS))).replace("ROOT", repr(str(ROOT))))
    return work


def run_toy(work: Path, pool: Path, devices: str, *args, **env) -> subprocess.CompletedProcess:
    environ = dict(os.environ, CUDA_VISIBLE_DEVICES=devices, KERNELS_GPU_POOL_DIR=str(pool), **env)
    cmd = [sys.executable, "-m", "snakemake", "--keep-going", *args]
    return subprocess.run(cmd, cwd=work, env=environ, capture_output=True, text=True, timeout=300)


def test_concurrent_jobs_never_share_a_device(tmp_path):
    work = toy_workflow(tmp_path, jobs=6)
    r = run_toy(work, tmp_path / "pool", "0,1", "--cores", "4")  # 4 jobs start at once, 2 devices
    assert r.returncode == 0, r.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in sorted((work / "out").glob("*.json"))]
    assert len(records) == 6
    assert {r["device"] for r in records} == {"0", "1"} and {r["pool"] for r in records} == {2}
    for device in ("0", "1"):
        spans = sorted((r["start"], r["end"]) for r in records if r["device"] == device)
        assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:], strict=False)), spans
    # two jobs ran at the same time (on the two devices), never three
    events = sorted([(r["start"], 1) for r in records] + [(r["end"], -1) for r in records])
    running = [sum(step for _, step in events[: i + 1]) for i in range(len(events))]
    assert max(running) == 2


def test_a_job_that_dies_gives_its_device_back_to_the_next_jobs(tmp_path):
    pool = tmp_path / "pool"
    work = toy_workflow(tmp_path, jobs=3)
    # one device: job 1 dies holding it; the others still get it (a lock left behind would hang them)
    r = run_toy(work, pool, "0", "--cores", "3", DIE="1", HOLD_S="0.3")
    assert r.returncode != 0 and "Error in rule work" in r.stdout + r.stderr
    assert sorted(p.name for p in (work / "out").glob("*.json")) == ["0.json", "2.json"]


def test_gpu_resource_limit_sets_the_pool_size(tmp_path):
    """In the real workflow: a GPU job takes its device from the pool before its GPU check, and
    `--resources gpu=N` makes the pool N devices. The devices are simulated (indices no NVML knows, so of
    no known type) and the type asked for is one no machine has: the check then fails, on a GPU node too."""
    work = tmp_path / "repo"
    work.mkdir()
    for name in ("Snakefile", "workflow", "kernels", "analysis", "reports", "envs"):
        src = ROOT / name
        copy = shutil.copytree if src.is_dir() else shutil.copy
        copy(src, work / name, **({"ignore": shutil.ignore_patterns("__pycache__")} if src.is_dir() else {}))
    log = work / "results" / "logs" / "x100" / "environment.log"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="70,71", KERNELS_GPU_POOL_DIR=str(tmp_path / "pool"))
    for extra, line in (([], "GPU 70 of the pool (70, 71)"), (["--resources", "gpu=1"], "GPU 70 of the pool (70)")):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "snakemake",
                "results/x100/environment.json",
                "--cores",
                "1",
                "--config",
                "gpus=[x100]",
                *extra,
            ],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode != 0
        text = log.read_text()
        assert line in text, text
        assert "results for GPU type 'x100' were requested" in text


@pytest.mark.parametrize("script", ["environment", "benchmark"])
def test_every_gpu_job_claims_its_device_before_it_works(script):
    lines = (SCRIPTS / f"{script}.py").read_text().splitlines()
    claim_at = next(i for i, line in enumerate(lines) if "_gpu_pool.claim(snakemake)" in line)
    work_at = next(i for i, line in enumerate(lines) if line.startswith(("run_", "record_environment(")))
    assert claim_at < work_at
    # nothing before the claim touches torch directly; the benchmark preloads its family's code there, which
    # test_families_preload_without_starting_cuda checks starts no CUDA
    assert not any("torch" in line.split("#")[0] for line in lines[:claim_at])


def test_gpu_rules_request_one_gpu_and_only_the_slurm_profile_sets_it_to_zero():
    """Locally each GPU job's gpu=1 is a token of the pool and no profile caps them at one; under SLURM the
    GRES requests the GPU, so every GPU rule's gpu is 0 there (else the plugin asks for a second one)."""
    text = "".join(p.read_text() for p in sorted((ROOT / "workflow" / "rules").glob("*.smk")))
    gpu_rules = {block.split(":", 1)[0] for block in text.split("\nrule ")[1:] if "        gpu=1,\n" in block}
    assert gpu_rules == {"environment", "benchmark"}
    for profile in ("default", "local"):
        assert "gpu=1" not in (ROOT / "workflow" / "profiles" / profile / "config.yaml").read_text()
    slurm = yaml.safe_load((ROOT / "workflow" / "profiles" / "slurm" / "config.yaml").read_text())
    assert {rule for rule, res in slurm["set-resources"].items() if res.get("gpu") == 0} == gpu_rules


def test_families_preload_without_starting_cuda():
    """A benchmark job imports its family's measuring code before it takes a GPU from the pool: no import may
    start CUDA (CUDA_VISIBLE_DEVICES, set when the GPU is taken, is read when CUDA starts). In a fresh
    interpreter whose CUDA start raises, every family preloads."""
    script = (
        "import torch\n"
        "def refuse(*a, **k):\n"
        "    raise AssertionError('CUDA started during an import')\n"
        "torch.cuda._lazy_init = refuse\n"
        "torch.cuda.init = refuse\n"
        "from analysis import registry\n"
        "from analysis.pipeline import preload_family\n"
        "for name in registry.FAMILIES:\n"
        "    preload_family(name)\n"
        "print('preloaded', len(registry.FAMILIES))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().startswith("preloaded")


def test_preload_refuses_a_family_whose_import_started_cuda(monkeypatch):
    import torch

    from analysis.pipeline import preload_family

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="started CUDA"):
        preload_family("moe")
