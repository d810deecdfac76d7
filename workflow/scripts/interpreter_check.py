"""Check the attention kernel in Triton's interpreter (CPU, correctness only)."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton

import _repo  # noqa: E402,F401  (repository packages on sys.path)

from analysis.pipeline import run_interpreter_check, setup_logging  # noqa: E402

setup_logging(snakemake.log[0])  # noqa: F821 (snakemake is injected by the script directive)
run_interpreter_check(snakemake.params.spec, snakemake.output[0])  # noqa: F821
