"""Draw the DRAM-traffic figures of one GPU's results."""

import _repo  # noqa: F401  (repository packages on sys.path)

from analysis.pipeline import setup_logging
from analysis.traffic_figures import render

setup_logging(snakemake.log[0])  # noqa: F821 (snakemake is injected by the script directive)
render(snakemake.input.table, snakemake.output[0])  # noqa: F821
