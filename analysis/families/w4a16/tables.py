"""Helpers over the W4A16 rows of the operator table: the copy bandwidth each point is compared with."""

from __future__ import annotations

import pandas as pd

COPY_KEYS = ["model", "dtype", "group_size"]  # a quant shard: one copy-weight row per layer, dtype and group


def with_copy_gbps(rows: pd.DataFrame, table: pd.DataFrame) -> pd.Series:
    """The copy bandwidth of the packed weight (``copy-weight`` rows of ``table``) for each of ``rows``, by
    layer, dtype and group size (and GPU where there is a ``gpu`` column): NaN where none was measured."""
    keys = COPY_KEYS + (["gpu"] if "gpu" in rows.columns and "gpu" in table.columns else [])
    copy = table[table["impl"] == "copy-weight"][[*keys, "gbps"]].dropna(subset=["gbps"])
    copy = copy.drop_duplicates(keys, keep="last").rename(columns={"gbps": "_copy_gbps"})
    return rows[keys].merge(copy, on=keys, how="left")["_copy_gbps"].set_axis(rows.index)
