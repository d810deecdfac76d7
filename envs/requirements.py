"""What ``./suite`` needs from the Python it is started with, and installing only what that Python lacks.

    python3 envs/requirements.py prepare run|test   prints the interpreter ./suite should use
    python  envs/requirements.py check run|test     exits 1 and lists what this interpreter lacks

The requirements are pyproject.toml's: the ``[project]`` dependencies for ``run``, with the ``test`` extra
for ``test`` (and under CI, which must run every test, the ``slurm`` extra and ``[build-system]``'s). Where
no GPU is visible the kernels run in Triton's interpreter, and ``[tool.suite.interpreter]`` adds its numpy
bound for the Triton versions that need it; a GPU node keeps its own numpy.

A requirement is met by whatever the interpreter already has, wherever it is installed (system site,
virtualenv, conda env, PYTHONPATH). When everything is met, ``prepare`` prints ``sys.executable``: no
virtual environment, no downloads, nothing written into that interpreter. Otherwise it makes ``.venv`` *on
top of* this interpreter (a ``.pth`` file puts this interpreter's site directories after the venv's own, so
a GPU node's torch stays the one that is imported) and pip installs only what is missing there, one line
said per group of what and why, at the version ``[tool.suite] tested`` names where that version is
acceptable, with every met requirement held at the version found. Under CI (``CI`` set) the tested versions
are required exactly, so CI tests what the GPU ran. Into that venv, and only there, it also installs this
project itself, editable and without its dependencies (``pip install --no-deps -e .``, with the build
backend ``[build-system]`` names), so that the venv's python imports ``kernels`` and ``analysis`` from any
folder. pip's own check of the whole environment is left out: it also speaks of packages of the
interpreter below that the suite never imports (one whose requirement a newer copy in the venv no longer
meets, a conflict that was there before). The packages the suite uses, and theirs, are checked instead,
and a conflict among them that the install brought is said.

Either way it checks that ``kernels`` and ``analysis``, as the pipeline imports them from the repository,
are this project's, and stops naming the other one when not (PyPI's ``kernels`` is an unrelated package).

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
PACKAGES = ("kernels", "analysis")  # the project's top-level names
GROUPS = {  # why a requirement is installed, by where pyproject.toml lists it
    "run": "to run the pipeline",
    "test": "to run the tests",
    "slurm": "for the SLURM test, which CI runs",
    "build": "to install this project editable (its build backend)",
}
PIP = ["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-warn-conflicts"]

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
    purpose: str,
    *,
    gpu: bool | None = None,
    ci: bool | None = None,
    build: bool = False,
    data: dict | None = None,
    version=installed,
) -> list[dict]:
    """Every requirement of ``purpose`` (``build``, or testing under CI: and the project's build backend)
    with what this interpreter has: one dict per package (canonical ``name``, combined ``spec``, ``found``
    version or None, the ``tested`` version, ``ok``, ``install``: what pip is asked for when it is not ok,
    ``hold``: the constraint that keeps it when it is, ``group``: the key of GROUPS it is listed under, and
    ``why``: what refuses a found version that the listed requirements alone accept, else None)."""
    if purpose not in PURPOSES:
        raise ValueError(f"purpose must be one of {PURPOSES}, not {purpose!r}")
    data = data or project()
    gpu = has_gpu() if gpu is None else gpu
    ci = bool(os.environ.get("CI")) if ci is None else ci
    extras = data["project"].get("optional-dependencies", {})
    lines = [(line, "run") for line in data["project"]["dependencies"]]
    if purpose == "test":
        lines += [(line, "test") for line in extras.get("test", [])]
        if ci:
            lines += [(line, "slurm") for line in extras.get("slurm", [])]
    if build or (purpose == "test" and ci):
        lines += [(line, "build") for line in data["build-system"]["requires"]]
    tested = tested_versions(data)
    specs: dict[str, SpecifierSet] = {}
    groups: dict[str, str] = {}
    for line, group in lines:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        specs[name] = specs.get(name, SpecifierSet()) & req.specifier
        groups.setdefault(name, group)
    listed = dict(specs)
    bounds: dict[str, tuple[SpecifierSet, str]] = {}  # what this machine adds, and why
    if not gpu:  # the kernels run in Triton's interpreter
        rule = data["tool"]["suite"]["interpreter"]
        when = Requirement(rule["when"])
        triton = version(when.name) or tested.get(canonicalize_name(when.name))
        if _contains(when.specifier, triton):
            for line in rule["requires"]:
                req = Requirement(line)
                name = canonicalize_name(req.name)
                specs[name] = specs.get(name, SpecifierSet()) & req.specifier
                groups.setdefault(name, "run")
                bounds[name] = (req.specifier, f"without a GPU, Triton {triton}'s interpreter needs {req}")
    if ci:  # exactly what the GPU ran and CI tests with
        for name in specs:
            if name in tested:
                specs[name] &= SpecifierSet(f"=={tested[name]}")
                bounds.setdefault(name, (SpecifierSet(f"=={tested[name]}"), f"CI tests {name}=={tested[name]}"))
    out = []
    for name, spec in specs.items():
        found = version(name)
        pin = tested.get(name)
        ok = _contains(spec, found)
        why = None
        if not ok and _contains(listed.get(name, SpecifierSet()), found) and name in bounds:
            why = bounds[name][1]
        out.append(
            {
                "name": name,
                "spec": str(spec),
                "found": found,
                "tested": pin,
                "ok": ok,
                "install": f"{name}=={pin}" if _contains(spec, pin) else f"{name}{spec}",
                "hold": f"{name}=={found}" if ok else None,  # the pip constraint that keeps it as it is
                "group": groups[name],
                "why": why,
            }
        )
    return out


def describe(missing: list[dict]) -> str:
    parts = []
    for n in missing:
        has = f"{n['found']} installed" if n["found"] else "not installed"
        parts.append(f"{n['name']}{n['spec']} ({has})")
    return ", ".join(parts)


def by_group(missing: list[dict]) -> list[str]:
    """What is installed and why, one line per group: ``to run the tests: pytest==9.2.0 (not installed)``."""
    lines = []
    for group, purpose in GROUPS.items():
        parts = []
        for n in missing:
            if n["group"] != group:
                continue
            if n["found"] is None:
                state = "not installed"
            else:
                state = f"{n['found']} installed; " + (n["why"] or f"{n['name']}{n['spec']} needed")
            parts.append(f"{n['install']} ({state})")
        if parts:
            lines.append(f"{purpose}: " + ", ".join(parts))
    return lines


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
        if not _made_by_suite(venv):
            raise SystemExit(f"suite: {venv} exists and was not made by ./suite; move it or set SUITE_VENV")
        say(f"remaking {venv} on top of {sys.executable}")
        shutil.rmtree(venv)
    r = subprocess.run([sys.executable, "-m", "venv", str(venv)], stdout=sys.stderr)
    if r.returncode != 0:
        raise SystemExit(f"suite: `{sys.executable} -m venv` failed (on Debian/Ubuntu: apt install python3-venv)")
    python = _python_of(venv)
    # ensurepip puts a setuptools of its own into a venv before Python 3.12, which would hide this
    # interpreter's (and is too old to build the project): the venv keeps only its pip
    own = [str(python), "-m", "pip", "uninstall", "--yes", "--quiet", "--disable-pip-version-check", "setuptools"]
    if subprocess.run([str(python), "-c", "import setuptools"], capture_output=True).returncode == 0:
        subprocess.run(own, stdout=sys.stderr, check=True)
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


def conflicts(purpose: str) -> list[str]:
    """What the installed packages the suite uses (the requirements of ``purpose`` and theirs, recursively)
    require and do not find, one line each as pip's own check says it. The packages of the interpreter
    below that the suite never imports are left out: their conflicts are that interpreter's business."""
    from importlib import metadata

    found: dict[str, metadata.Distribution] = {}
    for dist in metadata.distributions():  # in sys.path order: the first of a name is the one imported
        if dist.metadata["Name"]:
            found.setdefault(canonicalize_name(dist.metadata["Name"]), dist)
    todo = [(n["name"], ()) for n in needs(purpose)]
    seen, out = set(), set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen or name not in found:
            continue
        seen.add((name, extras))
        dist = found[name]
        for line in dist.requires or []:
            try:
                req = Requirement(line)
                if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in ("", *extras)):
                    continue
            except Exception:  # a requirement or marker this packaging cannot read: pip's check skips it too
                continue
            dep = canonicalize_name(req.name)
            todo.append((dep, tuple(sorted(req.extras))))
            who = f"{dist.metadata['Name']} {dist.version} requires {req}"
            if dep not in found:
                out.add(f"{who}, which is not installed")
            elif not _contains(req.specifier, found[dep].version):
                out.add(f"{who}, but {found[dep].version} is installed")
    return sorted(out)


def locate(first: Path | None = None) -> dict:
    """Where this interpreter imports ``kernels`` and ``analysis`` from (the file, or None), with ``first``
    at the head of sys.path (the repository, as the pipeline and the tests put it there), and the folder of
    this project's editable install (``editable``, or None)."""
    import importlib.util
    from importlib import metadata
    from urllib.parse import unquote, urlparse

    saved = list(sys.path)
    if first is not None:
        sys.path.insert(0, str(first))
    try:
        out = {}
        for name in PACKAGES:
            spec = importlib.util.find_spec(name)
            where = None if spec is None else spec.origin or next(iter(spec.submodule_search_locations or ()), None)
            out[name] = where
    finally:
        sys.path[:] = saved
    out["editable"] = None
    try:
        direct = json.loads(metadata.distribution(project()["project"]["name"]).read_text("direct_url.json") or "{}")
    except metadata.PackageNotFoundError:
        direct = {}
    if direct.get("dir_info", {}).get("editable") and direct.get("url", "").startswith("file:"):
        out["editable"] = unquote(urlparse(direct["url"]).path)
    return out


def shadowed(located: dict) -> str | None:
    """What is wrong when ``located`` (from ``locate``) finds a package of this project somewhere else, and
    what to do about it; None when nothing is."""
    names = [
        name
        for name in PACKAGES
        if located[name] is not None and Path(located[name]).resolve() != (ROOT / name / "__init__.py").resolve()
    ]
    if not names:
        return None
    found = "; ".join(f"`import {n}` finds {located[n]}, not this project's {ROOT / n}" for n in names)
    return (
        f"{found}: another package of that name comes first (PyPI's `kernels` is Hugging Face's, unrelated to "
        f"this project); uninstall it from that Python (pip uninstall {' '.join(names)}) or use one without it"
    )


def _ask(python: Path, *args: str) -> list | dict:
    """Run this module's ``args`` in ``python`` (its --json answer)."""
    r = subprocess.run([str(python), __file__, *args], capture_output=True, text=True)
    if r.returncode not in (0, 1):
        raise SystemExit(f"suite: checking {python} failed:\n{r.stderr}")
    return json.loads(r.stdout)


def _check_in(python: Path, purpose: str, every: bool = False, build: bool = False) -> list[dict]:
    """What ``python`` lacks for ``purpose`` (``every``: every requirement, met or not; ``build``: the
    project's build backend too)."""
    return _ask(python, "check", purpose, "--json", *(["--every"] if every else []), *(["--build"] if build else []))


def _made_by_suite(venv: Path) -> bool:
    return (venv / LAYER_STAMP).is_file() or any(venv.glob(".installed-*"))  # (the stamp of the old ./suite)


def _same(path: str | None, other: Path) -> bool:
    return path is not None and Path(path).resolve() == other.resolve()


def _install(python: Path, purpose: str, venv: Path, missing: list[dict]) -> None:
    """pip installs ``missing`` into ``venv`` (whose python is ``python``), each requirement met already held
    as found; says what and why first, and afterwards any conflict among the suite's packages it brought."""
    below = "" if python == Path(sys.executable) else f", on top of {sys.executable} (whose packages stay in use)"
    say(f"{sys.executable} lacks some of what ./suite {purpose} needs; installing it into {venv}{below}:")
    for line in by_group(missing):
        say(f"  {line}")
    specs = [n["install"] for n in missing]
    names = {n["name"] for n in missing}
    # what is already met stays as found (no second torch, numpy, ... under the installed packages)
    held = [n["hold"] for n in _check_in(python, purpose, every=True) if n["hold"] and n["name"] not in names]
    before = set(_ask(python, "conflicts", purpose))
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(held) + "\n")
    try:
        code = subprocess.run([str(python), *PIP, "--constraint", f.name, *specs], stdout=sys.stderr).returncode
    finally:
        os.unlink(f.name)
    still = _check_in(python, purpose, build="build" in {n["group"] for n in missing})
    if code != 0 or still:
        raise SystemExit(
            f"suite: could not install {describe(still) or ' '.join(specs)} (pip's message is above). "
            "Without a package index, give pip a folder of wheels: PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR ./suite ..."
        )
    for line in _ask(python, "conflicts", purpose):
        if line not in before:
            say(f"warning: after this install, {line}")


def _imports_checked(python: Path, located: dict) -> Path:
    problem = shadowed(located)
    if problem:
        raise SystemExit(f"suite: in {python}, {problem}")
    return python


def prepare(purpose: str, venv: Path) -> Path:
    """The interpreter that has everything ``purpose`` needs: this one, or ``venv`` layered on it with what
    it lacks and this project (editable) installed. Silent when nothing is installed; exits with one message
    naming what could not be installed, or the other package that ``import kernels`` would find."""
    here = Path(sys.prefix).resolve() == venv.resolve()
    if Requirement is None:
        say(f"{sys.executable} has neither packaging nor pip to check its packages with; checking in {venv}")
    elif all(n["ok"] for n in needs(purpose)):
        # nothing to install, unless this is the venv ./suite made and the project is not in it yet
        if not (here and _made_by_suite(venv)) or _same(locate()["editable"], ROOT):
            return _imports_checked(Path(sys.executable), locate(ROOT))
    if here and not _made_by_suite(venv):  # never install into an interpreter ./suite did not make
        raise SystemExit(
            f"suite: {venv} was not made by ./suite, which installs only into a venv it made; move it, or set "
            "SUITE_VENV to another folder (a venv is then made there, on top of this one)"
        )
    python = Path(sys.executable) if here else layer(venv)
    install_project = not _same(_ask(python, "locate")["editable"], ROOT)
    missing = _check_in(python, purpose, build=install_project)
    if missing:
        _install(python, purpose, venv, missing)
    if install_project:
        say(
            f"installing this project into {venv}, editable and without its dependencies (pip install --no-deps -e .), "
            "so that its python imports kernels and analysis from any folder"
        )
        cmd = [str(python), *PIP, "--no-deps", "--no-build-isolation", "--editable", str(ROOT)]
        if subprocess.run(cmd, stdout=sys.stderr).returncode != 0:
            raise SystemExit(f"suite: could not install this project into {venv} (pip's message is above)")
    problem = shadowed(_ask(python, "locate"))
    if problem:  # the suite itself imports the repository's; a script elsewhere would get the other one
        say(f"warning: outside the repository, {problem}")
    return _imports_checked(python, _ask(python, "locate", "--repo"))


def main(argv: list[str]) -> int:
    command = argv[0] if argv else None
    if command == "locate":
        print(json.dumps(locate(ROOT if "--repo" in argv else None)))
        return 0
    if len(argv) < 2 or command not in ("check", "prepare", "conflicts") or argv[1] not in PURPOSES:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    if command == "conflicts":
        print(json.dumps(conflicts(argv[1])))
        return 0
    if command == "check":
        result = needs(argv[1], build="--build" in argv)
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
