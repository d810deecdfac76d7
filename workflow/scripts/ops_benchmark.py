"""Benchmark one shard of the W4A16 or MoE grid on the GPU."""

import _repo  # noqa: F401  (repository packages on sys.path)

from analysis.pipeline import run_ops_shard, setup_logging

setup_logging(snakemake.log[0])  # noqa: F821 (snakemake is injected by the script directive)
run_ops_shard(snakemake.params.spec, snakemake.input.env, snakemake.output[0])  # noqa: F821
