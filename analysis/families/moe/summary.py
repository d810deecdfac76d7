"""The MoE family's lines of a GPU's measured summary that have no target: the grouped GEMM against
``torch._grouped_mm`` per layer shape and against a loop of matmuls, the whole layer against the per-expert
loop, and the candidate persistent grouped GEMM judged by the default's targets (from the operator table; the
lines with a target are the family's targets, ``claims.yaml``)."""

from __future__ import annotations

import pandas as pd

from analysis.audit import Claim
from analysis.audit.targets import EVALUATORS as RATIO
from analysis.core.summaries import Line
from analysis.core.tables import finished
from analysis.families._shared.operator_claims import candidate_lines

CANDIDATES = {"ours-grouped": ("ours-grouped-persistent",)}  # the grouped GEMM's candidate path


def _speedup(rows: pd.DataFrame, ours: str, other: str) -> pd.DataFrame:
    wide = rows.pivot_table(index=["model", "experts", "routing", "tokens"], columns="impl", values="ms_median")
    if ours not in wide or other not in wide:
        return pd.DataFrame(columns=["model", "experts", "routing", "tokens", "speedup"])
    return (wide[other] / wide[ours]).dropna().rename("speedup").reset_index()


def lines(tables: dict[str, pd.DataFrame], targets: dict[str, Claim]) -> list[Line]:
    ops = tables.get("ops")
    gemm = finished(ops, experiment="moe", op="grouped-gemm", routing="uniform")
    layer = finished(ops, experiment="moe", op="moe-layer", stage="total", routing="uniform")
    out: list[Line] = []
    if len(gemm):
        vs = _speedup(gemm, "ours-grouped", "torch-grouped-mm")
        text = "; ".join(
            f"{int(t)} tokens: {', '.join(f'{r.model} {r.speedup:.2f}×' for r in g.itertuples())}"
            for t, g in vs.groupby("tokens")
        )
        out.append(Line("grouped GEMM (gate projection) vs torch._grouped_mm", text))
        loop = _speedup(gemm, "ours-grouped", "loop-grouped")
        first = loop[loop["tokens"] == loop["tokens"].min()] if len(loop) else loop
        if len(first):
            text = ", ".join(f"{r.model} ({int(r.experts)} experts) {r.speedup:.0f}×" for r in first.itertuples())
            out.append(Line(f"grouped GEMM vs a loop of matmuls ({int(first['tokens'].iloc[0])} tokens)", text))
    if len(layer):
        vs = _speedup(layer, "ours-moe", "loop-moe")
        last = vs[vs["tokens"] == vs["tokens"].max()] if len(vs) else vs
        if len(last):
            text = ", ".join(f"{r.model} {r.speedup:.1f}×" for r in last.itertuples())
            out.append(Line(f"whole MoE layer vs the per-expert loop ({int(last['tokens'].iloc[0])} tokens)", text))
    return out + candidate_lines(tables, targets, CANDIDATES, RATIO)
