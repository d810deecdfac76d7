"""What the report shows of the attention table beside the figures: a point's shape in words, and the best
throughput of every implementation at the largest N of the FA-2 setting, per mode."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core.plotting import DTYPE_ORDER, OURS, PALETTE
from analysis.families._shared import attention_report
from analysis.families.attention.plots import MODE_TEXT, fa2_mode

REFERENCE = "sdpa-flash"
RATIO_COLUMN = f"{OURS} / {REFERENCE}"
CUDNN_RATIO_COLUMN = f"{OURS} / sdpa-cudnn"


# a point's shape in words, for the failure and check tables (the attention table's, whichever family wrote it)
shape = attention_report.shape


def throughput_summary(df: pd.DataFrame, mode: str = "fwd") -> pd.DataFrame:
    """Best TFLOP/s of one mode per impl at the largest N of each (dtype, head_dim, causal) setting.

    Experiment ``fa2-setting``. "Largest N" is the largest sequence length at which any
    implementation finished in that setting, so an impl that failed there shows as missing rather
    than being compared at a smaller N. The last columns are ours divided by sdpa-flash and by
    sdpa-cudnn at that N.
    """
    d = fa2_mode(df, mode).dropna(subset=["tflops"])
    setting = ["dtype", "head_dim", "causal"]
    if d.empty:
        return pd.DataFrame(columns=setting + ["N", RATIO_COLUMN, CUDNN_RATIO_COLUMN])
    largest = d.groupby(setting)["seqlen_q"].transform("max")
    at_n = d[d["seqlen_q"] == largest].rename(columns={"seqlen_q": "N"})
    # Several rows per impl (e.g. kernel configurations) can exist at one point: report the best.
    wide = at_n.pivot_table(index=setting + ["N"], columns="impl", values="tflops", aggfunc="max")
    impls = [i for i in PALETTE if i in wide.columns] + sorted(set(wide.columns) - set(PALETTE))
    wide = wide[impls]
    ours = wide[OURS] if OURS in wide.columns else np.nan
    ref = wide[REFERENCE] if REFERENCE in wide.columns else np.nan
    wide[RATIO_COLUMN] = ours / ref
    wide[CUDNN_RATIO_COLUMN] = ours / (wide["sdpa-cudnn"] if "sdpa-cudnn" in wide.columns else np.nan)
    wide.columns.name = None
    rank = {t: i for i, t in enumerate(DTYPE_ORDER)}
    return (
        wide.reset_index()
        .sort_values(setting, key=lambda c: c.map(rank) if c.name == "dtype" else c, kind="stable")
        .reset_index(drop=True)
    )


def summary_tables(tables: dict[str, pd.DataFrame]) -> list[dict]:
    """One throughput table per mode of the FA-2 setting present (forward first, and always)."""
    table = tables.get("attention")
    if table is None or table.empty:
        return []
    present = set(table.loc[table["experiment"] == "fa2-setting", "mode"].dropna())
    text = (
        "Best {mode} TFLOP/s per implementation at the largest N measured in each FlashAttention-2 setting "
        "(batch×N and hidden size fixed), and ours divided by sdpa-flash and by sdpa-cudnn there. A dash "
        "means that implementation has no finished, timed row at that N; see the failures below."
    )
    return [
        {
            "title": f"{MODE_TEXT[m].capitalize()} throughput at the largest sequence length",
            "text": text.format(mode=m),
            "table": throughput_summary(table, m),
        }
        for m in MODE_TEXT
        if m in present or m == "fwd"
    ]
