"""Figures of FlashAttention-3: the FA-1 → FA-2 → FA-3 ladder and the FA-3 ablation.

Same contract as every figure (``analysis.core.plotting``): each function takes ``(df, out_png)``, draws what
the table holds, writes the PNG and returns the tidy frame behind it, or raises ``NoDataError``; points that
did not finish are named in a note under the figure and kept in the returned table with their ``status``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from matplotlib.lines import Line2D

from analysis.core.plotting import DTYPE_ORDER, fmt_n, line_style, log2_x, require, theme
from analysis.families.attention.plots import (
    ID,
    failed,
    missing_note,
    ok_timed,
    prepare,
    save_with_note,
    tidy,
    title,
    with_failed,
)

GENERATIONS = ["ours-fa1", "ours-fa2", "ours-fa3"]  # our kernels, oldest first
REFERENCES = ["sdpa-flash", "sdpa-cudnn"]  # PyTorch's FA-2 backend and cuDNN's Hopper kernel, for scale
FA3 = "ours-fa3"
ABLATION_ORDER = [FA3, "ours-fa3-no-pingpong", "ours-fa3-no-overlap", "ours-fa3-no-tma", "ours-fa3-no-warp-specialize"]
ABLATION_LABELS = {
    FA3: "FA-3 (all on)",
    "ours-fa3-no-pingpong": "no ping-pong",
    "ours-fa3-no-overlap": "no softmax/GEMM overlap",
    "ours-fa3-no-tma": "no TMA (cp.async)",
    "ours-fa3-no-warp-specialize": "no warp specialisation",
    "ours-fa2": "our FA-2 (Triton)",
    "sdpa-cudnn": "SDPA cuDNN",
}


def _ladder_style(impl: str, order: list[str]) -> dict:
    style = line_style(impl, order)
    if impl in REFERENCES:
        style.update(linestyle="--", linewidth=1.2)
    return style


def fa3_ladder(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """Forward TFLOP/s against N of our three generations (FA-1, FA-2, FA-3) with SDPA's FA-2 and cuDNN
    backends for scale, in the FA-2 setting (``fa2-setting`` rows), one panel per (dtype, mask) at the
    head dim where FA-3 was measured most (128 in the default grid)."""
    d = prepare(df, "fa2-setting")
    d = d[(d["mode"] == "fwd") & d["impl"].isin(GENERATIONS + REFERENCES)]
    ours3 = ok_timed(d[d["impl"] == FA3])
    require(ours3, "no ok timed forward rows of ours-fa3 in experiment 'fa2-setting'")
    head_dim = int(ours3["head_dim"].value_counts().idxmax())
    d = d[d["head_dim"] == head_dim]
    ok = ok_timed(d).dropna(subset=["tflops"])
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
    variant with one technique switched off, beside our FA-2 and cuDNN, one panel per (head dim, mask, N);
    each bar is labelled with its change against the full schedule at the same point."""
    order = ABLATION_ORDER + ["ours-fa2", "sdpa-cudnn"]
    table = ablation_bars(
        df,
        out_png,
        "fa3-ablation",
        FA3,
        order,
        ABLATION_LABELS,
        "FlashAttention-3 ablation: each technique off in turn",
    )
    return table.rename(columns={"full_tflops": "fa3_tflops"})


def ablation_bars(
    df: pd.DataFrame, out_png, experiment: str, full: str, order: list[str], labels: dict[str, str], heading: str
) -> pd.DataFrame:
    """An ablation's bars (the rows of ``experiment``): forward TFLOP/s of ``full`` and of every other
    implementation of ``order`` present, one panel per (dtype, head dim, mask, N), each bar labelled with its
    change against ``full`` at the same point (column ``change_pct``; ``full_tflops``)."""
    d = prepare(df, experiment)
    ok = ok_timed(d).dropna(subset=["tflops"])
    keys = ["dtype", "head_dim", "causal", "seqlen_q", "batch", "heads"]
    ref = ok[ok["impl"] == full][keys + ["tflops"]].rename(columns={"tflops": "full_tflops"})
    ok = ok.merge(ref, on=keys, how="inner")
    require(ok, f"no ok timed rows of {experiment!r} with {full}")
    ok = ok.assign(change_pct=100 * (ok["tflops"] / ok["full_tflops"] - 1))
    order = [i for i in order if i in set(ok["impl"])]
    panels = ok[keys[:4]].drop_duplicates().sort_values(["head_dim", "causal", "seqlen_q"])
    palette = dict(zip(order, sns.color_palette("colorblind", len(order)), strict=True))
    with theme():
        width = max(3.6, 0.55 * len(order) + 1.2)  # per panel: room for every bar's label
        fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), 3.9), squeeze=False, sharey=True)
        for ax, p in zip(axes[0], panels.itertuples(index=False), strict=True):
            sub = ok[
                (ok["dtype"] == p.dtype)
                & (ok["head_dim"] == p.head_dim)
                & (ok["causal"] == p.causal)
                & (ok["seqlen_q"] == p.seqlen_q)
            ].set_index("impl")
            present = [i for i in order if i in sub.index]
            ax.bar(range(len(present)), sub.loc[present, "tflops"], color=[palette[i] for i in present])
            for x, impl in enumerate(present):
                change = sub.loc[impl, "change_pct"]
                text = f"{sub.loc[impl, 'tflops']:.0f}" + ("" if impl == full else f"\n{change:+.0f}%")
                ax.annotate(
                    text,
                    (x, sub.loc[impl, "tflops"]),
                    textcoords="offset points",
                    xytext=(0, 2),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
            ax.set_xticks(range(len(present)))
            ax.set_xticklabels([labels.get(i, i) for i in present], rotation=40, ha="right", fontsize=7.5)
            ax.set_title(
                f"{p.dtype}, d={p.head_dim}, {'causal' if p.causal else 'non-causal'}, N={fmt_n(p.seqlen_q)}",
                fontsize=9,
            )
            ax.margins(y=0.18)
        axes[0, 0].set_ylabel("forward TFLOP/s")
        fig.suptitle(title(d, heading), fontweight="bold")
        fig.tight_layout()
        save_with_note(fig, out_png, missing_note(failed(d)))
    cols = ID + ["ms_median", "ms_p20", "ms_p80", "tflops", "full_tflops", "change_pct", "kernel_config"]
    return tidy(with_failed(ok, failed(d), cols), extra_sort=["status"])
