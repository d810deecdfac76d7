"""The traffic family's lines of a GPU's measured summary: what Nsight Compute saw of standard attention's and
our kernel's DRAM traffic against the byte models (from the traffic table)."""

from __future__ import annotations

import pandas as pd

from analysis.audit import Claim, Results
from analysis.audit.verdicts import loglog_slope
from analysis.core import models
from analysis.core.summaries import Line, span
from analysis.families.traffic.claims import traffic_points


def lines(tables: dict[str, pd.DataFrame], targets: dict[str, Claim]) -> list[Line]:
    df = tables.get("traffic")
    if df is None or df.empty:
        return []
    out = [
        Line(
            "kernels profiled under Nsight Compute (rows of the traffic table that finished)",
            f"{int((df['status'] == 'ok').sum())} of {len(df)}",
        )
    ]
    results = Results({"gpu": df}, {"gpu": ""})
    naive, _ = traffic_points(results, "gpu", "naive", 128)
    if len(naive):
        n = naive["seqlen"]
        coeff = (naive["bytes"] / (naive["batch"] * naive["heads"]) - models.minimum_attention_bytes(n, 128)) / (n * n)
        out.append(
            Line(
                "standard attention's DRAM bytes per N², beyond the L2 cache (d = 128; model 8, article 6)",
                span(coeff, ".2f", ""),
            )
        )
    ours, _ = traffic_points(results, "gpu", "ours-fa2", 128)
    if len(ours) >= 2:
        out.append(
            Line(
                "our FA-2's DRAM bytes grow as N^x (d = 128; O(N) is x = 1)",
                f"x = {loglog_slope(ours['seqlen'], ours['bytes']):.2f}",
            )
        )
    return out
