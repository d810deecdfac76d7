"""Rewrite the README's measured tables from the result sets they name."""

from pathlib import Path

import _repo  # noqa: F401  (repository packages on sys.path)

from analysis import summary
from analysis.core import outputs
from analysis.pipeline import setup_logging

setup_logging(snakemake.log[0])
path = Path(snakemake.params.readme)
outputs.write_text(path, summary.readme(path.read_text(encoding="utf-8"), path.parent))
