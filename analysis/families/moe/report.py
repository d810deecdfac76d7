"""What the report shows of the MoE rows beside the figures: a point's shape in words."""

from __future__ import annotations

import pandas as pd


def shape(row) -> str:
    """``<layer> <tokens> tokens, <routing> routing, stage <stage>``, for the failure tables."""
    v = row.get("tokens")
    tokens = "?" if pd.isna(v) else str(int(v))
    return f"{row.get('model')} {tokens} tokens, {row.get('routing')} routing, stage {row.get('stage')}"
