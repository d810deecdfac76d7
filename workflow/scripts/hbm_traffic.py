"""Measure the DRAM traffic of the attention kernels with Nsight Compute on this GPU."""

import _gpu_pool
import _repo  # noqa: F401  (repository packages on sys.path)

from analysis.pipeline import setup_logging
from analysis.traffic import run_job

setup_logging(snakemake.log[0])  # noqa: F821 (snakemake is injected by the script directive)
_gpu_pool.claim(snakemake)  # noqa: F821 (a GPU of its own, before CUDA starts)
run_job(snakemake.params.spec, snakemake.input.env, snakemake.output.csv, snakemake.output.raw)  # noqa: F821
