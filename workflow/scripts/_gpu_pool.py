"""A GPU of its own for every GPU job of a local run: a pool of file locks, one per device.

Snakemake limits how many GPU jobs run at once (each GPU rule asks for ``gpu=1``; ``--resources gpu=N``
caps them) but does not say which GPU a job gets. So every GPU job takes one from this pool before CUDA
starts: it locks ``<pool dir>/<device>.lock`` (``flock``, which the kernel releases when the process ends,
crashed or killed included) and sets ``CUDA_VISIBLE_DEVICES`` to that device alone; its ``cuda:0`` is then
a GPU no other job of this machine is timing on. A job finding every device taken waits for one.

The pool is the devices of the job's GPU type (NVML names them; a node with two types gives each type's
jobs their own), or the entries of ``CUDA_VISIBLE_DEVICES`` when it is set (a subset of the node, or
simulated devices on a machine without GPUs), limited to the first N with ``--resources gpu=N``. A job whose
``gpu`` resource is 0 (the slurm profile: the cluster hands out the GPU) takes nothing from the pool.

The locks live in ``$KERNELS_GPU_POOL_DIR``, by default one folder in the system's temporary directory for
the whole machine (so that two runs from two checkouts do not share a GPU either), or one per SLURM job.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

POOL_DIR_ENV = "KERNELS_GPU_POOL_DIR"
POOL_SIZE_ENV = "KERNELS_GPU_POOL_SIZE"  # set by workflow/rules/common.smk from --resources gpu=N
log = logging.getLogger("gpu_pool")
_HELD: list = []  # this process's claims (a dropped Claim would close its lock file and free the GPU)


def held():
    """The claim this process holds (the last one taken), or None."""
    return _HELD[-1] if _HELD else None


@dataclass(frozen=True)
class Device:
    id: str  # what CUDA_VISIBLE_DEVICES gets: an index (NVML's, in PCI bus order) or the entry it was given
    slug: str | None  # the GPU type (analysis.core.provenance.gpu_slug of its NVML name); None when unknown


@dataclass
class Claim:
    device: Device
    pool: list[Device]
    _lock: object = field(repr=False, default=None)  # the open lock file: held while the process lives

    def provenance(self) -> dict:
        """What the environment record says about the pool: how many GPUs of this type the run used."""
        return {"gpu_count": len(self.pool)}


def _nvml_devices() -> list[tuple[int, str]] | None:
    """(NVML index, name) of every GPU, or None without NVML."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            out.append((i, name.decode() if isinstance(name, bytes) else name))
        return out
    except pynvml.NVMLError:
        return None


def _slug(name: str) -> str:
    from analysis.core.provenance import gpu_slug  # the workflow's one definition of a GPU type's name

    return gpu_slug(name)


def visible_devices(environ=os.environ, nvml=_nvml_devices) -> tuple[list[Device], bool]:
    """The devices jobs may be given, and whether they are NVML indices (then CUDA must count in PCI bus
    order, as NVML does)."""
    names = {i: _slug(n) for i, n in (nvml() or [])}
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [Device(str(i), slug) for i, slug in sorted(names.items())], True
    devices = []
    for entry in (e.strip() for e in listed.split(",")):
        if not entry or entry == "-1":  # CUDA stops at the first entry that is not a device
            break
        devices.append(Device(entry, names.get(int(entry)) if entry.isdigit() else None))
    return devices, False


def pool_for(gpu: str | None, limit: int | None, devices: list[Device]) -> list[Device]:
    """The job's pool: the devices of its GPU type (or of unknown type), the first ``limit`` of them."""
    pool = [d for d in devices if gpu is None or d.slug in (None, gpu)]
    return pool if limit is None else pool[: max(limit, 0)]


def pool_dir(environ=os.environ) -> Path:
    if environ.get(POOL_DIR_ENV):
        return Path(environ[POOL_DIR_ENV])
    root = Path(tempfile.gettempdir()) / "kernels-audit-gpus"
    job = environ.get("SLURM_JOB_ID")  # SLURM already gives each job its own GPUs
    return root / f"slurm-{job}" if job else root


def _open_lock(path: Path):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        os.fchmod(fd, 0o666)  # other users' runs on this machine lock the same files
    except PermissionError:
        pass
    return os.fdopen(fd, "r+")


def acquire(pool: list[Device], directory: Path, *, who: str = "", poll_s: float = 0.5) -> Claim:
    """Lock the first free device of ``pool`` (waiting while all are taken) and return the claim."""
    if not pool:
        raise ValueError("an empty GPU pool")
    directory.mkdir(parents=True, exist_ok=True)
    try:
        directory.chmod(0o1777)  # shared by every user, like /tmp
    except PermissionError:
        pass
    waited = None
    while True:
        for device in pool:
            f = _open_lock(directory / (re.sub(r"[^A-Za-z0-9_.-]", "_", device.id) + ".lock"))
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            holder = {"pid": os.getpid(), "host": socket.gethostname(), "job": who, "since": time.time()}
            f.seek(0)
            f.truncate()
            f.write(json.dumps(holder) + "\n")
            f.flush()
            if waited is not None:
                log.info("waited %.0f s for a free GPU", time.monotonic() - waited)
            return Claim(device, list(pool), f)
        if waited is None:
            waited = time.monotonic()
            log.info("every GPU of the pool (%s) is taken; waiting for one", ", ".join(d.id for d in pool))
        time.sleep(poll_s)


def claim(smk, environ=os.environ) -> Claim | None:
    """Take a GPU for this Snakemake job (``smk``: the script's ``snakemake`` object) and point CUDA at it;
    None when the job asks for no ``gpu`` or this machine has none to give (the job's GPU check then says
    so). Call it before anything initialises CUDA."""
    if int(getattr(smk.resources, "gpu", 0) or 0) < 1:
        return None
    devices, nvml_order = visible_devices(environ)
    limit = int(environ[POOL_SIZE_ENV]) if environ.get(POOL_SIZE_ENV, "").isdigit() else None
    pool = pool_for(getattr(smk.wildcards, "gpu", None), limit, devices)
    if not pool:
        log.info("no GPU to take from the pool (visible: %s)", ", ".join(d.id for d in devices) or "none")
        return None
    got = acquire(pool, pool_dir(environ), who=f"{smk.rule} {dict(smk.wildcards.items())}")
    _HELD.append(got)  # the lock lives as long as its open file: held until the process ends, whatever the caller keeps
    environ["CUDA_VISIBLE_DEVICES"] = got.device.id
    if nvml_order:
        environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    log.info("GPU %s of the pool (%s)", got.device.id, ", ".join(d.id for d in pool))
    return got
