"""Draw one family's figures over the GPU types side by side."""

import _repo  # noqa: F401  (repository packages on sys.path)

from analysis.pipeline import render_comparison, setup_logging

setup_logging(snakemake.log[0])
render_comparison(snakemake.wildcards.family, snakemake.params.tables, snakemake.output[0])
