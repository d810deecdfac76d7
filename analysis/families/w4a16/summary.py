"""The W4A16 family's lines of a GPU's measured summary that have no target: the fused int4 kernel against
PyTorch's int4 kernel, both paths at the largest M, and each candidate path of our kernels judged by the
targets of the kernel it may replace (from the operator table; the lines with a target are the family's
targets, ``claims.yaml``)."""

from __future__ import annotations

import pandas as pd

from analysis.audit import Claim
from analysis.audit.targets import EVALUATORS as RATIO
from analysis.core.summaries import Line, span
from analysis.core.tables import finished
from analysis.families._shared.operator_claims import candidate_lines
from analysis.families.w4a16.plan import CANDIDATES
from analysis.families.w4a16.targets import EVALUATORS

KEYS = ["model", "dtype", "group_size", "m"]


def _ratio(rows: pd.DataFrame, num: str, den: str) -> pd.DataFrame:
    """``den`` time / ``num`` time (how many times faster ``num`` is) per point, with M."""
    wide = rows.pivot_table(index=KEYS, columns="impl", values="ms_median")
    if num not in wide or den not in wide:
        return pd.DataFrame(columns=["m", "ratio"])
    return (wide[den] / wide[num]).dropna().rename("ratio").reset_index()


def lines(tables: dict[str, pd.DataFrame], targets: dict[str, Claim]) -> list[Line]:
    """The lines without a target (those with one are the family's targets, ``claims.yaml``)."""
    rows = finished(tables.get("ops"), experiment="w4a16", op="linear")
    if not len(rows):
        return []
    out: list[Line] = []
    pack = _ratio(rows, "ours-w4a16", "torch-int4pack")
    if len(pack):
        text = "; ".join(f"M = {m}: {span(pack[pack['m'] == m]['ratio'])}" for m in (1, 16) if (pack["m"] == m).any())
        out.append(Line("fused W4A16 vs PyTorch's int4 kernel (torch._weight_int4pack_mm)", text))
    big = int(rows["m"].max())
    fused = _ratio(rows, "ours-w4a16", "torch-linear")
    deq = _ratio(rows, "torch-linear", "dequant-linear")
    text = (
        f"fused {span(fused[fused['m'] == big]['ratio'])} cuBLAS's speed; dequantise-then-F.linear takes "
        f"{span(deq[deq['m'] == big]['ratio'])} cuBLAS's time"
    )
    out.append(Line(f"at M = {big}", text))
    return out + candidate_lines(tables, targets, CANDIDATES, {**RATIO, **EVALUATORS})
