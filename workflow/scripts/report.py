"""Render the self-contained HTML report."""

import _repo  # noqa: F401  (repository packages on sys.path)

from analysis.pipeline import render_report, setup_logging

setup_logging(snakemake.log[0])
render_report(
    snakemake.params.gpus,
    snakemake.params.checks,
    snakemake.output[0],
    snakemake.input.verdicts,
    snakemake.params.comparison,
    snakemake.params.notices,
)
