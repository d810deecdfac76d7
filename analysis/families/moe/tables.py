"""Helpers over the MoE rows of the operator table: our layer's time split by stage."""

from __future__ import annotations

import pandas as pd

from analysis.families.moe.plan import STAGES


def moe_stage_split(rows: pd.DataFrame) -> pd.DataFrame:
    """Our MoE layer's time split: per (model, experts, top_k, dtype, routing, tokens) point whose four stages
    all finished, each stage's ms (``<stage>_ms``) and share of their sum (``<stage>_share``), and the
    data-movement share (routing + dispatch + combine). Points missing a stage are left out, not counted as 0."""
    stages = list(STAGES)
    keys = ["model", "experts", "top_k", "dtype", "routing", "tokens"]
    d = rows[(rows["impl"] == "ours-moe") & rows["stage"].isin(stages)]
    d = d.assign(stage=d["stage"] + "_ms")  # "routing" is also a column of the index
    wide = d.pivot_table(index=keys, columns="stage", values="ms_median", dropna=False)
    cols = [f"{s}_ms" for s in stages]
    wide = wide.reindex(columns=cols).dropna().reset_index()
    wide.columns.name = None
    total = wide[cols].sum(axis=1)
    for s in stages:
        wide[f"{s}_share"] = wide[f"{s}_ms"] / total
    wide["movement_share"] = 1.0 - wide["gemm_share"]
    return wide
