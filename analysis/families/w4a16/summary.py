"""The W4A16 family's lines of a GPU's measured summary: the fused int4 kernel against bf16 ``F.linear``,
PyTorch's int4 kernel and the copy bandwidth, and the unfused path (from the operator table)."""

from __future__ import annotations

import pandas as pd

from analysis.core.summaries import Line, met, span
from analysis.core.tables import finished
from analysis.families.w4a16.tables import with_copy_gbps

KEYS = ["model", "dtype", "group_size", "m"]


def _ratio(rows: pd.DataFrame, num: str, den: str) -> pd.DataFrame:
    """``den`` time / ``num`` time (how many times faster ``num`` is) per point, with M."""
    wide = rows.pivot_table(index=KEYS, columns="impl", values="ms_median")
    if num not in wide or den not in wide:
        return pd.DataFrame(columns=["m", "ratio"])
    return (wide[den] / wide[num]).dropna().rename("ratio").reset_index()


def lines(tables: dict[str, pd.DataFrame]) -> list[Line]:
    rows = finished(tables.get("ops"), experiment="w4a16", op="linear")
    if not len(rows):
        return []
    layers = rows["model"].nunique()
    groups = ", ".join(str(int(g)) for g in sorted(rows["group_size"].dropna().unique()))
    out: list[Line] = []
    fused = _ratio(rows, "ours-w4a16", "torch-linear")
    by_m = "; ".join(f"M = {m}: {span(fused[fused['m'] == m]['ratio'])}" for m in (1, 4, 16) if (fused["m"] == m).any())
    at1 = fused[fused["m"] == 1]["ratio"]
    out.append(
        Line(
            f"fused W4A16 vs bf16 F.linear ({layers} Llama-3 layers, group {groups})",
            by_m,
            "3.5× at M = 1",
            met(at1 >= 3.5),
        )
    )
    ours = rows[(rows["impl"] == "ours-w4a16") & (rows["m"] == 1)]
    if len(ours):
        share = (ours["gbps"] / with_copy_gbps(ours, rows)).dropna()
        text = f"{span(ours['gbps'] / 1e3, '.1f', ' TB/s')}; {span(100 * share, '.0f', '%')}"
        out.append(
            Line(
                "fused W4A16 at M = 1: bandwidth on the packed weight, and its share of the copy bandwidth",
                text,
                "75% of the copy",
                met(share >= 0.75),
            )
        )
    pack = _ratio(rows, "ours-w4a16", "torch-int4pack")
    if len(pack):
        text = "; ".join(f"M = {m}: {span(pack[pack['m'] == m]['ratio'])}" for m in (1, 16) if (pack["m"] == m).any())
        out.append(Line("fused W4A16 vs PyTorch's int4 kernel (torch._weight_int4pack_mm)", text))
    big = int(rows["m"].max())
    deq = _ratio(rows, "torch-linear", "dequant-linear")
    text = (
        f"fused {span(fused[fused['m'] == big]['ratio'])} cuBLAS's speed; dequantise-then-F.linear takes "
        f"{span(deq[deq['m'] == big]['ratio'])} cuBLAS's time"
    )
    out.append(Line(f"at M = {big}", text))
    small = deq[deq["m"] <= 16]["ratio"]
    out.append(
        Line(
            "the unfused path (dequantise to memory, then F.linear) at M ≤ 16",
            f"{span(small)} the time of bf16 F.linear",
            "≥ 1× (the fusion is what saves the bytes)",
            met(small >= 1),
        )
    )
    return out
