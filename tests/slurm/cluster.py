"""A throw-away single-node SLURM cluster on 127.0.0.1, for the tests of the slurm profile.

``start()`` installs munge and SLURM from Debian's packages when they are missing, writes a slurm.conf
into a temporary folder (node line from ``slurmd -C``, controller ``hostname -s``), starts munged,
slurmctld and slurmd, remembers their process ids and waits until the node is idle. ``Cluster.stop()``
cancels what is left in the queue and ends exactly those processes. Clients (sbatch, squeue, the executor
plugin) find the cluster through ``SLURM_CONF``, which ``start()`` sets in this process's environment, and
through a copy at /etc/slurm/slurm.conf (jobs do not inherit ``SLURM_CONF``); ``stop()`` restores that file.

Layout choices, each forced by something that breaks otherwise:
- no accounting database: ``sacct`` does not work, so the profile polls with squeue, and ``MinJobAge``
  keeps finished jobs visible to squeue long after the plugin's polling gaps;
- ``DefMemPerCPU``: without it a job that names no memory takes the whole node and jobs run one by one;
- ``proctrack/linuxproc`` and ``task/none``: containers have no usable cgroups.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ["munge", "slurmctld", "slurmd", "slurm-client"]
MUNGE_KEY = Path("/etc/munge/munge.key")
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
GPU_PARTITION = "gpu"  # the non-default partition of the test cluster (it has no GPUs)


class ClusterUnavailable(RuntimeError):
    """SLURM cannot be set up on this machine (not root, no apt-get, packages missing)."""


def _run(cmd, timeout=60, check=True, **kw) -> subprocess.CompletedProcess:
    """A command bounded by `timeout -k 10`, so nothing here can hang a test session."""
    full = ["timeout", "-k", "10", str(timeout), *cmd]
    return subprocess.run(full, capture_output=True, text=True, check=check, **kw)


def _installed(pkg: str) -> bool:
    r = _run(["dpkg-query", "-W", "-f=${Status}", pkg], check=False)
    return "install ok installed" in r.stdout


def ensure_packages() -> None:
    """Install munge and SLURM with apt-get unless they are there (root only)."""
    missing = [p for p in PACKAGES if not _installed(p)] if shutil.which("dpkg-query") else PACKAGES
    if not missing:
        return
    if os.geteuid() != 0:
        raise ClusterUnavailable(f"SLURM packages missing ({' '.join(missing)}) and not root to install them")
    if shutil.which("apt-get") is None:
        raise ClusterUnavailable(f"SLURM packages missing ({' '.join(missing)}) and no apt-get")
    # keep the packages' init scripts from starting daemons of their own during installation
    policy = Path("/usr/sbin/policy-rc.d")
    added = not policy.exists()
    if added:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        _run(["apt-get", "update", "-qq"], timeout=300, env=env)
        _run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], timeout=600, env=env)
    except subprocess.CalledProcessError as exc:
        raise ClusterUnavailable(f"apt-get failed: {exc.stderr[-2000:]}") from exc
    finally:
        if added:
            policy.unlink(missing_ok=True)


def _conf(root: Path, node_line: str, host: str, partition: str) -> str:
    return f"""# single-node test cluster written by tests/slurm/cluster.py
ClusterName=testcluster
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation={root}/state/ctld
SlurmdSpoolDir={root}/state/d
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
ReturnToService=2
AccountingStorageType=accounting_storage/none
MinJobAge=600
JobCompType=jobcomp/filetxt
JobCompLoc={root}/log/jobcomp.txt
{node_line} NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName={partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
# a second partition on the same node, so tests can see a job sent to a named, non-default partition
PartitionName={GPU_PARTITION} Nodes=ALL Default=NO MaxTime=INFINITE State=UP
"""


@dataclass
class Cluster:
    root: Path
    node: str
    partition: str
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def logs(self) -> str:
        """The daemons' last log lines, for failure messages."""
        out = []
        for name in ("slurmctld.log", "slurmd.log"):
            p = self.root / "log" / name
            if p.is_file():
                out.append(f"--- {name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-30:]))
        return "\n".join(out)

    def squeue(self, *args: str) -> str:
        return _run(["squeue", *args], timeout=30, check=False).stdout

    def finished_jobs(self) -> str:
        """Job completion records (jobcomp/filetxt): one line per finished job, with its id and state."""
        p = self.root / "log" / "jobcomp.txt"
        return p.read_text() if p.is_file() else ""

    def stop(self) -> None:
        """Cancel leftover jobs, then end the daemons this harness started (by pid, SIGTERM then SIGKILL)."""
        if "slurmctld" in self.pids:
            jobs = self.squeue("-h", "-o", "%A").split()
            if jobs:
                _run(["scancel", *jobs], timeout=30, check=False)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and self.squeue("-h", "-t", "PD,R,CG").strip():
                    time.sleep(0.5)
        for name in ("slurmd", "slurmctld", "munged"):
            pid = self.pids.pop(name, None)
            if pid is None:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.2)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if os.environ.get("SLURM_CONF") == str(self.conf):
            del os.environ["SLURM_CONF"]
        before = self.root / "slurm.conf.before"
        if before.exists():
            shutil.copy2(before, SYSTEM_CONF)
        elif SYSTEM_CONF.exists() and SYSTEM_CONF.read_bytes() == self.conf.read_bytes():
            SYSTEM_CONF.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie child of ours counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _read_pid(path: Path, timeout: float = 15) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and path.read_text().strip():
            return int(path.read_text().strip())
        time.sleep(0.1)
    raise RuntimeError(f"no pid file {path} after {timeout} s")


def _munge_works() -> bool:
    if shutil.which("munge") is None:
        return False
    r = subprocess.run("timeout -k 5 10 munge -n | timeout -k 5 10 unmunge", shell=True, capture_output=True)
    return r.returncode == 0


def start(root: Path, partition: str = "debug", wait_s: float = 60) -> Cluster:
    """Start the cluster in ``root`` (state, logs, pid files) and return it once the node is idle."""
    if os.geteuid() != 0:
        raise ClusterUnavailable("starting SLURM daemons needs root")
    ensure_packages()
    for sub in ("state/ctld", "state/d", "log", "run"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    host = socket.gethostname().split(".")[0]
    try:
        socket.gethostbyname(host)
    except OSError as exc:
        raise ClusterUnavailable(f"host name {host!r} does not resolve (add '127.0.0.1 {host}' to /etc/hosts)") from exc
    node_line = _run(["slurmd", "-C"], timeout=30).stdout.splitlines()[0]
    cluster = Cluster(root=root, node=host, partition=partition)
    cluster.conf.write_text(_conf(root, node_line, host, partition))
    os.environ["SLURM_CONF"] = str(cluster.conf)  # sbatch/squeue/scancel here read it
    # Inside a batch job slurmd does not pass SLURM_CONF on, and the plugin's srun then looks in the
    # default place: install the file there too (an existing one is put back at stop()).
    SYSTEM_CONF.parent.mkdir(parents=True, exist_ok=True)
    if SYSTEM_CONF.exists():
        shutil.copy2(SYSTEM_CONF, root / "slurm.conf.before")
    shutil.copy(cluster.conf, SYSTEM_CONF)
    try:
        if not _munge_works():
            if not MUNGE_KEY.is_file() or MUNGE_KEY.stat().st_size == 0:
                _run(["mungekey", "--create", f"--keyfile={MUNGE_KEY}"], timeout=30)
                shutil.chown(MUNGE_KEY, "munge", "munge")
                MUNGE_KEY.chmod(0o600)
            Path("/run/munge").mkdir(exist_ok=True)
            shutil.chown("/run/munge", "munge", "munge")
            # munged runs as the munge user, which cannot write into root's temporary folders: keep its
            # default pid file (/run/munge/munged.pid)
            pidfile = Path("/run/munge/munged.pid")
            pidfile.unlink(missing_ok=True)
            r = _run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], timeout=30, check=False)
            if r.returncode != 0:
                raise RuntimeError(f"munged did not start: {r.stderr.strip()}")
            cluster.pids["munged"] = _read_pid(pidfile)
            if not _munge_works():
                raise RuntimeError("munged started but munge/unmunge do not work")
        # both daemons fork into the background and write their pid files
        _run(["/usr/sbin/slurmctld", "-c", "-f", str(cluster.conf)], timeout=30)
        cluster.pids["slurmctld"] = _read_pid(root / "run" / "slurmctld.pid")
        _run(["/usr/sbin/slurmd", "-f", str(cluster.conf)], timeout=30)
        cluster.pids["slurmd"] = _read_pid(root / "run" / "slurmd.pid")
        deadline = time.monotonic() + wait_s
        resumed = False
        while True:
            state = _run(["sinfo", "-h", "-n", host, "-o", "%T"], timeout=15, check=False).stdout.strip()
            if state == "idle":
                return cluster
            if not resumed and state.rstrip("*") in ("down", "drain", "drained", "draining"):
                _run(["scontrol", "update", f"nodename={host}", "state=resume"], timeout=15, check=False)
                resumed = True
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {host!r} not idle after {wait_s} s (state {state!r})\n{cluster.logs()}")
            time.sleep(0.5)
    except BaseException:
        cluster.stop()
        raise
