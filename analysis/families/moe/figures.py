"""Figures of the MoE family (rows of ``ops.csv``), drawn with the operator table's helpers
(``analysis.families._shared.operator_plots``).

- ``moe_time_split``: our MoE layer's time split into routing, dispatch, grouped GEMMs and combine (stacked
  bars per token count), one panel per (shape, routing); GPU time only;
- ``moe_layer``: the whole layer's time against tokens for every implementation (ours, the per-expert loop,
  per-token weight gathering, torch._grouped_mm, the dense FFN of equal FLOPs);
- ``moe_grouped_gemm``: TFLOP/s of the grouped GEMM alone (ours, torch._grouped_mm, a loop of matmuls).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core.family import Figure
from analysis.core.plotting import NoDataError, theme
from analysis.families._shared.operator_plots import (
    finish,
    line_panels,
    line_styles,
    panel_grid,
    prepare,
    title,
    with_candidates,
)
from analysis.families.moe.plan import STAGES
from analysis.families.moe.tables import moe_stage_split

MOE_ORDER = ["ours-moe", "grouped-mm-moe", "loop-moe", "gather-moe", "dense-ffn"]
GROUPED_ORDER = ["ours-grouped", "torch-grouped-mm", "loop-grouped"]
# colours of the operator table's palette after W4A16's five: the whole layer's, then the grouped GEMM's; the
# candidate persistent grouped GEMM (path="persistent") dashed, in the colour of the kernel it may replace
MOE_STYLES = with_candidates(line_styles(MOE_ORDER, first=5), {"ours-moe": ("ours-moe-persistent",)})
GROUPED_STYLES = with_candidates(line_styles(GROUPED_ORDER, first=10), {"ours-grouped": ("ours-grouped-persistent",)})
STAGE_COLOURS = dict(zip(STAGES, ("#8c564b", "#1f77b4", "#d62728", "#2ca02c"), strict=True))


def _moe_panel(r) -> str:
    return f"{r['model']} (E={int(r['experts'])}, k={int(r['top_k'])}), {r['routing']}"


def moe_time_split(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """Our MoE layer's stages, stacked, per token count; one panel per (shape, routing)."""
    d = prepare(df, "moe")
    wide = moe_stage_split(d)
    if wide.empty:
        raise NoDataError("no point with every stage of our MoE layer timed")
    wide = wide.assign(panel=[_moe_panel(r) for r in wide.to_dict("records")])
    panels = list(dict.fromkeys(wide.sort_values(["model", "routing"])["panel"]))
    with theme():
        fig, axes = panel_grid(len(panels), width=3.6)
        for ax, panel in zip(axes, panels, strict=True):
            s = wide[wide["panel"] == panel].sort_values("tokens").reset_index(drop=True)
            x = np.arange(len(s))
            bottom = np.zeros(len(s))
            for stage, colour in STAGE_COLOURS.items():
                share = 100 * s[f"{stage}_share"].to_numpy()
                ax.bar(x, share, bottom=bottom, color=colour, label=stage, width=0.7)
                bottom += share
            ax.set_xticks(x)
            ax.set_xticklabels([str(int(t)) for t in s["tokens"]])
            ax.set_xlabel("tokens")
            ax.set_ylabel("% of the layer's time")
            ax.set_ylim(0, 100)
            ax.set_title(panel, fontsize=9)
        finish(fig, axes, title(d, "where our MoE layer's time goes"), out_png)
    return wide.drop(columns=["panel"]).sort_values(["model", "routing", "tokens"]).reset_index(drop=True)


def _lines_vs_tokens(
    d: pd.DataFrame, styles: dict[str, dict], value: str, eager: str, ylabel: str, what: str, out_png
) -> pd.DataFrame:
    d = d.assign(panel=[_moe_panel(r) for r in d.to_dict("records")])
    d["eager_tflops"] = d["tflops"] * d["ms_median"] / d["eager_ms"]
    panels = list(dict.fromkeys(d.sort_values(["model", "routing"])["panel"]))
    line_panels(
        d,
        "panel",
        panels,
        styles,
        "tokens",
        value,
        ("tokens", ylabel),
        what,
        out_png,
        width=3.8,
        mark=lambda ax, s: ax.set_yscale("log"),
        eager=eager,
    )
    cols = [
        "gpu",
        "gpu_name",
        "dtype",
        "model",
        "experts",
        "top_k",
        "k",
        "n",
        "routing",
        "impl",
        "tokens",
        "ms_median",
        "host_ms",
        "eager_ms",
        "tflops",
        "eager_tflops",
        "model_bytes",
        "gbps",
        "peak_mem_mib",
        "max_abs_err",
    ]
    return d[cols].sort_values(["model", "routing", "impl", "tokens"]).reset_index(drop=True)


def moe_layer(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """The whole MoE layer's time against tokens, every implementation."""
    d = prepare(df, "moe")
    d = d[(d["op"] == "moe-layer") & (d["stage"] == "total") & d["impl"].isin(MOE_STYLES)]
    if d.empty:
        raise NoDataError("no ok timed rows of the whole MoE layer")
    return _lines_vs_tokens(
        d, MOE_STYLES, "ms_median", "eager_ms", "time per layer call (ms)", "MoE layer against its baselines", out_png
    )


def moe_grouped_gemm(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """TFLOP/s of the grouped GEMM alone (the gate projection on the dispatched rows)."""
    d = prepare(df, "moe")
    d = d[(d["op"] == "grouped-gemm") & d["impl"].isin(GROUPED_STYLES)].dropna(subset=["tflops"])
    if d.empty:
        raise NoDataError("no ok timed grouped-GEMM rows")
    what = "grouped GEMM (gate projection)"
    return _lines_vs_tokens(d, GROUPED_STYLES, "tflops", "eager_tflops", "TFLOP/s", what, out_png)


# name -> figure (caption: captions/<name>.rst; section: the report section)
FIGURES = {
    "moe_time_split": Figure(moe_time_split, "moe"),
    "moe_layer": Figure(moe_layer, "moe"),
    "moe_grouped_gemm": Figure(moe_grouped_gemm, "moe"),
}
