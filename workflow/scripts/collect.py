"""Concatenate a table's per-job result files into one table."""

import _repo  # noqa: F401  (repository packages on sys.path)

from analysis.pipeline import collect, setup_logging

setup_logging(snakemake.log[0])
table = snakemake.params.get("table") or snakemake.wildcards.table
collect(table, list(snakemake.input), snakemake.output[0])
