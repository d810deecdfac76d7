"""Render the self-contained HTML report."""

import _repo  # noqa: F401  (repository packages on sys.path)

from analysis.pipeline import render_report, setup_logging

setup_logging(snakemake.log[0])  # noqa: F821 (snakemake is injected by the script directive)
render_report(
    snakemake.params.gpus,  # noqa: F821
    snakemake.params.checks,  # noqa: F821
    snakemake.output[0],  # noqa: F821
    snakemake.input.verdicts,  # noqa: F821
    snakemake.params.comparison,  # noqa: F821
    snakemake.params.notices,  # noqa: F821
)
