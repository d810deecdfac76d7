"""Publish a GPU's measured results as the repository's reference set, unedited.

    python -m analysis.publish --gpu h200 [--results results] [--dest reports/reference] [--command "..."]

Copies, byte for byte, what the pipeline wrote for that GPU type: every collected table of the registry
(``<table>.csv``: ``attention.csv``, ``ops.csv``, ``traffic.csv``, ...), ``environment.json`` and
``packages.txt``, each family's per-job tables (``jobs/<family>/``), the job logs with their side files
(``logs/``: the raw Nsight Compute output, say) and the figures with their tables (``figures/<family>/``);
then writes ``MANIFEST.json`` (SHA-256 of every copied file, the rows per table, the commit and environment
they came from, when and with what command they were made) so that a reader can check that nothing was
edited after the run. A result set's ``summary.md`` is derived from its tables, so it is not published
(rule ``summary`` writes it beside them). It refuses to publish a table whose rows name another GPU type,
or a mix of commits unless ``--allow-mixed`` is given (a run resumed after a commit): then the manifest
lists the rows per commit and every file under the measured code (``MEASURED_CODE``) that differs between
those commits, from ``git diff``, so that a reader can judge whether the rows are comparable. It refuses a run
whose measured code, as ``environment.json`` records it, is not its commit's (``check_measured_code``).
Everything is checked before anything is written.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

from analysis import registry
from analysis.core import outputs, validate
from analysis.core.provenance import GIT_SHA_ENV, MEASURED_CODE, code_changes, measured_code_at, now_utc


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def measured_code_diff(shas: list[str], repo: Path | None = None) -> dict[str, list[str]]:
    """Files of ``MEASURED_CODE`` that differ between the first commit and each later one (``git diff``)."""
    repo = repo or Path(__file__).resolve().parents[1]
    out = {}
    for other in shas[1:]:
        names = subprocess.run(
            ["git", "diff", "--name-only", shas[0], other, "--", *MEASURED_CODE],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        out[f"{shas[0][:12]}..{other[:12]}"] = names
    return out


def check_measured_code(env: dict, env_json: Path, repo: Path | None = None) -> bool:
    """Refuse a run whose measured code is not its commit's: ``environment.json``'s ``measured_code`` (the
    files as the run found them on disk) against ``git ls-tree`` of its ``git_sha``. This catches a commit
    pinned through the environment that is not the code that ran, and edits made before the run but not
    committed. True when checked; False for an environment written before the record existed."""
    ran = env.get("measured_code")
    if ran is None:
        return False
    sha = env["git_sha"].removesuffix("-dirty")
    try:
        committed = measured_code_at(sha, repo)
    except (OSError, subprocess.SubprocessError) as e:
        raise ValueError(
            f"{env_json}: its commit {sha!r} cannot be read from this repository ({e}); publish from "
            "a clone that has it"
        ) from e
    differ = code_changes(ran, committed)
    if differ:
        listed = ", ".join(differ[:8]) + (f" and {len(differ) - 8} more" if len(differ) > 8 else "")
        raise ValueError(
            f"{env_json}: the measured code that ran is not commit {sha[:12]}'s ({listed} differ): a stale "
            f"{GIT_SHA_ENV}, or edits not committed before the run; rerun from the commit"
        )
    return True


def _rows_per_commit(df, gpu: str, path: Path):
    """Rows per git commit of a results table, which must hold rows of ``gpu`` alone."""
    gpus = set(df["gpu"].dropna().astype(str))
    if gpus != {gpu}:
        raise ValueError(f"{path} holds rows of GPU types {sorted(gpus)}, expected only {gpu!r}")
    return df["git_sha"].dropna().astype(str).value_counts()


def _summary(df, gpu: str, path: Path) -> dict:
    per_sha = _rows_per_commit(df, gpu, path)
    return {
        "rows": int(len(df)),
        "statuses": {k: int(v) for k, v in df["status"].value_counts().items()},
        "rows_per_commit": {sha: int(n) for sha, n in per_sha.items()},
    }


def _files(folder: Path, suffixes: tuple[str, ...] | None = None) -> list[Path]:
    return [f for f in sorted(folder.rglob("*")) if f.is_file() and (suffixes is None or f.suffix in suffixes)]


def publish(gpu: str, results: Path, dest: Path, command: str = "", allow_mixed: bool = False) -> Path:
    src = results / gpu
    env_json = src / "environment.json"
    if not env_json.is_file():
        raise FileNotFoundError(f"{env_json} is missing: run the pipeline on a {gpu} GPU first")
    found = {
        name: t
        for name, t in registry.tables().items()
        if (src / f"{name}.csv").is_file() and registry.of_table(name)[0].scope == "gpu"
    }
    if not found:
        raise FileNotFoundError(
            f"{src} holds no result table ({', '.join(registry.tables())}): run the pipeline on a {gpu} GPU first"
        )
    summaries = {
        name: _summary(t.read_rows([src / f"{name}.csv"]), gpu, src / f"{name}.csv") for name, t in found.items()
    }
    per_sha: dict[str, int] = {}
    for summary in summaries.values():
        for sha, n in summary["rows_per_commit"].items():
            per_sha[sha] = per_sha.get(sha, 0) + n
    shas = sorted(per_sha, key=lambda sha: -per_sha[sha])  # the commit of most rows first
    if len(shas) > 1 and not allow_mixed:
        raise ValueError(
            f"{', '.join(f'{n}.csv' for n in found)} in {src} mix results of several commits {shas}; rerun from "
            "one commit (or publish with --allow-mixed, which records the rows and code changes per commit)"
        )

    environment = validate.read_environment(env_json, gpu)
    code_checked = check_measured_code(environment, env_json)

    out = dest / gpu
    copies = {src / f"{name}.csv": out / f"{name}.csv" for name in found}
    copies[env_json] = out / "environment.json"
    if (src / "packages.txt").is_file():
        copies[src / "packages.txt"] = out / "packages.txt"
    for name in found:
        for fam in registry.of_table(name):
            for f in _files(src / fam.name, (".csv",)):
                copies[f] = out / "jobs" / fam.name / f.relative_to(src / fam.name)
            for f in _files(results / "report" / gpu / fam.name, (".png", ".csv", ".json")):
                copies[f] = out / "figures" / fam.name / f.name
    for f in _files(results / "logs" / gpu):
        copies[f] = out / "logs" / f.relative_to(results / "logs" / gpu)
    if out.exists():
        shutil.rmtree(out)
    for s, d in copies.items():
        d.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(s, d)

    manifest = {
        "gpu": gpu,
        "git_sha": shas[0],
        "published": now_utc(),
        "command": command,
        "rows": sum(s["rows"] for s in summaries.values()),
        "tables": summaries,
        "environment": environment,
        "measured_code_checked": code_checked,
        "files": {str(d.relative_to(out)): _sha256(d) for d in sorted(copies.values())},
    }
    if len(shas) > 1:
        manifest["rows_per_commit"] = {sha: per_sha[sha] for sha in shas}
        manifest["measured_code_changes"] = measured_code_diff(shas)
    # written last, and whole: a set without its manifest is refused by the workflow (analysis.core.shipped)
    outputs.write_text(out / "MANIFEST.json", json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", required=True, help="GPU type slug, e.g. h200")
    ap.add_argument("--results", default="results", type=Path, help="the pipeline's results_dir")
    ap.add_argument("--dest", default="reports/reference", type=Path, help="reference folder")
    ap.add_argument("--command", default="", help="the command that produced the results, for the manifest")
    ap.add_argument(
        "--allow-mixed",
        action="store_true",
        help="accept rows of several commits (a resumed run); the manifest lists them and the code diff",
    )
    args = ap.parse_args(argv)
    out = publish(args.gpu, args.results, args.dest, args.command, allow_mixed=args.allow_mixed)
    print(f"published {args.gpu} results to {out}")


if __name__ == "__main__":
    main()
