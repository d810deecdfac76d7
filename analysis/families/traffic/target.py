"""The program Nsight Compute profiles: ``python -m analysis.families.traffic.target SPEC SIDECAR``.

``SPEC`` is the JSON ``analysis.families.traffic.run.run`` writes (the planned points, in order); ``SIDECAR`` is where
this program writes the points it ran, in the same order, each with ``status``, ``message``, ``marked``
(whether its marker kernel was launched, i.e. whether a segment of ncu's kernel stream belongs to it)
and ``kernel_config`` (our kernel's configuration as it ran), plus the device's name and L2 size.

Per point: inputs are built (``torch.randn``, the point's dtype, on the GPU) and the implementation runs
once outside any profiled region, which compiles and autotunes it (our kernel with the point's pinned
``FA2Config`` when it names one) and lets cuBLAS/cuDNN choose their plans. Then, after a synchronise:
``torch.cuda.profiler.start()``, the marker kernel ``_traffic_point_marker``, one call of the
implementation, a synchronise, ``torch.cuda.profiler.stop()``. Under ``ncu --profile-from-start off``
only what runs between start and stop is profiled, and the marker tells the parser where a point's
kernels begin. Failures are recorded per point (``oom``, ``unsupported``, ``error``, as the harness
classifies them), never raised; the sidecar is rewritten after every point, so a run that dies still
says how far it got. Nothing is printed on stdout: ncu's CSV goes there.

``--device cpu`` runs the same loop on the CPU without profiler calls (Triton's interpreter for our
kernel), which is how the tests exercise it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import triton
import triton.language as tl

from analysis.core import harness
from analysis.core.provenance import now_utc

log = logging.getLogger("traffic_target")

MARKER_NAME = "_traffic_point_marker"  # run.MARKER; the kernel below must carry this name


@triton.jit
def _traffic_point_marker(flag_ptr):
    # One program adds one to one int: a launch ncu records under this name, with next to no traffic.
    tl.store(flag_ptr, tl.load(flag_ptr) + 1)


def launch_marker(flag: torch.Tensor) -> None:
    _traffic_point_marker[(1,)](flag)


def _implementation(point: dict) -> Callable:
    """``f(q, k, v) -> out`` for the point: ours with its pinned configuration, else as benchmarked."""
    causal = bool(point["causal"])
    if point["impl"] == "ours-fa2" and point.get("config"):
        from kernels.attention import fa2

        cfg = fa2.FA2Config.parse(point["config"])
        return lambda q, k, v: fa2.forward(q, k, v, causal=causal, config=cfg)[0]
    from analysis.families._shared.attention_measure import implementation

    fn = implementation(point["impl"])
    return lambda q, k, v: fn(q, k, v, causal)


def _kernel_config(point: dict) -> str:
    if point["impl"] != "ours-fa2":
        return ""
    from kernels.attention import fa2

    cfg = fa2.last_config()
    return str(cfg) if cfg else ""


def _inputs(point: dict, device: str, seed: int) -> tuple[torch.Tensor, ...]:
    from analysis.core.points import DTYPES

    torch.manual_seed(seed)
    shape = (int(point["batch"]), int(point["heads"]), int(point["seqlen"]), int(point["head_dim"]))
    return tuple(torch.randn(shape, device=device, dtype=DTYPES[point["dtype"]]) for _ in range(3))


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@contextlib.contextmanager
def _profiled(device: str):
    """The profiled region: cudaProfilerStart/Stop around the body (nothing on the CPU)."""
    if not device.startswith("cuda"):
        yield
        return
    torch.cuda.profiler.start()
    try:
        yield
    finally:
        torch.cuda.profiler.stop()


def _device_facts(device: str) -> dict:
    if not device.startswith("cuda"):
        return {"device": "cpu", "l2_cache_bytes": None}
    props = torch.cuda.get_device_properties(torch.device(device))
    l2 = getattr(props, "L2_cache_size", None)
    return {"device": props.name, "l2_cache_bytes": int(l2) if l2 else None}


def _write(path: Path, sidecar: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(sidecar, indent=2) + "\n")
    tmp.replace(path)


def run_points(points: list[dict], sidecar_path: str | Path, device: str = "cuda", seed: int = 0) -> dict:
    """Run every point as the module docstring describes; returns (and writes) the sidecar."""
    sidecar_path = Path(sidecar_path)
    flag = torch.zeros(1, dtype=torch.int32, device=device)
    launch_marker(flag)  # compiled and loaded before the first profiled region, so only its launch is seen
    _sync(device)
    sidecar = {**_device_facts(device), "started": now_utc(), "finished": None, "points": []}
    _write(sidecar_path, sidecar)
    with torch.no_grad():
        for i, point in enumerate(points):
            rec = {**point, "status": "ok", "message": "", "marked": False, "kernel_config": ""}
            inputs: tuple = ()
            try:
                fn = _implementation(point)
                inputs = _inputs(point, device, seed)
                fn(*inputs)  # compiles, autotunes, picks library plans: outside the profiled region
                rec["kernel_config"] = _kernel_config(point)
                _sync(device)
                with _profiled(device):
                    launch_marker(flag)
                    rec["marked"] = True
                    fn(*inputs)
                    _sync(device)
            except Exception as exc:  # the point's status, as the harness names it; the next point runs
                rec["status"], rec["message"] = harness.classify(exc)
            finally:
                inputs = ()  # the next point's inputs must not share the GPU with these
                harness.release_memory()
            sidecar["points"].append(rec)
            _write(sidecar_path, sidecar)
            log.info(
                "[%d/%d] %s %s N=%s d=%s %s: %s %s",
                i + 1,
                len(points),
                point["experiment"],
                point["impl"],
                point["seqlen"],
                point["head_dim"],
                point.get("config") or "",
                rec["status"],
                rec["message"][:120],
            )
    sidecar["finished"] = now_utc()
    _write(sidecar_path, sidecar)
    return sidecar


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", type=Path, help="JSON with the planned points (written by the traffic family's run)")
    ap.add_argument("sidecar", type=Path, help="JSON this program writes: the points it ran, in order")
    ap.add_argument("--device", default="cuda", help="cuda (profiled) or cpu (tests)")
    args = ap.parse_args(argv)
    # stdout carries ncu's CSV: this program's log lines go to stderr
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    spec = json.loads(args.spec.read_text())
    run_points(spec["points"], args.sidecar, device=args.device, seed=int(spec.get("seed", 0)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
