"""Figures of FP8 attention: its speed against the 16-bit kernels and this run's GEMM ceilings, and its accuracy.

Same contract as every figure (``analysis.core.plotting``), drawn from the FP8 rows of the attention table with
the attention table's helpers (``analysis.families._shared.attention_plots``).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from analysis.core.family import Figure
from analysis.core.plotting import DTYPE_ORDER, OURS, fmt_n, impl_order, line_style, log2_x, require, theme
from analysis.core.tables import finished
from analysis.families._shared.attention_plots import (
    ID,
    ablation_bars,
    failed,
    missing_note,
    pair,
    prepare,
    save_with_note,
    tidy,
    title,
    with_failed,
)
from analysis.families._shared.fa3_ablation import ABLATION_LABELS, ABLATION_ORDER

CEILINGS = {"fp8-mm": "FP8 GEMM ceiling", "bf16-mm": "bf16 GEMM ceiling"}


def fp8_speed(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """Forward TFLOP/s against N of our FP8 kernels (on quantised inputs and, ``-e2e``, on the bf16 ones with
    the quantiser timed), our bf16 FA-3 / FA-2 and SDPA (experiment ``fp8-speed``), one
    panel per (head_dim, mask), with this run's FP8 and bf16 GEMM ceilings (median over the shard's
    points) as horizontal lines; the returned table adds each row's speed-up over ours-fa2."""
    d = prepare(df, "fp8-speed")
    ok = finished(d).dropna(subset=["tflops"])
    require(ok, "no ok timed rows of 'fp8-speed'")
    curves = ok[~ok["impl"].isin(list(CEILINGS))]
    ceil = ok[ok["impl"].isin(list(CEILINGS))]
    require(curves, "no ok timed attention rows of 'fp8-speed'")
    panels = sorted(curves["panel"].unique())
    order = impl_order(curves["impl"].unique())
    with theme():
        fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels) + 1, 3.8), squeeze=False, sharey=True)
        for ax, panel in zip(axes[0], panels, strict=True):
            here = curves[curves["panel"] == panel]
            for impl in order:
                r = here[here["impl"] == impl].sort_values("seqlen_q")
                if len(r):
                    ax.plot(r["seqlen_q"], r["tflops"], label=impl, **line_style(impl, order))
            for impl, text in CEILINGS.items():
                c = ceil[(ceil["panel"] == panel) & (ceil["impl"] == impl)]["tflops"]
                if len(c):
                    ax.axhline(c.median(), color="0.35", ls="--" if impl == "fp8-mm" else ":", lw=1)
                    ax.text(
                        here["seqlen_q"].min(),
                        c.median(),
                        f" {text} {c.median():.0f}",
                        va="bottom",
                        fontsize=7.5,
                        color="0.3",
                    )
            log2_x(ax, here["seqlen_q"].unique())
            ax.set_title(panel, fontsize=9.5)
            ax.set_xlabel("sequence length N")
        axes[0, 0].set_ylabel("forward TFLOP/s")
        axes[0, 0].set_ylim(bottom=0)
        axes[0, -1].legend(fontsize=7.5, loc="lower right")
        fig.suptitle(
            title(d, "FP8 attention forward: inputs quantised before timing; -e2e: quantisation timed too"),
            fontweight="bold",
        )
        fig.tight_layout()
        save_with_note(fig, out_png, missing_note(failed(d)))
    keys = ["dtype", "head_dim", "causal", "batch", "heads", "seqlen_q", "seqlen_k"]
    paired = pair(curves, keys, OURS)  # every attention row beside ours-fa2's time at its point
    paired["speedup_vs_fa2"] = paired["ms_median_ref"] / paired["ms_median"]
    table = pd.concat([paired, ok[ok["impl"] == OURS].assign(speedup_vs_fa2=1.0), ceil], ignore_index=True)
    cols = ID + ["ms_median", "tflops", "speedup_vs_fa2", "kernel_config"]
    return tidy(with_failed(table, failed(d), [c for c in cols if c in table.columns]))


FP8_ACCURACY_ORDER = [
    "naive",
    "ours-fa2",
    "ours-fp8-none",
    "ours-fp8-tensor",
    "ours-fp8-tensor-rot",
    "ours-fp8-head",
    "ours-fp8-head-rot",
    "ours-fp8-block",
    "ours-fp8-block-rot",
    "ours-fp8-block-p1",
]


def fp8_accuracy(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """RMS error against float64 of the same inputs (experiment ``fp8-accuracy``): one panel per input
    distribution, bars per implementation and input dtype at the largest N, log scale; below, the share
    of P that e4m3 flushes to zero there, per FP8 variant (with and without P's scale)."""
    d = prepare(df, "fp8-accuracy")
    ok = d[d["status"] == "ok"].dropna(subset=["rms_err"])
    require(ok, "no ok rows of 'fp8-accuracy'")
    inputs = [i for i in ("normal", "outliers", "large", "small") if i in set(ok["inputs"])]
    largest = ok["seqlen_q"].max()
    at_n = ok[ok["seqlen_q"] == largest]
    order = [i for i in FP8_ACCURACY_ORDER if i in set(at_n["impl"])] + sorted(
        set(at_n["impl"]) - set(FP8_ACCURACY_ORDER)
    )
    dtypes = [t for t in DTYPE_ORDER if t in set(at_n["dtype"])]
    with theme():
        fig, axes = plt.subplots(2, len(inputs), figsize=(4.6 * len(inputs) + 1, 7.2), squeeze=False)
        for j, kind in enumerate(inputs):
            ax = axes[0, j]
            here = at_n[at_n["inputs"] == kind]
            sns.barplot(
                data=here, x="impl", y="rms_err", hue="dtype", order=order, hue_order=dtypes, ax=ax, palette="muted"
            )
            ax.set_yscale("log")
            ax.set_title(f"inputs: {kind}, N={fmt_n(largest)}", fontsize=9.5)
            ax.set_xlabel("")
            ax.set_ylabel("RMS error vs float64" if j == 0 else "")
            ax.tick_params(axis="x", rotation=40, labelsize=7.5)
            for lab in ax.get_xticklabels():
                lab.set_ha("right")
            if j:
                ax.get_legend().remove()
            ax2 = axes[1, j]
            under = here[here["p_underflow"].notna()].assign(p_flushed=lambda t: 100 * t["p_underflow"])
            fp8_impls = [i for i in order if i in set(under["impl"])]
            if fp8_impls:
                sns.barplot(
                    data=under,
                    x="impl",
                    y="p_flushed",
                    hue="dtype",
                    order=fp8_impls,
                    hue_order=dtypes,
                    ax=ax2,
                    palette="muted",
                    legend=False,
                )
                top = float(under["p_flushed"].max())
                ax2.set_ylim(0, 1.15 * top if top > 0 else 1.0)  # never below zero: a share of P
                if top == 0:
                    ax2.text(
                        0.5,
                        0.5,
                        "no element of P flushed",
                        transform=ax2.transAxes,
                        ha="center",
                        va="center",
                        color="#555",
                    )
                ax2.tick_params(axis="x", rotation=40, labelsize=7.5)
                for lab in ax2.get_xticklabels():
                    lab.set_ha("right")
            else:
                ax2.set_visible(False)
            ax2.set_xlabel("")
            ax2.set_ylabel(f"% of P flushed to 0 by e4m3, N={fmt_n(largest)}" if j == 0 else "")
        fig.suptitle(title(d, "FP8 attention accuracy"), fontweight="bold")
        fig.tight_layout()
        save_with_note(fig, out_png, missing_note(failed(d)))
    cols = ID + ["inputs", "rms_err", "max_abs_err", "p_underflow", "p_mass_lost", "kernel_config"]
    return tidy(with_failed(ok, failed(d), [c for c in cols if c in ok.columns]), extra_sort=["inputs"])


FP8_FULL = "ours-fp8-block-fa3"  # FA-3's full schedule on e4m3 (the FP8 kernel's default leaves ping-pong off)
# the bf16 ablation's order, its implementations renamed to the FP8 kernel's
FP8_ABLATION_ORDER = [FP8_FULL] + [f"ours-fp8-block-{impl.removeprefix('ours-fa3-')}" for impl in ABLATION_ORDER[1:]]
FP8_ABLATION_LABELS = {
    FP8_FULL: "FP8 FA-3 (all on)",
    **{
        f"ours-fp8-block-{impl.removeprefix('ours-fa3-')}": f"FP8, {text}"
        for impl, text in ABLATION_LABELS.items()
        if impl.startswith("ours-fa3-")
    },
    **{impl: f"bf16, {text}" if impl.startswith("ours-fa3") else text for impl, text in ABLATION_LABELS.items()},
}


def fp8_ablation(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """FA-3's ablation on e4m3 (experiment ``fp8-ablation``): forward TFLOP/s of our FP8 FA-3 kernel (per-block
    scales, inputs quantised before timing) and of each variant with one technique switched off, beside our
    bf16 FA-3 (and its variants, where measured) on the same inputs; each bar labelled with its change
    against the full FP8 kernel at the same point."""
    return ablation_bars(
        df,
        out_png,
        "fp8-ablation",
        FP8_FULL,
        FP8_ABLATION_ORDER + ABLATION_ORDER + ["ours-fa2", "sdpa-cudnn"],
        FP8_ABLATION_LABELS,
        "FA-3 ablation in FP8 (e4m3): one technique off at a time",
    )


# name -> figure (caption: captions/<name>.rst; section: the report section)
FIGURES = {
    "fp8_speed": Figure(fp8_speed, "fp8-speed"),
    "fp8_ablation": Figure(fp8_ablation, "fp8-ablation"),
    "fp8_accuracy": Figure(fp8_accuracy, "fp8-accuracy"),
}
