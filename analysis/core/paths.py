"""Where things are: the repository root and the folders the analysis package reads from it."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: kernels/, analysis/, workflow/, reports/
SCHEMAS = ROOT / "workflow" / "schemas"
