"""Measure one shard of a family on a GPU of its type (or, for the `cpu` type, in Triton's interpreter)."""

import os

import _gpu_pool
import _repo  # noqa: F401  (repository packages on sys.path)

if snakemake.wildcards.gpu == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # before the first import of triton

from analysis.pipeline import preload_family, run_shard, setup_logging  # noqa: E402

setup_logging(snakemake.log.job)
# torch, Triton and the family's kernels are imported while the job may still wait for a GPU (a few seconds a
# job that would otherwise keep the GPU idle); nothing of that starts CUDA, which preload_family checks
preload_family(snakemake.wildcards.family)
_gpu_pool.claim(snakemake)
run_shard(
    snakemake.wildcards.family,
    snakemake.params.spec,
    snakemake.output[0],
    env_json=snakemake.input.env,
    files=snakemake.log.files,
)
