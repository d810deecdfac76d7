"""Draw the W4A16 and MoE figures of one GPU's ops table."""

import _repo  # noqa: F401  (repository packages on sys.path)

from analysis.pipeline import render_ops_figures, setup_logging

setup_logging(snakemake.log[0])  # noqa: F821 (snakemake is injected by the script directive)
render_ops_figures(snakemake.input.table, snakemake.output[0])  # noqa: F821
