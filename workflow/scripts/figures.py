"""Draw the figures of one GPU's results."""

from analysis.pipeline import render_figures, setup_logging

setup_logging(snakemake.log[0])  # noqa: F821 (snakemake is injected by the script directive)
render_figures(snakemake.input.table, snakemake.output[0])  # noqa: F821
