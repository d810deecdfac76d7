"""Concatenate the W4A16 and MoE shards of one GPU into its ops table."""

import _repo  # noqa: F401  (repository packages on sys.path)

from analysis.pipeline import collect_ops, setup_logging

setup_logging(snakemake.log[0])  # noqa: F821 (snakemake is injected by the script directive)
collect_ops(list(snakemake.input), snakemake.output[0])  # noqa: F821
