# Replication and audit suite for IO-aware GPU kernels.
# Run:  snakemake --cores all          (GPU node: measures; no GPU: interpreter checks + shipped results)
# See README.md for the report, the configuration and the profiles.

import sys

from snakemake.utils import min_version

min_version("9.0")
sys.path.insert(0, workflow.basedir)  # the analysis package, even if not installed

from analysis.configuration import validate_config


configfile: "workflow/config.yaml"


include: "workflow/rules/config.smk"  # --config values typed as in a config file


# the schema composed from the families' (one line per problem), its defaults, then the checks across fields
validate_config(config, f"{workflow.basedir}/workflow/schemas/config.schema.yaml")


report: "reports/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/environment.smk"
include: "workflow/rules/benchmark.smk"
include: "workflow/rules/audit.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/summary.smk"


rule all:
    default_target: True
    input:
        config["report"],
