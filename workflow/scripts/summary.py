"""Write a result set's measured summary (summary.md) from its tables."""

from pathlib import Path

import _repo  # noqa: F401  (repository packages on sys.path)

from analysis import summary
from analysis.pipeline import setup_logging

setup_logging(snakemake.log[0])
out = Path(snakemake.output[0])
summary.write(out.parent, out)
