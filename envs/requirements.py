"""What ``./suite`` needs from the Python it is started with, and installing only what that Python lacks.

    python3 envs/requirements.py prepare run|test   prints the interpreter ./suite should use
    python  envs/requirements.py check run|test     exits 1 and lists what this interpreter lacks

The requirements are pyproject.toml's: the ``[project]`` dependencies for ``run``, with the ``test`` extra
for ``test`` (and the ``slurm`` extra under CI, which must run every test). Where no GPU is visible the
kernels run in Triton's interpreter, and ``[tool.suite.interpreter]`` adds its numpy bound for the Triton
versions that need it; a GPU node keeps its own numpy.

A requirement is met by whatever the interpreter already has, wherever it is installed (system site,
virtualenv, conda env, PYTHONPATH). When everything is met, ``prepare`` prints ``sys.executable``: no
virtual environment, no downloads. Otherwise it makes ``.venv`` *on top of* this interpreter (a ``.pth``
file puts this interpreter's site directories after the venv's own, so a GPU node's torch stays the one
that is imported) and pip installs only what is missing there, at the version ``[tool.suite] tested``
names where that version is acceptable, with every met requirement held at the version found. Under CI
(``CI`` set) the tested versions are required exactly, so CI tests what the GPU ran.

Only the standard library and ``packaging`` (pip's own copy if there is no other; with neither, the check
runs in the venv) are needed, so this runs before anything is installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
PURPOSES = ("run", "test")
LAYER_STAMP = "suite-layer.json"  # in a venv made by prepare(): which interpreter it was layered on
LAYER_PTH = "suite-layer.pth"

if sys.version_info < (3, 10):  # noqa: UP036 (this runs on whatever python3 is)
    sys.exit(f"suite: Python >= 3.10 is needed, {sys.executable} is {sys.version.split()[0]}")

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip's vendored copy of the same parser
    from pip._vendor import tomli as tomllib

try:
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version
except ImportError:
    try:
        from pip._vendor.packaging.requirements import Requirement
        from pip._vendor.packaging.specifiers import SpecifierSet
        from pip._vendor.packaging.utils import canonicalize_name
        from pip._vendor.packaging.version import InvalidVersion, Version
    except ImportError:  # neither: prepare() checks in the venv it makes, which has pip
        Requirement = None


def say(text: str) -> None:
    print(f"suite: {text}", file=sys.stderr, flush=True)


def project() -> dict:
    return tomllib.loads(PYPROJECT.read_text())


def has_gpu() -> bool:
    """Whether an NVIDIA GPU is visible here (without importing torch): the driver's list of GPUs or its
    device files, else NVML, else nvidia-smi. CUDA_VISIBLE_DEVICES set to nothing (or -1) hides them, as
    it does from CUDA."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    gpus = Path("/proc/driver/nvidia/gpus")
    if (gpus.is_dir() and any(gpus.iterdir())) or any(Path("/dev").glob("nvidia[0-9]*")):
        return True
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() > 0:
            return True
    except Exception:  # no nvidia-ml-py, no driver: ask nvidia-smi
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "GPU " in out


def installed(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _contains(spec: SpecifierSet, version: str | None) -> bool:
    if version is None:
        return False
    try:
        return spec.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def tested_versions(data: dict | None = None) -> dict[str, str]:
    """[tool.suite] tested: canonical name -> the version the project was tested with."""
    data = data or project()
    out = {}
    for line in data["tool"]["suite"]["tested"]:
        req = Requirement(line)
        (spec,) = req.specifier  # one ==X each
        out[canonicalize_name(req.name)] = spec.version
    return out


def needs(
    purpose: str, *, gpu: bool | None = None, ci: bool | None = None, data: dict | None = None, version=installed
) -> list[dict]:
    """Every requirement of ``purpose`` with what this interpreter has: one dict per package (canonical
    ``name``, combined ``spec``, ``found`` version or None, the ``tested`` version, ``ok``, ``install``:
    what pip is asked for when it is not ok, and ``hold``: the constraint that keeps it when it is)."""
    if purpose not in PURPOSES:
        raise ValueError(f"purpose must be one of {PURPOSES}, not {purpose!r}")
    data = data or project()
    gpu = has_gpu() if gpu is None else gpu
    ci = bool(os.environ.get("CI")) if ci is None else ci
    lines = list(data["project"]["dependencies"])
    extras = data["project"].get("optional-dependencies", {})
    if purpose == "test":
        lines += extras.get("test", [])
        if ci:
            lines += extras.get("slurm", [])
    tested = tested_versions(data)
    specs: dict[str, SpecifierSet] = {}
    for line in lines:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        specs[name] = specs.get(name, SpecifierSet()) & req.specifier
    if not gpu:  # the kernels run in Triton's interpreter
        rule = data["tool"]["suite"]["interpreter"]
        when = Requirement(rule["when"])
        triton = version(when.name) or tested.get(canonicalize_name(when.name))
        if _contains(when.specifier, triton):
            for line in rule["requires"]:
                req = Requirement(line)
                name = canonicalize_name(req.name)
                specs[name] = specs.get(name, SpecifierSet()) & req.specifier
    if ci:  # exactly what the GPU ran and CI tests with
        for name in specs:
            if name in tested:
                specs[name] &= SpecifierSet(f"=={tested[name]}")
    out = []
    for name, spec in specs.items():
        found = version(name)
        pin = tested.get(name)
        ok = _contains(spec, found)
        out.append(
            {
                "name": name,
                "spec": str(spec),
                "found": found,
                "tested": pin,
                "ok": ok,
                "install": f"{name}=={pin}" if _contains(spec, pin) else f"{name}{spec}",
                "hold": f"{name}=={found}" if ok else None,  # the pip constraint that keeps it as it is
            }
        )
    return out


def describe(missing: list[dict]) -> str:
    parts = []
    for n in missing:
        has = f"{n['found']} installed" if n["found"] else "not installed"
        parts.append(f"{n['name']}{n['spec']} ({has})")
    return ", ".join(parts)


def site_dirs() -> list[str]:
    """This interpreter's site directories, in its own order: what a venv layered on it must also see."""
    import site

    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        dirs.append(site.getusersitepackages())
    return [d for d in dirs if os.path.isdir(d)]


def _python_of(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def layer(venv: Path) -> Path:
    """A venv at ``venv`` on top of this interpreter (made, or remade when it was made on another one);
    returns its python. Only a venv this module (or an earlier ./suite) made is ever removed."""
    base = {"python": sys.executable, "prefix": sys.prefix, "sites": site_dirs()}
    stamp = venv / LAYER_STAMP
    if venv.exists():
        if stamp.is_file() and json.loads(stamp.read_text()) == base:
            return _python_of(venv)
        ours = stamp.is_file() or any(venv.glob(".installed-*"))  # the stamp of the old ./suite
        if not ours:
            raise SystemExit(f"suite: {venv} exists and was not made by ./suite; move it or set SUITE_VENV")
        say(f"remaking {venv} on top of {sys.executable}")
        shutil.rmtree(venv)
    r = subprocess.run([sys.executable, "-m", "venv", str(venv)], stdout=sys.stderr)
    if r.returncode != 0:
        raise SystemExit(f"suite: `{sys.executable} -m venv` failed (on Debian/Ubuntu: apt install python3-venv)")
    python = _python_of(venv)
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # one line: this interpreter's site directories (and their own .pth files) after the venv's
    (Path(purelib) / LAYER_PTH).write_text(f"import site; list(map(site.addsitedir, {base['sites']!r}))\n")
    stamp.write_text(json.dumps(base, indent=1) + "\n")
    return python


def _check_in(python: Path, purpose: str, every: bool = False) -> list[dict]:
    """What ``python`` lacks for ``purpose`` (``every``: every requirement, met or not)."""
    flags = ["--json"] + (["--every"] if every else [])
    r = subprocess.run([str(python), __file__, "check", purpose, *flags], capture_output=True, text=True)
    if r.returncode not in (0, 1):
        raise SystemExit(f"suite: checking {python} failed:\n{r.stderr}")
    return json.loads(r.stdout)


def prepare(purpose: str, venv: Path) -> Path:
    """The interpreter that has everything ``purpose`` needs: this one, or ``venv`` layered on it with
    what it lacks installed (silent when nothing is missing). Exits with one message naming what could
    not be installed."""
    if Requirement is None:
        say(f"{sys.executable} has neither packaging nor pip to check its packages with; checking in {venv}")
    elif all(n["ok"] for n in needs(purpose)):
        return Path(sys.executable)
    here = Path(sys.prefix).resolve() == venv.resolve()
    python = Path(sys.executable) if here else layer(venv)
    missing = _check_in(python, purpose)
    if not missing:
        return python
    specs = [n["install"] for n in missing]
    say(f"{sys.executable} lacks {describe(missing)}")
    say(f"installing into {venv}" + ("" if here else f" (on top of {sys.executable})") + ": " + " ".join(specs))
    # what is already met stays as found (no second torch, numpy, ... under the installed packages)
    names = {n["name"] for n in missing}
    held = [n["hold"] for n in _check_in(python, purpose, every=True) if n["hold"] and n["name"] not in names]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(held) + "\n")
    try:
        cmd = [str(python), "-m", "pip", "install", "--quiet", "--constraint", f.name, *specs]
        code = subprocess.run(cmd, stdout=sys.stderr).returncode
    finally:
        os.unlink(f.name)
    missing = _check_in(python, purpose)
    if code != 0 or missing:
        raise SystemExit(
            f"suite: could not install {describe(missing) or ' '.join(specs)} (pip's message is above). "
            "Without a package index, give pip a folder of wheels: PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR ./suite ..."
        )
    return python


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("check", "prepare") or argv[1] not in PURPOSES:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    if argv[0] == "check":
        result = needs(argv[1])
        missing = [n for n in result if not n["ok"]]
        if "--json" in argv:
            print(json.dumps(result if "--every" in argv else missing))
        elif missing:
            say(f"{sys.executable} lacks {describe(missing)}")
        return 1 if missing else 0
    venv = Path(os.environ.get("SUITE_VENV") or ROOT / ".venv")
    print(prepare(argv[1], venv))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
