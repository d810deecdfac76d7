# Shared definitions: which GPU types are measured, which shards every family has, where tables live.
import os
import sys
from pathlib import Path

sys.path.insert(
    0, str(Path(workflow.basedir))
)  # the analysis/kernels packages, even if not installed

import re

from snakemake.exceptions import WorkflowError

from analysis import registry
from analysis.core import shipped
from analysis.core.provenance import CPU_SLUG, detect_gpu_slug

RESULTS = config["results_dir"]
# None (null in a config file, "null" on the command line): the user opted out of shipped results
REFERENCE = (
    None if config["reference_dir"] in (None, "null") else config["reference_dir"]
)
FAMILIES = registry.FAMILIES
try:  # every shipped result set checked against its manifest now, not discovered missing in the report
    SHIPPED = shipped.verified_gpus(REFERENCE)
except shipped.ShippedSetError as exc:
    raise WorkflowError(str(exc)) from None


def figure_captions():
    """Every figure's caption, by figure name (the .rst files of the caption folders), for the captions of
    Snakemake's own report (reports/captions/figure.rst picks a figure's by its name).
    """
    root = Path(workflow.basedir)
    folders = [root / "reports" / "captions", *root.glob("analysis/**/captions")]
    return {
        p.stem: " ".join(p.read_text(encoding="utf-8").split())
        for folder in folders
        for p in sorted(folder.glob("*.rst"))
    }


FIGURE_CAPTIONS = figure_captions()


def gpu_limit():
    """The run's `--resources gpu=N` (None when it sets none). N caps the GPU jobs running at once and the
    device pool they take their GPUs from (workflow/scripts/_gpu_pool.py); 0 (the cpu profile) measures
    nothing, whatever `gpus` says."""
    try:
        value = workflow.resource_settings.resources.get("gpu")
    except AttributeError:  # a Snakemake that keeps them elsewhere: no limit known
        return None
    value = getattr(value, "value", value)
    return value if isinstance(value, int) else None


# The local GPU jobs' device pool is at most --resources gpu=N devices: set here for the jobs (not read
# from the user), as an environment variable rather than a param, so changing N outdates no finished shard.
os.environ.pop("KERNELS_GPU_POOL_SIZE", None)
if gpu_limit() is not None:
    os.environ.update(KERNELS_GPU_POOL_SIZE=str(gpu_limit()))


def measured_gpus():
    """GPU types measured in this run: the config's list, or this machine's GPU (none on a CPU). `cpu` may be
    listed: the families then run on this machine's CPU, in Triton's interpreter."""
    if gpu_limit() == 0:
        return []
    if config["gpus"] == "auto":
        slug = detect_gpu_slug()
        return [] if slug == CPU_SLUG else [slug]
    return list(config["gpus"])


def gpu_type(gpu):
    """How a GPU type maps to the cluster (config gpu_types), with the schema's defaults for unlisted types."""
    entry = dict(config.get("gpu_types", {}).get(gpu) or {})
    return {
        "partition": entry.get("partition", ""),
        "gres": entry.get("gres", "gpu:1"),
        "constraint": entry.get("constraint", ""),
    }


def gpu_slurm_partition(wildcards):
    """SLURM partition of a GPU-type job ("" leaves the choice to the cluster's default)."""
    return gpu_type(wildcards.gpu)["partition"]


def gpu_slurm_extra(wildcards):
    """sbatch options of a GPU-type job: its GRES request (a job's --constraint comes from gpu_constraint)."""
    gres = gpu_type(wildcards.gpu)["gres"]
    return f"--gres={gres}" if gres else ""


def gpu_constraint(wildcards):
    """Node features a GPU-type job needs; None (no -C at all) when the type names none."""
    return gpu_type(wildcards.gpu)["constraint"] or None


def reference_gpus():
    """GPU types with shipped results (reports/reference/<gpu>/, verified) not measured now."""
    return [g for g in SHIPPED if g not in measured_gpus()]


def report_gpus():
    return measured_gpus() + reference_gpus()


def report_notices():
    """Banners at the top of the report: what it does not include, when the user chose so."""
    notices = []
    if REFERENCE is None:
        notices.append(
            "No shipped results are included: the configuration sets reference_dir: null."
        )
    if not report_gpus():
        notices.append(
            "No GPU results: no GPU was measured in this run and no shipped results are included."
        )
    return notices


# ---- the families' jobs ----------------------------------------------------------------------------------
# Shard name -> spec fields, per family: measured on every measured GPU type (scope gpu), or once on this
# machine (scope machine: results/<family>/<shard>.csv).
SHARDS = {n: f.shards(config) for n, f in FAMILIES.items() if f.scope == "gpu"}
MACHINE = {n: f.shards(config) for n, f in FAMILIES.items() if f.scope == "machine"}
TABLES = list(dict.fromkeys(f.table for f in FAMILIES.values() if f.scope == "gpu"))


def checks_enabled(family):
    """A family's interpreter checks (its section's interpreter_check.enabled): "auto" runs them only when no
    GPU is measured; true or false force them."""
    flag = (family.section(config).get("interpreter_check") or {}).get(
        "enabled", "auto"
    )
    return not measured_gpus() if flag == "auto" else bool(flag)


# Check name -> (family, spec fields) of every interpreter check (CPU, correctness only)
CHECKS = {
    name: (f.name, fields)
    for f in FAMILIES.values()
    if checks_enabled(f)
    for name, fields in f.checks(config).items()
}
# one table for every family's checks: results/cpu/checks.csv
try:
    CHECKS_TABLE = registry.checks_table()
except ValueError as exc:
    raise WorkflowError(str(exc))


def shard_paths(gpu, table):
    """Every job's CSV of one table on a measured GPU type."""
    return [
        f"{RESULTS}/{gpu}/{f.name}/{shard}.csv"
        for f in registry.of_table(table)
        if f.scope == "gpu"
        for shard in sorted(SHARDS[f.name])
    ]


def table_path(gpu, table):
    """A table of a GPU type in the report: measured now (when its families have shards), else shipped, else
    None."""
    if gpu in measured_gpus():
        return f"{RESULTS}/{gpu}/{table}.csv" if shard_paths(gpu, table) else None
    if REFERENCE is None:
        return None
    shipped_table = Path(REFERENCE) / gpu / f"{table}.csv"
    return str(shipped_table) if shipped_table.is_file() else None


def tables_of(gpu):
    """Table name -> file of every table the GPU type has."""
    return {t: table_path(gpu, t) for t in TABLES if table_path(gpu, t)}


def figure_families(gpu):
    """The families with figures whose table the GPU type has, in registry order."""
    return [
        f.name
        for f in FAMILIES.values()
        if f.scope == "gpu" and f.has("figures") and table_path(gpu, f.table)
    ]


def figure_dirs(gpu):
    return [f"{RESULTS}/report/{gpu}/{name}" for name in figure_families(gpu)]


def environment_path(gpu):
    if gpu in measured_gpus():
        return f"{RESULTS}/{gpu}/environment.json"
    return f"{REFERENCE}/{gpu}/environment.json"


def source_text(gpu):
    if gpu in measured_gpus():
        return "measured in this run"
    return f"shipped reference results ({REFERENCE}/{gpu}/), not measured in this run"


def comparison_families():
    """Families with figures over every GPU type, when the report holds more than one."""
    if len(report_gpus()) < 2:
        return []
    return [
        f.name
        for f in FAMILIES.values()
        if f.scope == "gpu"
        and f.compares
        and sum(1 for g in report_gpus() if table_path(g, f.table)) > 1
    ]


def audit_tables():
    """Table name -> GPU type (or "-" for a GPU-independent one) -> file: what the audit reads."""
    out = {
        t: {g: table_path(g, t) for g in report_gpus() if table_path(g, t)}
        for t in TABLES
    }
    for name, shards in MACHINE.items():
        for shard in sorted(shards):
            out.setdefault(FAMILIES[name].table, {})[
                "-"
            ] = f"{RESULTS}/{name}/{shard}.csv"
    return {t: files for t, files in out.items() if files}


def _alternatives(names):
    return "|".join(re.escape(n) for n in sorted(set(names))) or "(?!)"


wildcard_constraints:
    gpu=_alternatives(report_gpus() + [CPU_SLUG]),
    family=_alternatives(FAMILIES),
    shard=_alternatives(
        [s for shards in [*SHARDS.values(), *MACHINE.values()] for s in shards]
    ),
    table=_alternatives(TABLES),
    check=_alternatives(CHECKS),


# ---- summaries: a result set's measured summary (workflow/rules/summary.smk) ----------------------------
SUMMARY_ROOTS = [r for r in (RESULTS, REFERENCE) if r is not None]


def set_tables(root, gpu):
    """The tables (and environment) a result set's summary is made from."""
    if root == RESULTS:
        files = list(tables_of(gpu).values()) if gpu in measured_gpus() else []
    else:
        files = [str(p) for p in sorted(Path(root, gpu).glob("*.csv"))]
    return files + [f"{root}/{gpu}/environment.json"]


def summary_paths():
    return [f"{RESULTS}/{g}/summary.md" for g in measured_gpus()] + [
        f"{REFERENCE}/{g}/summary.md" for g in SHIPPED
    ]
