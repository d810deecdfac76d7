"""Imported first by every script: puts the repository root (kernels/, analysis/) on sys.path, so the
scripts run the checkout's code whether or not the packages are installed (e.g. in a conda env)."""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
