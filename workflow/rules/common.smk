# Shared definitions: which GPU types are measured, which shards the grid has, where tables live.
import os
import sys
from pathlib import Path

sys.path.insert(
    0, str(Path(workflow.basedir))
)  # the analysis/kernels packages, even if not installed

import re

from snakemake.exceptions import WorkflowError

from analysis import reference
from analysis.experiments import grid, ops_grid
from analysis.provenance import CPU_SLUG, detect_gpu_slug

RESULTS = config["results_dir"]
# None (null in a config file, "null" on the command line): the user opted out of shipped results
REFERENCE = (
    None if config["reference_dir"] in (None, "null") else config["reference_dir"]
)
ATT = config["attention"]
try:  # every shipped result set checked against its manifest now, not discovered missing in the report
    SHIPPED = reference.shipped_gpus(REFERENCE)
except reference.ReferenceSetError as exc:
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
    """GPU types measured in this run: the config's list, or this machine's GPU (none on a CPU)."""
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


def report_gpus():
    return measured_gpus() + reference_gpus()


def attention_shards():
    """Shard name -> analysis.experiments.attention.Spec fields, for every GPU benchmark job."""
    return grid.attention_shards(ATT)


def interpreter_enabled():
    flag = ATT["interpreter_check"]["enabled"]
    return not measured_gpus() if flag == "auto" else bool(flag)


def check_shards():
    """Shard name -> Spec fields for the interpreter checks (CPU, correctness only)."""
    return grid.interpreter_shards(ATT)


def table_path(gpu):
    if gpu in measured_gpus():
        return f"{RESULTS}/{gpu}/attention.csv"
    return f"{REFERENCE}/{gpu}/attention.csv"


def environment_path(gpu):
    if gpu in measured_gpus():
        return f"{RESULTS}/{gpu}/environment.json"
    return f"{REFERENCE}/{gpu}/environment.json"


def source_text(gpu):
    if gpu in measured_gpus():
        return "measured in this run"
    return f"shipped reference results ({REFERENCE}/{gpu}/), not measured in this run"


def traffic_path(gpu):
    """The traffic table of a GPU type in the report: measured now (if enabled), else shipped, else None."""
    if gpu in measured_gpus():
        enabled = ATT["traffic"]["enabled"] is not False
        return f"{RESULTS}/{gpu}/traffic.csv" if enabled else None
    shipped = Path(REFERENCE) / gpu / "traffic.csv"
    return str(shipped) if shipped.is_file() else None


def traffic_gpus():
    """GPU types of the report that have a traffic table."""
    return [g for g in report_gpus() if traffic_path(g)]


def ops_path(gpu):
    """The W4A16/MoE table of a GPU type in the report: measured now (if the grid has shards), else shipped,
    else None."""
    if gpu in measured_gpus():
        return f"{RESULTS}/{gpu}/ops.csv" if OPS_SHARDS else None
    shipped = Path(REFERENCE) / gpu / "ops.csv"
    return str(shipped) if shipped.is_file() else None


def ops_gpus():
    """GPU types of the report that have an ops table."""
    return [g for g in report_gpus() if ops_path(g)]


def comparison_dir():
    """The cross-GPU figures' folder, when the report holds more than one GPU type."""
    return f"{RESULTS}/report/compare" if len(report_gpus()) > 1 else None


def checks_path():
    return f"{RESULTS}/{CPU_SLUG}/checks.csv" if interpreter_enabled() else None


def all_targets():
    return [config["report"]]


def _alternatives(names):
    return "|".join(re.escape(n) for n in sorted(names)) or "(?!)"


ATTENTION_SHARDS = attention_shards()
CHECK_SHARDS = check_shards()
# the W4A16 and MoE shards (config sections quant: and moe:), one GPU job each (workflow/rules/ops.smk)
OPS_SHARDS = ops_grid.ops_shards(config)


wildcard_constraints:
    gpu=_alternatives(report_gpus() + [CPU_SLUG]),
    shard=_alternatives(ATTENTION_SHARDS),
    check=_alternatives(CHECK_SHARDS),
