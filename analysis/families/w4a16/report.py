"""What the report shows of the W4A16 rows beside the figures: a point's shape in words."""

from __future__ import annotations

import pandas as pd


def shape(row) -> str:
    """``<layer> M=.. N=.. K=..``, for the failure tables."""

    def part(key):
        v = row.get(key)
        return "?" if pd.isna(v) else str(int(v))

    return f"{row.get('model')} M={part('m')} N={part('n')} K={part('k')}"
