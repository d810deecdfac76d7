"""Benchmark one shard of the W4A16 or MoE grid on the GPU."""

import _gpu_pool
import _repo  # noqa: F401  (repository packages on sys.path)

from analysis.pipeline import run_ops_shard, setup_logging

setup_logging(snakemake.log[0])  # noqa: F821 (snakemake is injected by the script directive)
_gpu_pool.claim(snakemake)  # noqa: F821 (a GPU of its own, before CUDA starts)
run_ops_shard(snakemake.params.spec, snakemake.input.env, snakemake.output[0])  # noqa: F821
