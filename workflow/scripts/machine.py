"""Run a GPU-independent family's job on this machine (the compiled kernels)."""

import _repo  # noqa: F401  (repository packages on sys.path)

from analysis.pipeline import run_shard, setup_logging

setup_logging(snakemake.log[0])
run_shard(snakemake.wildcards.family, snakemake.params.spec, snakemake.output[0])
