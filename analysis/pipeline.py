"""What the workflow's scripts do, as plain functions (the scripts only unpack ``snakemake`` and call these).

One of each stage for every family, through the registry (``analysis.registry``): ``run_shard`` measures one
shard of a family, ``collect`` makes one table of a GPU's shards, ``render_figures`` draws a family's figures
of one GPU, ``render_comparison`` a family's figures over every GPU, ``run_audit`` judges every claim and
``render_report`` writes the report. Keeping them here, not in ``workflow/scripts``, lets the tests call every
stage without Snakemake.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import pandas as pd

from analysis import registry
from analysis.core import outputs, validate
from analysis.core.provenance import CPU_SLUG

log = logging.getLogger("pipeline")
VERDICTS_SCHEMA = "verdicts.schema.yaml"


def setup_logging(log_path: str | Path | None) -> None:
    """Send this job's log lines (progress included) to its Snakemake log file and to stderr."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_path, mode="w"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", handlers=handlers, force=True)


def check_gpu(expected_gpu: str) -> dict:
    """This job's environment; fails clearly if the job landed on another GPU type than asked for."""
    from analysis.core.provenance import environment

    env = environment()
    if env["gpu"] != expected_gpu:
        message = (
            f"results for GPU type {expected_gpu!r} were requested, but this job runs on "
            f"{env['gpu_name']!r} (type {env['gpu']!r}); run on a {expected_gpu} node or set gpus: auto"
        )
        log.error(message)  # into the job's log file too, not only the traceback on stderr
        raise RuntimeError(message)
    return env


def record_environment(
    expected_gpu: str, out_json: str | Path, out_packages: str | Path | None = None, extra: dict | None = None
) -> dict:
    """Write the environment of a result set after checking the GPU type; with ``out_packages``, also
    the snapshot of every installed Python package (name==version, one a line). ``peers``: the official
    kernels measured beside ours and their packages' versions (None: not installed;
    ``analysis.families._shared.peers``). ``extra``: fields the workflow adds (``gpu_count``: how many GPUs
    of this type the run's jobs were spread over)."""
    from analysis.core.provenance import installed_packages
    from analysis.families._shared import peers

    env = {**check_gpu(expected_gpu), "peers": peers.versions(), **(extra or {})}
    outputs.write_text(out_json, json.dumps(env, indent=2, sort_keys=True) + "\n")
    if out_packages:
        outputs.write_text(out_packages, "\n".join(installed_packages()) + "\n")
    log.info("environment: %s", env)
    return env


def preload_family(family: str) -> None:
    """Import ``family``'s measuring code (torch, Triton, its kernels) without starting CUDA, so that a job can
    do it before it is given its GPU (``CUDA_VISIBLE_DEVICES`` is read when CUDA starts). Raises
    ``RuntimeError`` if an import started CUDA: the GPU the job is then given would not be the one it uses."""
    registry.family(family).run()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError(f"importing the {family} family's measuring code started CUDA; it must not")


def _same_measured_code(recorded: dict, env: dict, env_json) -> None:
    """A job's rows carry its result set's provenance: refuse to measure when the measured code on disk is not
    what ``environment.json`` recorded (edited after the environment step)."""
    if "measured_code" not in recorded:
        return
    from analysis.core.provenance import code_changes

    differ = code_changes(recorded["measured_code"], env["measured_code"])
    if differ:
        raise RuntimeError(
            f"the measured code changed since {env_json} was written ({', '.join(differ[:8])}): "
            "delete it, and the workflow records the code that runs before measuring it"
        )


def run_shard(
    family: str,
    fields: dict,
    out_csv: str | Path,
    *,
    env_json: str | Path | None = None,
    files: str | Path | None = None,
    check: bool = False,
) -> pd.DataFrame:
    """Measure one shard of ``family`` and write its rows to ``out_csv`` (a CSV of the family's table).

    On a GPU result set (``env_json``: its ``environment.json``) the job first checks that it runs on that GPU
    type; the CPU result set (``cpu``) runs in Triton's interpreter. ``check``: one of the family's
    interpreter checks (correctness only, on the CPU). A GPU-independent family (scope ``machine``) runs on this
    machine as it is. ``files``: a folder for the job's side files (the raw profiler output, say)."""
    from analysis.core.provenance import environment

    fam = registry.family(family)
    if check or fam.scope == "machine":
        if check and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError("set TRITON_INTERPRET=1 before Triton is imported (the workflow's rule does)")
        import torch

        if check:
            torch.set_num_threads(1)
        env, device = environment(), "cpu"
    else:
        recorded = validate.read_environment(env_json)
        env = check_gpu(recorded["gpu"])
        _same_measured_code(recorded, env, env_json)
        device = "cpu" if env["gpu"] == CPU_SLUG else "cuda"
    spec = fam.plan.spec(fields)
    log.info("shard %s of %s: %d points", Path(out_csv).stem, family, spec.points())
    rows = fam.run()(spec, env, device, log.info, files)
    df = registry.table(fam.table).write_rows(rows, out_csv)
    log.info("%d rows in %s; statuses %s", len(df), out_csv, _statuses(df))
    return df


def _statuses(df: pd.DataFrame) -> dict:
    return df.groupby("status").size().to_dict() if len(df) else {}


def collect(table: str, inputs, out_csv: str | Path) -> pd.DataFrame:
    """Concatenate the shards of one table (each file validated) into one table, written through a
    temporary file, with a line of its statuses."""
    inputs = list(inputs)
    df = registry.table(table).read_rows(inputs)
    outputs.write_csv(df, out_csv)
    log.info(
        "collected %d %s rows from %d files into %s; statuses %s", len(df), table, len(inputs), out_csv, _statuses(df)
    )
    return df


def _logged(entries: list[dict]) -> list[dict]:
    """A figure manifest's entries, each skipped figure logged with its reason."""
    for e in entries:
        if e["reason"]:
            log.info("figure %s skipped: %s", e["name"], e["reason"])
    return entries


def render_figures(family: str, table_csv: str | Path, out_dir: str | Path) -> list[dict]:
    """Draw every figure of ``family`` from one GPU's table; writes ``manifest.json`` listing what was drawn
    or skipped."""
    from analysis.core import plotting

    fam = registry.family(family)
    df = registry.table(fam.table).read_rows([table_csv])
    return _logged(plotting.render_all(df, out_dir, fam.figures(), fam.caption, str(table_csv)))


def render_comparison(family: str, table_files: dict[str, str | Path], out_dir: str | Path) -> list[dict]:
    """The GPU types side by side: ``family``'s comparison figures over every GPU's table, with a manifest."""
    from analysis.core import plotting

    fam = registry.family(family)
    table = registry.table(fam.table)
    df = pd.concat([table.read_rows([p]) for p in table_files.values()], ignore_index=True)
    sources = ", ".join(map(str, table_files.values()))
    return _logged(plotting.render_all(df, out_dir, fam.comparison(), fam.caption, sources))


def read_context(tables: dict[str, dict[str, str | Path]]):
    """The audit's context: every table of ``tables`` (name → GPU → file; a GPU-independent table under
    ``"-"``) read with its reader, each file validated."""
    from analysis.audit import Context, Results

    ctx = Context()
    for name, files in tables.items():
        reader = registry.table(name)
        ctx.tables[name] = Results(
            {g: reader.read_rows([p]) for g, p in files.items()}, {g: str(p) for g, p in files.items()}
        )
    return ctx


def run_audit(tables: dict[str, dict[str, str | Path]], out_csv: str | Path) -> pd.DataFrame:
    """Evaluate every claim (the articles' registry and the families' own claims) against the models and
    ``tables`` (see ``read_context``); write the verdicts."""
    from analysis import audit

    claims = registry.claims()
    verdicts = audit.audit(claims, read_context(tables), registry.evaluators())
    outputs.write_csv(verdicts, out_csv)
    wholes = len({(c.whole or c).id for c in claims})
    log.info(
        "audited %d claims (%d counting each part of a compound claim) into %d verdict rows (a measured claim "
        "has one per GPU type): %s",
        wholes,
        len(claims),
        len(verdicts),
        audit.summary(verdicts),
    )
    return verdicts


def render_report(
    gpus: list[dict],
    checks_csv: str | Path | None,
    out_html: str | Path,
    verdicts_csv: str | Path | None = None,
    comparison_dirs: list[str | Path] | None = None,
    notices: list[str] | None = None,
) -> Path:
    """Render the HTML report. ``gpus``: dicts with slug, source, environment, ``tables`` (table name → file)
    and ``figures`` (the figure folders of its families, in order). Every file read is validated first
    (``analysis.core.validate``), and the report is written through a temporary file, so a bad input fails
    this step with the file named and leaves the previous report in place. ``checks_csv``: the interpreter
    checks (rows of the table ``registry.checks_table`` names); ``comparison_dirs``: the cross-GPU figure
    folders; ``notices``: banners at the top (e.g. that no shipped results are included)."""
    from analysis import report
    from analysis.core.provenance import git_sha, now_utc

    sections = []
    for g in gpus:
        manifest = [e for d in g.get("figures", []) for e in validate.read_figure_manifest(Path(d) / "manifest.json")]
        sections.append(
            {
                "slug": g["slug"],
                "source": g["source"],
                "provenance": validate.read_environment(g["environment"], g["slug"]),
                "figures": manifest,
                "tables": {name: registry.table(name).read_rows([p]) for name, p in g.get("tables", {}).items()},
                "manifest": _manifest_beside(g.get("tables", {})),
            }
        )
    checks = registry.table(registry.checks_table()).read_rows([checks_csv]) if checks_csv else None
    generated = {"timestamp": now_utc(), "git_sha": git_sha()}
    verdicts = validate.read_csv(verdicts_csv, VERDICTS_SCHEMA, keep_default_na=False) if verdicts_csv else None
    comparison = [e for d in comparison_dirs or [] for e in validate.read_figure_manifest(Path(d) / "manifest.json")]
    return report.render_report(
        out_html,
        sections,
        checks,
        generated=generated,
        verdicts=verdicts,
        comparison=comparison or None,
        notices=notices,
    )


def _manifest_beside(tables: dict) -> dict | None:
    """The MANIFEST.json of a shipped result set, next to its tables (None for a fresh run's tables)."""
    for table in tables.values():
        path = Path(table).parent / "MANIFEST.json"
        if not path.is_file():
            continue
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise validate.DataError(f"{path}: not valid JSON ({exc})") from None
    return None
