"""Check a family's kernel in Triton's interpreter (CPU, correctness only)."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton

import _repo  # noqa: E402,F401  (repository packages on sys.path)

from analysis.pipeline import run_shard, setup_logging  # noqa: E402

setup_logging(snakemake.log[0])
run_shard(snakemake.params.family, snakemake.params.spec, snakemake.output[0], check=True)
