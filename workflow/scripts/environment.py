"""Record the environment of a GPU result set (and check the GPU type)."""

import _repo  # noqa: F401  (repository packages on sys.path)

from analysis.pipeline import record_environment, setup_logging

setup_logging(snakemake.log[0])  # noqa: F821 (snakemake is injected by the script directive)
record_environment(snakemake.wildcards.gpu, snakemake.output.env, snakemake.output.packages)  # noqa: F821
