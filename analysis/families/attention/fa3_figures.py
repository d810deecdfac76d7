"""Figures of FlashAttention-3: the FA-1 → FA-2 → FA-3 ladder and the FA-3 ablation.

Same contract as every figure (``analysis.core.plotting``): each function takes ``(df, out_png)``, draws what
the table holds, writes the PNG and returns the tidy frame behind it, or raises ``NoDataError``; points that
did not finish are named in a note under the figure and kept in the returned table with their ``status``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.lines import Line2D

from analysis.core.plotting import DTYPE_ORDER, line_style, log2_x, require, theme
from analysis.core.tables import finished
from analysis.families._shared.attention_plots import (
    ID,
    ablation_bars,
    failed,
    missing_note,
    prepare,
    save_with_note,
    tidy,
    title,
    with_failed,
)
from analysis.families._shared.fa3_ablation import ABLATION_LABELS, ABLATION_ORDER, FA3

GENERATIONS = ["ours-fa1", "ours-fa2", "ours-fa3"]  # our kernels, oldest first
# PyTorch's FA-2 backend, cuDNN's Hopper kernel and FlashAttention's own kernels (where installed), for scale
UPSTREAM = "upstream-fa"
REFERENCES = ["sdpa-flash", "sdpa-cudnn", UPSTREAM]


def _ladder_style(impl: str, order: list[str]) -> dict:
    style = line_style(impl, order)
    if impl in REFERENCES:
        style.update(linestyle="--", linewidth=1.2)
    return style


def fa3_ladder(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """Forward TFLOP/s against N of our three generations (FA-1, FA-2, FA-3) with SDPA's FA-2 and cuDNN
    backends and FlashAttention's own kernels (``upstream-fa``, where they ran) for scale, in the FA-2 setting
    (``fa2-setting`` rows), one panel per (dtype, mask) at the head dim where FA-3 was measured most (128 in the
    default grid)."""
    d = prepare(df, "fa2-setting")
    d = d[(d["mode"] == "fwd") & d["impl"].isin(GENERATIONS + REFERENCES)]
    ours3 = finished(d[d["impl"] == FA3])
    require(ours3, "no ok timed forward rows of ours-fa3 in experiment 'fa2-setting'")
    head_dim = int(ours3["head_dim"].value_counts().idxmax())
    d = d[d["head_dim"] == head_dim]
    ok = finished(d).dropna(subset=["tflops"])
    panels = ok[["dtype", "causal"]].drop_duplicates()
    rank = {t: i for i, t in enumerate(DTYPE_ORDER)}
    panels = panels.assign(o=panels["dtype"].map(rank)).sort_values(["o", "causal"])
    order = [i for i in GENERATIONS + REFERENCES if i in set(ok["impl"])]
    with theme():
        fig, axes = plt.subplots(1, len(panels), figsize=(3.9 * len(panels), 3.4), squeeze=False, sharey=True)
        for ax, (dtype, causal) in zip(axes[0], panels[["dtype", "causal"]].itertuples(index=False), strict=True):
            sub = ok[(ok["dtype"] == dtype) & (ok["causal"] == causal)]
            for impl in order:
                s = sub[sub["impl"] == impl].sort_values("seqlen_q")
                if s.empty:
                    continue
                ax.plot(s["seqlen_q"], s["tflops"], label=impl, **_ladder_style(impl, order))
            log2_x(ax, sub["seqlen_q"])
            ax.set_title(f"{dtype}, d={head_dim}, {'causal' if causal else 'non-causal'}", fontsize=10)
            ax.set_xlabel("sequence length N")
            ax.set_ylim(bottom=0)
        axes[0, 0].set_ylabel("forward TFLOP/s")
        handles = [Line2D([], [], label=impl, **_ladder_style(impl, order)) for impl in order]
        fig.suptitle(title(d, "FA-1 → FA-2 → FA-3, forward"), fontweight="bold")
        fig.tight_layout()
        fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, title="implementation")
        save_with_note(fig, out_png, missing_note(failed(d)))
    cols = ID + ["ms_median", "ms_p20", "ms_p80", "tflops", "kernel_config"]
    return tidy(with_failed(ok, failed(d), cols), extra_sort=["status"])


def fa3_ablation(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """FA-3's ablation (experiment ``fa3-ablation``): forward TFLOP/s of the full schedule and of each
    variant with one technique switched off, beside our FA-2, cuDNN and FlashAttention's own kernel (where it
    ran), one panel per (head dim, mask, N); each bar is labelled with its change against the full schedule
    at the same point."""
    order = ABLATION_ORDER + ["ours-fa2", "sdpa-cudnn", UPSTREAM]
    table = ablation_bars(
        df,
        out_png,
        "fa3-ablation",
        FA3,
        order,
        {**ABLATION_LABELS, UPSTREAM: "FlashAttention's own"},
        "FlashAttention-3 ablation: each technique off in turn",
    )
    return table.rename(columns={"full_tflops": "fa3_tflops"})
