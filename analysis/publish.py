"""Publish a GPU's measured results as the repository's reference set, unedited.

    python -m analysis.publish --gpu h200 [--results results] [--dest reports/reference] [--command "..."]

Copies, byte for byte, what the pipeline wrote for that GPU type: the collected table
(``attention.csv``), the per-job tables, ``environment.json``, the job logs, the figures with their
tables, the Nsight Compute traffic table with its raw output and figures where that experiment ran, and
the W4A16/MoE table (``ops.csv``) with its per-job tables and figures where those ran; then writes
``MANIFEST.json`` (SHA-256 of every copied file, the commit and environment they came from, when and with
what command they were made) so that a reader can check that nothing was edited after the run. It refuses
to publish a table whose rows name another GPU type, or a mix of commits unless ``--allow-mixed`` is given
(a run resumed after a commit): then the manifest lists the rows per commit and every file under the
measured code (kernels/, analysis/experiments/, the harness, the FLOP model, the benchmark scripts) that
differs between those commits, from ``git diff``, so that a reader can judge whether the rows are comparable.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

from analysis.core import outputs, tables, validate
from analysis.core.provenance import now_utc


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# what a result row depends on: a difference here between two commits can change a measurement
MEASURED_CODE = ["kernels", "analysis/experiments", "analysis/core/harness.py", "analysis/core/flops.py",
                 "analysis/core/models.py", "workflow/scripts/attention_benchmark.py",
                 "workflow/scripts/ops_benchmark.py"]  # fmt: skip


def measured_code_diff(shas: list[str], repo: Path | None = None) -> dict[str, list[str]]:
    """Files of ``MEASURED_CODE`` that differ between the first commit and each later one (``git diff``)."""
    repo = repo or Path(__file__).resolve().parents[1]
    out = {}
    for other in shas[1:]:
        names = subprocess.run(
            ["git", "diff", "--name-only", shas[0], other, "--", *MEASURED_CODE],
            cwd=repo, capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        out[f"{shas[0][:12]}..{other[:12]}"] = names
    return out


def _rows_per_commit(df, gpu: str, path: Path):
    """Rows per git commit of a results table, which must hold rows of ``gpu`` alone."""
    gpus = set(df["gpu"].dropna().astype(str))
    if gpus != {gpu}:
        raise ValueError(f"{path} holds rows of GPU types {sorted(gpus)}, expected only {gpu!r}")
    return df["git_sha"].dropna().astype(str).value_counts()


def publish(gpu: str, results: Path, dest: Path, command: str = "", allow_mixed: bool = False) -> Path:
    src = results / gpu
    table = src / "attention.csv"
    env_json = src / "environment.json"
    for required in (table, env_json):
        if not required.is_file():
            raise FileNotFoundError(f"{required} is missing: run the pipeline on a {gpu} GPU first")
    df = tables.read_rows([table])
    per_sha = _rows_per_commit(df, gpu, table)
    shas = sorted(per_sha.index, key=lambda sha: -per_sha[sha])  # the commit of most rows first
    if len(shas) != 1 and not allow_mixed:
        raise ValueError(
            f"{table} mixes results of several commits {shas}; rerun from one commit (or publish with "
            "--allow-mixed, which records the rows and code changes per commit)"
        )

    # the W4A16/MoE rows, where they ran: their own counts and commits (checked before anything is written)
    all_shas, ops_summary = list(shas), {}
    if (src / "ops.csv").is_file():
        from analysis import ops_tables

        ops = ops_tables.read_rows([src / "ops.csv"])
        ops_per_sha = _rows_per_commit(ops, gpu, src / "ops.csv")
        ops_summary = {
            "rows": int(len(ops)),
            "statuses": {k: int(v) for k, v in ops["status"].value_counts().items()},
            "rows_per_commit": {sha: int(n) for sha, n in ops_per_sha.items()},
        }
        all_shas += [sha for sha in ops_per_sha.index if sha not in all_shas]
    if len(all_shas) > 1 and not allow_mixed:
        raise ValueError(f"{src / 'ops.csv'} and {table} mix results of several commits {all_shas}; see --allow-mixed")

    out = dest / gpu
    if out.exists():
        shutil.rmtree(out)
    copies = {
        table: out / "attention.csv",
        env_json: out / "environment.json",
    }
    if (src / "packages.txt").is_file():
        copies[src / "packages.txt"] = out / "packages.txt"
    for f in sorted((src / "attention").glob("*.csv")):
        copies[f] = out / "jobs" / f.name
    for f in sorted((results / "logs" / gpu).rglob("*.log")):
        copies[f] = out / "logs" / f.relative_to(results / "logs" / gpu)
    for f in sorted((results / "report" / gpu).glob("*")):
        if f.suffix in (".png", ".csv", ".json"):
            copies[f] = out / "figures" / f.name
    # the Nsight Compute traffic experiment, where it ran: its table, the raw ncu output and its figures
    if (src / "traffic.csv").is_file():
        copies[src / "traffic.csv"] = out / "traffic.csv"
        for f in sorted((src / "traffic_raw").rglob("*")):
            if f.is_file():
                copies[f] = out / "traffic_raw" / f.relative_to(src / "traffic_raw")
        for f in sorted((results / "report" / "traffic" / gpu).glob("*")):
            if f.suffix in (".png", ".csv", ".json"):
                copies[f] = out / "figures" / "traffic" / f.name
    # the W4A16 and MoE experiments, where they ran: their table, the per-job tables and their figures
    if (src / "ops.csv").is_file():
        copies[src / "ops.csv"] = out / "ops.csv"
        for f in sorted((src / "ops").glob("*.csv")):
            copies[f] = out / "jobs" / "ops" / f.name
        for f in sorted((results / "report" / "ops" / gpu).glob("*")):
            if f.suffix in (".png", ".csv", ".json"):
                copies[f] = out / "figures" / "ops" / f.name
    for s, d in copies.items():
        d.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(s, d)

    manifest = {
        "gpu": gpu,
        "git_sha": shas[0],
        "published": now_utc(),
        "command": command,
        "rows": int(len(df)),
        "statuses": {k: int(v) for k, v in df["status"].value_counts().items()},
        "environment": validate.read_environment(env_json, gpu),
        "files": {str(d.relative_to(out)): _sha256(d) for d in sorted(copies.values())},
    }
    if ops_summary:
        manifest["ops"] = ops_summary
    if len(shas) > 1:
        manifest["rows_per_commit"] = {sha: int(per_sha[sha]) for sha in shas}
    if len(all_shas) > 1:
        manifest["measured_code_changes"] = measured_code_diff(all_shas)
    # written last, and whole: a set without its manifest is refused by the workflow (analysis.reference)
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
