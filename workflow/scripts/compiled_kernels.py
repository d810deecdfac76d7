"""Compile every kernel variant of the `compiled` config section and write their facts."""

import _repo  # noqa: F401  (repository packages on sys.path)

from analysis.pipeline import run_compiled, setup_logging

setup_logging(snakemake.log[0])  # noqa: F821 (snakemake is injected by the script directive)
run_compiled(snakemake.params.section, snakemake.output[0], snakemake.threads)  # noqa: F821
