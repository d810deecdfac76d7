"""HBM traffic of attention kernels, measured with Nsight Compute: profile, parse, one row per kernel.

The question: do the byte models of ``analysis.core.models`` describe what the kernels move through DRAM?
Does standard attention move 8N² + 8Nd bytes (each of its three kernels reading and writing its N×N
tensor, the model) or 6N² + 8Nd (an article's count)? Does a FlashAttention kernel's traffic grow like
O(N) (the compulsory 4Nd: Q, K, V read once, O written once) or like N²d²/M (K and V re-read for every
Q block, the no-cache model)? The answer is measured per kernel, so standard attention's three kernels
(``baddbmm``, ``softmax``, ``bmm``) are seen one by one.

Method, per planned point (an implementation at one shape, and for our kernel one block configuration):

1. ``run`` writes the planned points to ``spec.json`` and starts one process under Nsight Compute::

       ncu --clock-control none --profile-from-start off --metrics dram__bytes_read.sum,
           dram__bytes_write.sum,gpu__time_duration.sum --csv python -m analysis.families.traffic.target spec sidecar

2. The target (``analysis.families.traffic.target``) builds each point's inputs and runs the implementation once
   *outside* the profiled region (compiling, autotuning, cuBLAS/cuDNN plan selection), then opens the
   region (``cudaProfilerStart``), launches a tiny marker kernel named ``_traffic_point_marker``, runs the
   implementation once, synchronises and closes the region. With ``--profile-from-start off`` only
   kernels inside such regions are profiled, so nothing but the point's own kernels is measured. The
   target writes the points it ran, in order, with their status, to the JSON sidecar.
3. ``parse_ncu_csv`` reads ncu's CSV (one row per kernel and metric; ``==PROF==`` lines and the program's
   own output skipped; "Mbyte"/"usecond" style units converted to bytes and ns; ncu's decimal prefixes are
   powers of 1000; thousands separators removed). ``split_points`` cuts the kernel stream at the markers,
   and the i-th marked point of the sidecar gets the i-th segment: one row per kernel, markers dropped.
4. Each row gets the models' prediction for its point (``model_bytes`` etc., from ``analysis.core.models``)
   and the provenance of the run.

What the counters do and do not see. ncu's default cache control flushes every cache before each
profiled kernel and replays kernels one at a time, so each kernel starts with a cold L2: its DRAM reads
are everything it fetched, none served by its predecessor's leftovers. Writes are counted when they
reach DRAM, and a write-back L2 may still hold dirty lines when a kernel ends; the flush before the next
kernel writes them back uncounted. So when a point's N×N tensor fits in L2 (``l2_resident``), the
kernel that writes it can show far fewer DRAM write bytes than it stores. ``--clock-control none``
leaves clocks as the benchmarks run them; ``gpu_time_ns`` is one launch under the profiler (cold cache),
not the harness's timing. The models assume full (non-causal) attention; causal rows get no model.

Failures are rows, never crashes: no ``ncu`` on PATH or no CUDA GPU → one ``unsupported`` row per planned
point, saying why (unless the spec has ``require``, then it raises); ncu failing, timing out, or
profiling nothing (e.g. no permission to read performance counters) → one ``error`` row per point with
the tail of ncu's output; a point that ran out of memory or was refused → its status from the sidecar.
The raw ncu output, the spec, the sidecar and the command are kept in the job's ``files`` folder (beside
its log) for audit.

The instruction mix (points of ``traffic-inst-mix``: our FA-2 forward at one long N) is a second ncu pass of
the same program with other metrics (``mix_metrics``: warp instructions executed in all, and by the tensor
pipe's mma.sync and, on Hopper, warpgroup MMA, the FMA, ALU, special-function, memory and uniform pipes),
printed in base units; its side files carry the suffix ``-inst-mix``. A metric the GPU or ncu does not know
fails that pass alone: its rows say why, the DRAM rows stand. The counts are of the whole kernel (its
prologue and epilogue included, small at long N), summed over every SM.

Columns: ``columns.yaml`` of this folder (one row per kernel of a point, or one row standing for a whole
point that was not profiled; the models' bytes of the point on each of its rows).

Compare a point's measured total with ``model_bytes`` by summing its kernels' bytes first
(``analysis.families.traffic.figures.point_totals`` does).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from analysis.core import models
from analysis.core.paths import ROOT
from analysis.core.provenance import now_utc
from analysis.families.traffic import FAMILY
from analysis.families.traffic.plan import ELEM_BYTES, INST_MIX, MATERIALISING, Spec, config_fields

log = logging.getLogger(__name__)

COLUMNS = FAMILY.columns()["columns"]  # the row's columns, in order (columns.yaml)
METRIC_COLUMNS = ["dram_read_bytes", "dram_write_bytes", "gpu_time_ns"]
MIX_SUFFIX = "-inst-mix"  # the instruction-mix pass's side files
PROVENANCE = ["gpu_name", "gpu", "driver", "cuda", "torch", "triton", "git_sha", "timestamp"]

MARKER = "_traffic_point_marker"


# ncu metric -> column; the order is the order of --metrics
NCU_METRICS = {
    "dram__bytes_read.sum": "dram_read_bytes",
    "dram__bytes_write.sum": "dram_write_bytes",
    "gpu__time_duration.sum": "gpu_time_ns",
}
# the instruction-mix pass: warp instructions executed, in all and by pipe (mix_metrics adds Hopper's wgmma)
MIX_METRICS = {
    "smsp__inst_executed.sum": "inst_executed",
    "sm__inst_executed_pipe_tensor_op_hmma.sum": "inst_tensor_hmma",
    "sm__inst_executed_pipe_fma.sum": "inst_fma",
    "sm__inst_executed_pipe_alu.sum": "inst_alu",
    "sm__inst_executed_pipe_xu.sum": "inst_xu",
    "sm__inst_executed_pipe_lsu.sum": "inst_lsu",
    "sm__inst_executed_pipe_uniform.sum": "inst_uniform",
}
GMMA_METRIC = {"sm__inst_executed_pipe_tensor_op_gmma.sum": "inst_tensor_gmma"}


def mix_metrics(capability: tuple[int, int]) -> dict[str, str]:
    """The instruction-mix pass's metrics on a GPU of ``capability`` (Hopper's warpgroup MMA has its own)."""
    return {**MIX_METRICS, **(GMMA_METRIC if capability[0] == 9 else {})}


# ncu scales values to a readable unit unless told otherwise; its prefixes are decimal (Mbyte = 10⁶ B).
# A unit outside these tables is refused rather than read as the base unit (a silent factor of 10⁶).
_BYTES = {
    "byte": 1.0,
    "Kbyte": 1e3,
    "Mbyte": 1e6,
    "Gbyte": 1e9,
    "Tbyte": 1e12,
    "B": 1.0,
    "KB": 1e3,
    "MB": 1e6,
    "GB": 1e9,
    "TB": 1e12,
    "KiB": 2.0**10,
    "MiB": 2.0**20,
    "GiB": 2.0**30,
}


_TIME = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9, "ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


_COUNT = {"inst": 1.0, "": 1.0, "Kinst": 1e3, "Minst": 1e6, "Ginst": 1e9}


UNITS = {
    "dram__bytes_read.sum": _BYTES,
    "dram__bytes_write.sum": _BYTES,
    "gpu__time_duration.sum": _TIME,
    **{metric: _COUNT for metric in (*MIX_METRICS, *GMMA_METRIC)},
}


_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d*)?([eE][+-]?\d+)?$")


class NcuOutputError(ValueError):
    """ncu's output cannot be read, or does not match the points the target ran."""


@dataclasses.dataclass
class Kernel:
    """One profiled kernel launch: ncu's ID, the kernel's name, and its metrics in bytes and ns."""

    id: int
    name: str
    values: dict[str, float]


def parse_number(text: str) -> float:
    """A value as ncu prints it: maybe quoted, maybe with thousands separators; "n/a" → NaN."""
    t = text.strip().strip('"').strip()
    if t.lower() in ("", "n/a", "nan", "-"):
        return math.nan
    if "," in t:
        if not _THOUSANDS.match(t):
            # e.g. "9,00" from a locale with decimal commas: reading it either way could be wrong
            raise NcuOutputError(f"cannot read the number {text!r}: its comma is not a thousands separator")
        t = t.replace(",", "")
    try:
        return float(t)
    except ValueError:
        raise NcuOutputError(f"cannot read the number {text!r}") from None


def to_base_unit(metric: str, unit: str, value: str) -> float:
    """Convert one ncu value of ``metric`` printed in ``unit`` to bytes (byte metrics) or ns (times)."""
    table = UNITS[metric]
    unit = unit.strip()
    if unit not in table:
        raise NcuOutputError(f"{metric}: unknown unit {unit!r} (known: {sorted(table)})")
    return parse_number(value) * table[unit]


def _csv_fields(line: str) -> list[str] | None:
    try:
        return next(csv.reader([line]))
    except (csv.Error, StopIteration):
        return None


def parse_ncu_csv(text: str, metrics: dict[str, str] = NCU_METRICS) -> list[Kernel]:
    """Kernels (in ncu's ID order) from ncu's ``--csv`` output, with ``metrics`` (ncu name → column) in bytes,
    ns and instructions.

    Reads the default "details" page (long: one line per kernel and metric, columns ``ID``, ``Kernel
    Name``, ``Metric Name``, ``Metric Unit``, ``Metric Value``) and the "raw" page (wide: one line per
    kernel, one column per metric, a line of units under the header). Anything that is not part of the
    table (``==PROF==``/``==WARNING==`` lines, the profiled program's own output) is skipped.
    """
    kernels: dict[int, Kernel] = {}
    header: list[str] | None = None
    wide_units: dict[str, str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("=="):
            continue
        fields = _csv_fields(stripped)
        if not fields:
            continue
        if "Kernel Name" in fields and "ID" in fields:
            header, wide_units = fields, None
            continue
        if header is None or len(fields) != len(header):
            continue  # not a table line (the program's own output)
        row = dict(zip(header, fields, strict=True))
        if "Metric Name" in header:  # details page: one metric per line
            metric = row["Metric Name"].strip()
            if metric not in metrics:
                continue
            kernel = _kernel(kernels, row)
            kernel.values[metrics[metric]] = to_base_unit(metric, row.get("Metric Unit", ""), row["Metric Value"])
            continue
        # raw page: the line under the header holds the units
        if not row["ID"].strip().isdigit():
            if wide_units is None:
                wide_units = row
            continue
        kernel = _kernel(kernels, row)
        for metric, column in metrics.items():
            if metric in row:
                unit = (wide_units or {}).get(metric, "")
                kernel.values[column] = to_base_unit(metric, unit, row[metric])
    return [kernels[i] for i in sorted(kernels)]


def _kernel(kernels: dict[int, Kernel], row: dict) -> Kernel:
    text = row["ID"].strip()
    if not text.isdigit():
        raise NcuOutputError(f"ncu row has a non-numeric kernel ID {text!r}")
    kid = int(text)
    if kid not in kernels:
        kernels[kid] = Kernel(kid, row["Kernel Name"].strip(), {})
    return kernels[kid]


def is_marker(kernel: Kernel, marker: str = MARKER) -> bool:
    return marker in kernel.name


def split_points(kernels: list[Kernel], marker: str = MARKER) -> tuple[list[Kernel], list[list[Kernel]]]:
    """Cut the kernel stream at the markers: (kernels before the first marker, one list per marker)."""
    before: list[Kernel] = []
    segments: list[list[Kernel]] = []
    for k in kernels:
        if is_marker(k, marker):
            segments.append([])
        elif segments:
            segments[-1].append(k)
        else:
            before.append(k)
    return before, segments


def point_models(point: dict, block_m: float = math.nan) -> dict:
    """``model_bytes`` and ``model_bytes_nocache`` of a point (NaN where no model applies)."""
    n, d = int(point["seqlen"]), int(point["head_dim"])
    b, h, e = int(point["batch"]), int(point["heads"]), ELEM_BYTES[point["dtype"]]
    out = {"model_bytes": math.nan, "model_bytes_nocache": math.nan}
    if point["causal"]:
        return out  # every model here is for full attention
    if point["impl"] in MATERIALISING:
        out["model_bytes"] = models.standard_attention_total_bytes(n, d, b, h, e)
    else:
        out["model_bytes"] = models.minimum_attention_bytes(n, d, b, h, e)
    if point["impl"] == "ours-fa2" and not _isnan(block_m):
        out["model_bytes_nocache"] = models.fa2_forward_bytes(n, d, int(block_m), b, h, e)
    return out


def l2_resident(point: dict, l2_cache_bytes) -> bool | None:
    """Whether the point's N×N tensor (all batches and heads) fits in L2; None when the L2 size is unknown."""
    if l2_cache_bytes is None or _isnan(l2_cache_bytes) or l2_cache_bytes <= 0:
        return None
    s = models.score_matrix_bytes(
        int(point["seqlen"]), int(point["batch"]), int(point["heads"]), ELEM_BYTES[point["dtype"]]
    )
    return bool(s <= float(l2_cache_bytes))


def _isnan(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def base_row(point: dict, env: dict, l2_cache_bytes=None, kernel_config: str = "") -> dict:
    config = config_fields(kernel_config or point.get("config"))
    row = dict.fromkeys(COLUMNS, math.nan)
    row.update({k: point[k] for k in ("experiment", "impl", "dtype", "batch", "heads", "seqlen", "head_dim")})
    row.update(causal=bool(point["causal"]), kernel="", kernel_role="", message="", **config)
    row.update(point_models(point, config["block_m"]))
    row.update(l2_resident=l2_resident(point, l2_cache_bytes), l2_cache_bytes=l2_cache_bytes)
    row.update({k: env.get(k, "") for k in PROVENANCE if k != "timestamp"})
    row["timestamp"] = now_utc()
    return row


def planned_rows(points: Iterable[dict], env: dict, status: str, message: str) -> list[dict]:
    """One row per planned point, all with the same status and message (nothing was measured)."""
    return [{**base_row(p, env), "status": status, "message": message} for p in points]


def _roles(impl: str, names: list[str]) -> list[str]:
    """Which step of attention each of a point's kernels is."""
    if impl not in MATERIALISING:
        return ["attention"] * len(names)
    soft = [i for i, name in enumerate(names) if "softmax" in name.lower()]
    if not soft:
        return ["attention"] * len(names)
    first, last = soft[0], soft[-1]
    # whatever runs before the softmax computes S (a GEMM, perhaps with a split-K reduction), after it O
    return ["qk" if i < first else "pv" if i > last else "softmax" for i in range(len(names))]


def assemble(sidecar: dict, kernels: list[Kernel], env: dict, columns: list[str] = METRIC_COLUMNS) -> list[dict]:
    """Rows for every point the target ran: its kernels' ``columns`` (ok points) or its status."""
    points = sidecar.get("points")
    if points is None:
        raise NcuOutputError("the sidecar lists no points")
    l2 = sidecar.get("l2_cache_bytes")
    before, segments = split_points(kernels)
    marked = [p for p in points if p.get("marked")]
    if len(segments) != len(marked):
        names = sorted({k.name[:80] for k in kernels})[:8]
        raise NcuOutputError(
            f"ncu profiled {len(segments)} point markers but the target marked {len(marked)} points "
            f"({len(kernels)} kernels profiled{': ' + ', '.join(names) if names else ''})"
        )
    if before:
        log.warning("ignoring %d kernels profiled before the first marker: %s", len(before), before[0].name)
    rows: list[dict] = []
    segs = iter(segments)
    for p in points:
        seg = next(segs) if p.get("marked") else []
        base = base_row(p, env, l2, p.get("kernel_config", ""))
        status = p.get("status", "error")
        if status != "ok":
            rows.append({**base, "status": status, "message": p.get("message", "")})
            continue
        if not seg:
            rows.append({**base, "status": "error", "message": "no kernel was profiled after the point's marker"})
            continue
        roles = _roles(p["impl"], [k.name for k in seg])
        per_role = models.standard_attention_bytes(
            int(p["seqlen"]), int(p["head_dim"]), int(p["batch"]), int(p["heads"]), ELEM_BYTES[p["dtype"]]
        )
        for j, (k, role) in enumerate(zip(seg, roles, strict=True)):
            row = {**base, "kernel": k.name, "kernel_index": j, "kernel_role": role, "status": "ok"}
            row.update({c: k.values.get(c, math.nan) for c in columns})
            # a step's model belongs to a kernel only when that kernel is the whole step
            if role in per_role and roles.count(role) == 1 and not p["causal"]:
                row["model_kernel_bytes"] = per_role[role]
            missing = [c for c in columns if _isnan(row[c])]
            if missing:
                row.update(status="error", message=f"ncu gave no value for {missing}")
            rows.append(row)
    return rows


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def unsupported_reason() -> str | None:
    """Why traffic cannot be measured on this machine, or None when it can."""
    if shutil.which("ncu") is None:
        return "Nsight Compute (ncu) is not on PATH: DRAM traffic is not measured"
    if not _cuda_available():
        return "no CUDA GPU is visible to PyTorch: DRAM traffic is not measured"
    return None


def ncu_command(
    spec: Spec,
    spec_json: Path,
    sidecar_json: Path,
    ncu: str = "ncu",
    metrics: dict[str, str] = NCU_METRICS,
    base_units: bool = False,
) -> list[str]:
    """``base_units``: values printed unscaled (the instruction counts: no Kinst or Minst to convert)."""
    return [
        ncu,
        "--clock-control",
        "none",
        "--profile-from-start",
        "off",
        "--metrics",
        ",".join(metrics),
        "--csv",
        *(["--print-units", "base"] if base_units else []),
        *spec.ncu_args,
        sys.executable,
        "-m",
        "analysis.families.traffic.target",
        str(spec_json),
        str(sidecar_json),
    ]


def _child_env() -> dict:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # the profiled program runs the kernels compiled, on the GPU
    # ncu prints numbers in the locale's format; a decimal comma would be ambiguous with its thousands
    # separators, so numbers are formatted the C way (LC_ALL would override LC_NUMERIC)
    env.pop("LC_ALL", None)
    env["LC_NUMERIC"] = "C"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


@dataclasses.dataclass
class _Result:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool


def _run_profiler(cmd: list[str], timeout_s: float) -> _Result:
    # a session of its own, so that a timeout ends ncu *and* the program it profiles (and nothing else)
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=_child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return _Result(proc.returncode, out, err, False)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        return _Result(proc.returncode, out, err, True)


def _diagnosis(result: _Result, limit: int = 1200) -> str:
    """ncu's own error lines first (e.g. ERR_NVGPUCTRPERM), then the tail of stderr, on one line."""
    text = (result.stdout or "") + "\n" + (result.stderr or "")
    errors = [ln.strip() for ln in text.splitlines() if ln.strip().startswith(("==ERROR==", "==WARNING=="))]
    tail = [ln.strip() for ln in (result.stderr or "").splitlines() if ln.strip()][-15:]
    seen, parts = set(), []
    for ln in errors + tail:
        if ln not in seen:
            seen.add(ln)
            parts.append(ln)
    joined = " | ".join(parts)
    return joined[-limit:] if joined else "(no output)"


def run(spec: Spec, env: dict, device: str, log_line: Callable[[str], None], files: str | Path) -> list[dict]:
    """Profile every planned point under ncu; one row per kernel (method: module docstring). ``files`` keeps
    the raw ncu output, the spec, the sidecar and the command (``device`` is the GPU's: ncu profiles it)."""
    points = spec.planned()
    workdir = Path(files)
    workdir.mkdir(parents=True, exist_ok=True)
    why = unsupported_reason()
    if why:
        if spec.require:
            raise RuntimeError(f"{why} (the traffic experiment is required: enabled is true)")
        log_line(f"traffic: {why}; writing {len(points)} unsupported rows")
        (workdir / "unsupported.txt").write_text(why + "\n")  # say why the folder is bare
        return planned_rows(points, env, "unsupported", why)

    mix = [p for p in points if p["experiment"] == INST_MIX]
    rows = _profile([p for p in points if p["experiment"] != INST_MIX], spec, env, workdir, log_line)
    if mix:
        rows += _profile(mix, spec, env, workdir, log_line, mix_metrics(_capability()), MIX_SUFFIX)
    return rows


def _capability() -> tuple[int, int]:
    """The profiled GPU's compute capability ((0, 0) where it cannot be read)."""
    try:
        import torch

        return tuple(torch.cuda.get_device_capability())
    except Exception:
        return (0, 0)


def _profile(
    points: list[dict],
    spec: Spec,
    env: dict,
    workdir: Path,
    log_line: Callable[[str], None],
    metrics: dict[str, str] = NCU_METRICS,
    suffix: str = "",
) -> list[dict]:
    """One ncu pass over ``points`` collecting ``metrics``; its side files are named with ``suffix``."""
    if not points:
        return []
    spec_json, sidecar_json = (workdir / f"spec{suffix}.json").resolve(), (workdir / f"sidecar{suffix}.json").resolve()
    spec_json.write_text(json.dumps({"points": points, "seed": spec.seed}, indent=2) + "\n")
    sidecar_json.unlink(missing_ok=True)  # a sidecar from an earlier run must not pass for this one's
    ncu = shutil.which("ncu") or "ncu"
    cmd = ncu_command(spec, spec_json, sidecar_json, ncu, metrics, base_units=metrics is not NCU_METRICS)
    (workdir / f"command{suffix}.txt").write_text(shlex.join(cmd) + "\n")
    log_line(f"traffic: {len(points)} points under ncu: {shlex.join(cmd)}")

    result = _run_profiler(cmd, spec.timeout_s)
    (workdir / f"ncu_stdout{suffix}.txt").write_text(result.stdout or "")
    (workdir / f"ncu_stderr{suffix}.txt").write_text(result.stderr or "")
    if result.timed_out:
        message = f"ncu timed out after {spec.timeout_s:g} s: {_diagnosis(result)}"
        return planned_rows(points, env, "error", message)
    if result.returncode != 0:
        message = f"ncu exited with status {result.returncode}: {_diagnosis(result)}"
        return planned_rows(points, env, "error", message)
    try:
        sidecar = json.loads(sidecar_json.read_text())
        # ncu prints its results on stdout; should a version print them with its messages, read those
        kernels = parse_ncu_csv(result.stdout, metrics) or parse_ncu_csv(result.stderr or "", metrics)
        return assemble(sidecar, kernels, env, list(metrics.values()))
    except (OSError, ValueError, KeyError) as exc:  # NcuOutputError and JSON errors are ValueErrors
        message = f"{type(exc).__name__}: {exc} | ncu: {_diagnosis(result)}"
        return planned_rows(points, env, "error", message[:2000])
