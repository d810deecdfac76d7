"""Draw one family's figures of one GPU's results."""

import _repo  # noqa: F401  (repository packages on sys.path)

from analysis.pipeline import render_figures, setup_logging

setup_logging(snakemake.log[0])
render_figures(snakemake.wildcards.family, snakemake.input.table, snakemake.output[0])
