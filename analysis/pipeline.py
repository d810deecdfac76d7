"""What the workflow's scripts do, as plain functions (the scripts only unpack ``snakemake`` and call these).

Keeping this here, not in ``workflow/scripts``, lets the tests call every stage without Snakemake.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import pandas as pd

from analysis import outputs, tables, validate

log = logging.getLogger("pipeline")


def setup_logging(log_path: str | Path | None) -> None:
    """Send this job's log lines (progress included) to its Snakemake log file and to stderr."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_path, mode="w"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", handlers=handlers, force=True)


def check_gpu(expected_gpu: str) -> dict:
    """This job's environment; fails clearly if the job landed on another GPU type than asked for."""
    from analysis.provenance import environment

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
    the snapshot of every installed Python package (name==version, one a line). ``extra``: fields the
    workflow adds (``gpu_count``: how many GPUs of this type the run's jobs were spread over)."""
    from analysis.provenance import installed_packages

    env = {**check_gpu(expected_gpu), **(extra or {})}
    outputs.write_text(out_json, json.dumps(env, indent=2, sort_keys=True) + "\n")
    if out_packages:
        outputs.write_text(out_packages, "\n".join(installed_packages()) + "\n")
    log.info("environment: %s", env)
    return env


def run_attention_shard(spec: dict, env_json: str | Path, out_csv: str | Path) -> pd.DataFrame:
    """Measure one attention shard on this GPU and write its rows."""
    from analysis.experiments import attention

    env = check_gpu(validate.read_environment(env_json)["gpu"])
    s = attention.Spec(**spec)
    log.info("shard %s: %d points", Path(out_csv).stem, s.points())
    rows = attention.run(s, env, device="cuda", log_line=log.info)
    return tables.write_rows(rows, out_csv)


def run_interpreter_check(spec: dict, out_csv: str | Path) -> pd.DataFrame:
    """Check our kernel in Triton's interpreter on the CPU (correctness only) and write the rows."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("set TRITON_INTERPRET=1 before Triton is imported (the workflow's rule does)")
    import torch

    from analysis.experiments import attention
    from analysis.provenance import environment

    torch.set_num_threads(1)
    s = attention.Spec(**spec)
    rows = attention.run(s, environment(), device="cpu", log_line=log.info)
    return tables.write_rows(rows, out_csv)


def run_ops_shard(fields: dict, env_json: str | Path, out_csv: str | Path) -> pd.DataFrame:
    """Measure one shard of the operator experiments (W4A16 or MoE) on this GPU and write its rows."""
    from analysis import ops_tables
    from analysis.experiments import moe, ops_grid, quant

    env = check_gpu(validate.read_environment(env_json)["gpu"])
    spec = ops_grid.spec_of(fields)
    log.info("shard %s: %d points", Path(out_csv).stem, spec.points())
    module = quant if fields["family"] == "quant" else moe
    rows = module.run(spec, env, device="cuda", log_line=log.info)
    return ops_tables.write_rows(rows, out_csv)


def collect_ops(inputs, out_csv: str | Path) -> pd.DataFrame:
    """Concatenate the ops shards of a GPU into one table."""
    from analysis import ops_tables

    return _collect(ops_tables.read_rows, inputs, out_csv, "ops rows")


def render_ops_figures(table_csv: str | Path, out_dir: str | Path) -> list[dict]:
    """Draw the W4A16 and MoE figures of one GPU's ops table, with their manifest."""
    from analysis import ops_figures, ops_tables

    return _logged(ops_figures.render_all(ops_tables.read_rows([table_csv]), out_dir, table_source=str(table_csv)))


def collect(inputs, out_csv: str | Path) -> pd.DataFrame:
    """Concatenate per-job result files into one table."""
    return _collect(tables.read_rows, inputs, out_csv, "rows")


def _collect(read_rows, inputs, out_csv: str | Path, what: str) -> pd.DataFrame:
    """``read_rows(inputs)`` written to ``out_csv`` (through a temporary file), with a line of its statuses."""
    df = read_rows(inputs)
    tables.write_frame(df, out_csv)
    counts = df.groupby("status").size().to_dict() if len(df) else {}
    log.info("collected %d %s from %d files into %s; statuses %s", len(df), what, len(list(inputs)), out_csv, counts)
    return df


def render_figures(table_csv: str | Path, out_dir: str | Path) -> list[dict]:
    """Draw every figure for one GPU's table; writes ``manifest.json`` listing what was drawn or skipped."""
    from analysis import figures

    return _logged(figures.render_all(tables.read_rows([table_csv]), out_dir, table_source=str(table_csv)))


def _logged(entries: list[dict]) -> list[dict]:
    """A figure manifest's entries, each skipped figure logged with its reason."""
    for e in entries:
        if e["reason"]:
            log.info("figure %s skipped: %s", e["name"], e["reason"])
    return entries


def render_comparison(table_files: dict[str, str | Path], out_dir: str | Path) -> list[dict]:
    """The GPU types side by side (one figure over every GPU's table), with its manifest."""
    from analysis import figures

    df = pd.concat([tables.read_rows([p]) for p in table_files.values()], ignore_index=True)
    return figures.render_all(df, out_dir, figures.COMPARISON_FIGURES, ", ".join(map(str, table_files.values())))


def run_audit(
    table_files: dict[str, str | Path],
    out_csv: str | Path,
    traffic_files: dict[str, str | Path] | None = None,
    ops_files: dict[str, str | Path] | None = None,
    compiled_file: str | Path | None = None,
) -> pd.DataFrame:
    """Evaluate every claim of the registry against the models and each GPU's tables (and the compiled-kernel
    table, GPU-independent); write the verdicts."""
    from analysis import audit

    claims = audit.load_registry()
    ctx = audit.Context.from_files(table_files, traffic_files, ops_files, compiled_file)
    verdicts = audit.audit(claims, ctx)
    outputs.write_csv(verdicts, out_csv)
    log.info("audited %d claims into %d verdict rows: %s", len(claims), len(verdicts), audit.summary(verdicts))
    return verdicts


def run_compiled(section: dict, out_csv: str | Path, workers: int = 1) -> pd.DataFrame:
    """Compile the kernel variants of the ``compiled`` config section and write one row each."""
    from analysis.experiments import compiled

    rows = compiled.run(section, workers=workers)
    df = pd.DataFrame(rows)
    outputs.write_csv(df, out_csv)
    log.info("compiled %d kernel variants (%d failed)", len(df), int((df["status"] != "ok").sum()))
    return df


def render_report(
    gpus: list[dict],
    checks_csv: str | Path | None,
    out_html: str | Path,
    verdicts_csv: str | Path | None = None,
    comparison_dir: str | Path | None = None,
    notices: list[str] | None = None,
) -> Path:
    """Render the HTML report. ``gpus``: dicts with slug, source, table, environment, figures_dir. Every file
    read is validated first (``analysis.validate``), and the report is written through a temporary file,
    so a bad input fails this step with the file named and leaves the previous report in place.
    ``notices``: banners at the top (e.g. that no shipped results are included)."""
    from analysis import ops_tables, report
    from analysis.provenance import git_sha, now_utc

    sections = []
    for g in gpus:
        manifest = validate.read_figure_manifest(Path(g["figures_dir"]) / "manifest.json")
        if g.get("traffic_figures_dir"):  # the HBM traffic figures, after the attention ones
            manifest += validate.read_figure_manifest(Path(g["traffic_figures_dir"]) / "manifest.json")
        if g.get("ops_figures_dir"):  # the W4A16 and MoE figures, in their own sections
            manifest += validate.read_figure_manifest(Path(g["ops_figures_dir"]) / "manifest.json")
        sections.append(
            {
                "slug": g["slug"],
                "source": g["source"],
                "provenance": validate.read_environment(g["environment"], g["slug"]),
                "figures": manifest,
                "table": tables.read_rows([g["table"]]),
                "ops_table": ops_tables.read_rows([g["ops_table"]]) if g.get("ops_table") else None,
                "manifest": _manifest_beside(g["table"]),
            }
        )
    checks = tables.read_rows([checks_csv]) if checks_csv else None
    generated = {"timestamp": now_utc(), "git_sha": git_sha()}
    verdicts = validate.read_csv(verdicts_csv, VERDICTS_SCHEMA, keep_default_na=False) if verdicts_csv else None
    comparison = validate.read_figure_manifest(Path(comparison_dir) / "manifest.json") if comparison_dir else None
    return report.render_report(
        out_html, sections, checks, generated=generated, verdicts=verdicts, comparison=comparison, notices=notices
    )


VERDICTS_SCHEMA = "verdicts.schema.yaml"


def _manifest_beside(table: str | Path) -> dict | None:
    """The MANIFEST.json of a shipped result set, next to its table (None for a fresh run's table)."""
    path = Path(table).parent / "MANIFEST.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise validate.DataError(f"{path}: not valid JSON ({exc})") from None
