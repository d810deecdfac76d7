"""Record the environment of a GPU result set (and check the GPU type)."""

import _gpu_pool
import _repo  # noqa: F401  (repository packages on sys.path)

from analysis.pipeline import record_environment, setup_logging

setup_logging(snakemake.log[0])
gpu = _gpu_pool.claim(snakemake)
extra = gpu.provenance() if gpu else {}  # how many GPUs of this type the run spreads its jobs over
record_environment(snakemake.wildcards.gpu, snakemake.output.env, snakemake.output.packages, extra)
