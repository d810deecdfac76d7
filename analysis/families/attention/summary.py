"""The attention family's lines of a GPU's measured summary that have no target: its kernels against SDPA's
backends, computed from the attention table (``analysis.summary`` writes them beside the family's targets)."""

from __future__ import annotations

import pandas as pd

from analysis.audit import Claim
from analysis.core.summaries import Line, span
from analysis.core.tables import finished

LONG = 4096  # "N ≥ 4096": where the targets are judged


def _ratios(rows: pd.DataFrame, ours: str, other: str, keys: list[str]) -> pd.Series:
    """ours / other TFLOP/s at every point both finished."""
    wide = rows.pivot_table(index=keys, columns="impl", values="tflops")
    if ours not in wide or other not in wide:
        return pd.Series(dtype=float)
    return (wide[ours] / wide[other]).dropna()


def lines(tables: dict[str, pd.DataFrame], targets: dict[str, Claim]) -> list[Line]:
    """The lines without a target (those with one are the family's targets, ``claims.yaml``)."""
    df = tables.get("attention")
    out: list[Line] = []
    keys = ["dtype", "causal", "seqlen_q"]
    fwd = finished(df, experiment="fa2-setting", mode="fwd", head_dim=128)
    fwd = fwd[fwd["seqlen_q"] >= LONG] if len(fwd) else fwd
    where = f"FA-2 setting, d = 128, N ≥ {LONG}, fp16 and bf16"
    if len(fwd):
        r = _ratios(fwd, "ours-fa2", "sdpa-flash", keys)
        out.append(Line(f"FA-2 forward vs SDPA flash (FA-2; {where})", span(r)))
        r = _ratios(fwd, "ours-fa3", "sdpa-cudnn", keys)
        if len(r):
            out.append(Line(f"FA-3 forward vs SDPA cuDNN ({where})", span(r)))
    return out
