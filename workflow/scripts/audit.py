"""Judge every claim of the registry."""

import _repo  # noqa: F401  (repository packages on sys.path)

from analysis.pipeline import run_audit, setup_logging

setup_logging(snakemake.log[0])  # noqa: F821 (snakemake is injected by the script directive)
run_audit(snakemake.params.tables, snakemake.output[0], snakemake.params.traffic, snakemake.params.ops,  # noqa: F821
          snakemake.params.compiled)  # noqa: F821
