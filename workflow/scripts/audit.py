"""Judge every claim."""

import _repo  # noqa: F401  (repository packages on sys.path)

from analysis.pipeline import run_audit, setup_logging

setup_logging(snakemake.log[0])
run_audit(snakemake.params.tables, snakemake.output[0])
