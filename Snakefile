# Replication and audit suite for IO-aware GPU kernels.
# Run:  snakemake --cores all          (GPU node: measures; no GPU: interpreter checks + shipped results)
# See README.md for the report, the configuration and the profiles.

from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "workflow/config.yaml"


include: "workflow/rules/config.smk"  # --config values typed as in a config file


validate(config, "workflow/schemas/config.schema.yaml")


report: "reports/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/environment.smk"
include: "workflow/rules/attention.smk"
include: "workflow/rules/traffic.smk"
include: "workflow/rules/ops.smk"
include: "workflow/rules/compiled.smk"
include: "workflow/rules/audit.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        all_targets(),
        TRAFFIC_TARGETS,
