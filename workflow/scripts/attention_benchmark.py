"""Benchmark one shard of the attention grid on the GPU."""

import _gpu_pool
import _repo  # noqa: F401  (repository packages on sys.path)

from analysis.pipeline import run_attention_shard, setup_logging

setup_logging(snakemake.log[0])  # noqa: F821 (snakemake is injected by the script directive)
_gpu_pool.claim(snakemake)  # noqa: F821 (a GPU of its own, before CUDA starts)
run_attention_shard(snakemake.params.spec, snakemake.input.env, snakemake.output[0])  # noqa: F821
