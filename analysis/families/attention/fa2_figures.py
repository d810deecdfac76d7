"""Figures of the FlashAttention-2 setting and the memory experiment: throughput per mode, speed-up over naive
attention, extra peak memory; and the GPU types side by side.

Each function takes ``(df, out_png)`` (rows of the attention table), writes the PNG and returns the tidy frame
it plotted (``analysis.core.plotting``); only rows that finished and were timed are drawn, and points that did
not finish are named in a note under the figure.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullFormatter

from analysis.core.plotting import (
    DTYPE_ORDER,
    FACET_ASPECT,
    FACET_HEIGHT,
    OURS,
    PALETTE,
    NotMeasured,
    colour,
    impl_order,
    legend_handles,
    line_style,
    log2_x,
    note,
    require,
    save,
    theme,
)
from analysis.core.tables import finished
from analysis.families._shared.attention_plots import ID, missing_note, prepare, tidy, title
from analysis.families.attention.plots import (
    BASELINE,
    MATCH,
    MODE_TEXT,
    fa2_forward,
    fa2_mode,
    facet_grid,
    facets,
    finish,
)


def _tflops(df: pd.DataFrame, out_png, mode: str) -> pd.DataFrame:
    d = fa2_mode(df, mode).dropna(subset=["tflops"])
    prepared = prepare(df, "fa2-setting")
    if not (prepared["mode"] == mode).any():
        raise NotMeasured(f"this run measured no {mode} rows of experiment 'fa2-setting'")
    require(d, f"no ok timed {mode} rows for experiment 'fa2-setting'")
    bad = prepared[(prepared["mode"] == mode) & (prepared["status"] != "ok")]
    d = d.assign(
        tflops_lo=d["tflops"] * d["ms_median"] / d["ms_p80"],
        tflops_hi=d["tflops"] * d["ms_median"] / d["ms_p20"],
    )
    order = impl_order(d["impl"].unique())
    with theme():
        g = facet_grid(d)
        for ax, sub in facets(g, d):
            for impl in order:
                s = sub[sub["impl"] == impl].sort_values("seqlen_q")
                if s.empty:
                    continue
                style = line_style(impl, order)
                ax.plot(s["seqlen_q"], s["tflops"], **style)
                ax.fill_between(
                    s["seqlen_q"],
                    s["tflops_lo"],
                    s["tflops_hi"],
                    color=style["color"],
                    alpha=0.2,
                    linewidth=0,
                    zorder=style["zorder"] - 1,
                )
            log2_x(ax, d["seqlen_q"])
        # after every facet is drawn: the axes share y, and a limit set per facet would clip later ones
        g.axes.flat[0].set_ylim(0, 1.05 * d[["tflops", "tflops_hi"]].max().max())
        if mode != "fwd" or not bad.empty:
            note(g.figure, missing_note(bad))
        finish(
            g,
            title(d, f"{MODE_TEXT[mode]} attention throughput"),
            "sequence length N",
            "TFLOP/s",
            legend_handles(order),
            out_png,
        )
    cols = ID + [
        "ms_median",
        "ms_p20",
        "ms_p80",
        "tflops",
        "tflops_lo",
        "tflops_hi",
        "kernel_config",
    ]
    return tidy(d[cols])


def attention_tflops(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """Forward attention throughput (TFLOP/s) against sequence length N in the FlashAttention-2 setting.

    Experiment ``fa2-setting``, mode ``fwd``: one line per implementation, columns of facets per
    (head_dim, causal), rows per dtype, log2 x-axis. The band spans the throughput at the 80th and
    20th percentile times (``tflops * ms_median / ms_p80`` to ``tflops * ms_median / ms_p20``).
    """
    return _tflops(df, out_png, "fwd")


def attention_tflops_bwd(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """Backward-only throughput (``bwd`` rows of ``fa2-setting``: the gradients, with the forward graph built
    before timing; FLOPs 2.5× the forward's), same facets and band as ``attention_tflops``."""
    return _tflops(df, out_png, "bwd")


def attention_tflops_fwd_bwd(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """Forward + backward throughput (``fwd+bwd`` rows of ``fa2-setting``; FLOPs 3.5× the forward's)."""
    return _tflops(df, out_png, "fwd+bwd")


def speedup_table(df: pd.DataFrame) -> pd.DataFrame:
    """Speed-up over ``naive`` (naive ms_median / impl ms_median) of every other implementation.

    Rows are matched on dtype, head_dim, causal, seqlen_q, seqlen_k, batch, heads and mode; a point
    where naive did not finish (e.g. out of memory) has no speed-up and is left out.
    """
    d = fa2_forward(df).dropna(subset=["ms_median"])
    ref = d[d["impl"] == BASELINE][MATCH + ["ms_median"]].rename(columns={"ms_median": "naive_ms_median"})
    others = d[d["impl"] != BASELINE]
    out = others.merge(ref, on=MATCH, how="inner")
    out = out.assign(speedup=out["naive_ms_median"] / out["ms_median"])
    cols = ID + [
        "ms_median",
        "naive_ms_median",
        "speedup",
        "kernel_config",
    ]
    return tidy(out[cols])


def attention_speedup(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """Forward speed-up of each implementation over naive PyTorch attention against N.

    Experiment ``fa2-setting``, mode ``fwd``; values from ``speedup_table``. Same facets as
    ``attention_tflops``; the dashed line at 1 is naive itself, so a point above it is faster.
    """
    d = speedup_table(df)
    require(d, "no ok timed forward rows of 'fa2-setting' matched to a naive row")
    order = impl_order(d["impl"].unique())
    with theme():
        g = facet_grid(d)
        for ax, sub in facets(g, d):
            ax.axhline(1.0, color=PALETTE[BASELINE], linestyle="--", linewidth=1.2, zorder=2)
            for impl in order:
                s = sub[sub["impl"] == impl].sort_values("seqlen_q")
                if not s.empty:
                    ax.plot(s["seqlen_q"], s["speedup"], **line_style(impl, order))
            log2_x(ax, d["seqlen_q"])
            # speed-ups span from below 1 (sdpa-math) to tens: a log axis shows both ends
            ax.set_yscale("log", base=2)
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        legend = legend_handles(order)
        legend[f"{BASELINE} (= 1)"] = Line2D([], [], color=PALETTE[BASELINE], linestyle="--", linewidth=1.2)
        finish(
            g,
            title(d, "forward speed-up over naive attention"),
            "sequence length N",
            "speed-up over naive (×)",
            legend,
            out_png,
        )
    return d


def attention_memory(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """Extra peak memory of one forward call (MiB) against N, log–log, per implementation.

    Experiment ``memory``, mode ``fwd``. Points that ran out of memory are drawn as an "x" in the
    implementation's colour on the dotted "out of memory" line above all measured values. The returned
    table holds the measured rows and the out-of-memory rows, told apart by ``status``.
    """
    return _memory(df, out_png, "fwd")


def attention_memory_fwd_bwd(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """Extra peak memory of one forward + backward call (``fwd+bwd`` rows of ``memory``), as
    ``attention_memory``."""
    return _memory(df, out_png, "fwd+bwd")


def _memory(df: pd.DataFrame, out_png, mode: str) -> pd.DataFrame:
    d = prepare(df, "memory")
    d = d[d["mode"] == mode]
    ok = finished(d).dropna(subset=["peak_mem_mib"])
    ok = ok[ok["peak_mem_mib"] > 0]  # zero cannot sit on a log axis
    require(ok, f"no ok timed {mode} rows with a peak memory for experiment 'memory'")
    others = d[~d["status"].isin(["ok", "oom"])]
    oom = d[d["status"] == "oom"]
    d = pd.concat([ok, oom], ignore_index=True)
    order = impl_order(d["impl"].unique())
    # One shared level for OOM marks, above every measured value, so they never read as a measurement.
    oom_y = ok["peak_mem_mib"].max() * 3
    with theme():
        # Usually a single panel, so give it the room a whole row of the other figures gets.
        g = facet_grid(d, height=3.6, aspect=1.5)
        for ax, sub in facets(g, d):
            for impl in order:
                s = sub[(sub["impl"] == impl) & (sub["status"] == "ok")].sort_values("seqlen_q")
                if not s.empty:
                    # Tiled kernels need exactly their output here, so their lines coincide: ours goes
                    # underneath and the others dashed on top, so that every one stays visible.
                    style = line_style(impl, order)
                    style.update(zorder=2) if impl == OURS else style.update(linestyle="--")
                    ax.plot(s["seqlen_q"], s["peak_mem_mib"], **style)
            _draw_oom(ax, sub[sub["status"] == "oom"], oom_y, order)
            log2_x(ax, d["seqlen_q"])
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_ylim(top=oom_y * 2.5)
        legend = legend_handles(order)
        if not oom.empty:
            legend["out of memory"] = Line2D(
                [], [], color="black", marker="x", markersize=8, markeredgewidth=2, linestyle=":"
            )
        if not others.empty:
            note(g.figure, missing_note(others))
        finish(
            g,
            title(d, f"extra peak memory of one {MODE_TEXT[mode]} call"),
            "sequence length N",
            "extra peak memory (MiB)",
            legend,
            out_png,
        )
    cols = ID + [
        "status",
        "peak_mem_mib",
        "ms_median",
        "message",
    ]
    return tidy(d[cols], extra_sort=["status"])


def _draw_oom(ax, oom: pd.DataFrame, y: float, order: list[str]) -> None:
    if oom.empty:
        return
    ax.axhline(y, color="black", linestyle=":", linewidth=1, zorder=1)
    ax.text(0.01, y, "out of memory", transform=ax.get_yaxis_transform(), va="bottom", fontsize=8)
    for n, at_n in oom.groupby("seqlen_q"):
        impls = [i for i in order if i in set(at_n["impl"])]
        # Several methods can run out at the same N; spread their marks sideways so none hides another.
        offsets = np.linspace(-0.1, 0.1, len(impls)) if len(impls) > 1 else [0.0]
        for impl, off in zip(impls, offsets, strict=True):
            ax.plot(
                [n * 2**off],
                [y],
                linestyle="none",
                marker="x",
                markersize=9,
                markeredgewidth=2.2,
                color=colour(impl, order),
                zorder=6,
            )


def gpu_comparison(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """The GPU types side by side: forward TFLOP/s and the fraction of each GPU's dense peak reached, per
    implementation, at the largest N of the FlashAttention-2 setting, per (dtype, head_dim, causal).

    ``df`` holds the rows of several GPUs (one table per GPU, concatenated). The peak comes from the GPU
    specification table (``analysis.core.gpus``); a GPU type missing from it gets no fraction.
    """
    from analysis.core import gpus as specs

    d = finished(prepare(df, "fa2-setting", several_gpus=True))
    d = d[d["mode"] == "fwd"].dropna(subset=["tflops"])
    require(d, "no ok timed forward rows for experiment 'fa2-setting'")
    largest = d.groupby(["gpu", "dtype", "head_dim", "causal"])["seqlen_q"].transform("max")
    d = d[d["seqlen_q"] == largest].copy()
    peaks = {}
    for gpu in d["gpu"].unique():
        try:
            peaks[gpu] = specs.peak_tflops(specs.spec(gpu), "fp16")
        except (KeyError, ValueError):
            peaks[gpu] = float("nan")
    d["peak_tflops"] = d["gpu"].map(peaks)
    d["fraction_of_peak"] = d["tflops"] / d["peak_tflops"]
    gpu_order = sorted(d["gpu"].unique())
    order = impl_order(d["impl"].unique())
    panels = d[["head_dim", "causal", "panel"]].drop_duplicates().sort_values(["head_dim", "causal"])["panel"]
    dtypes = [t for t in DTYPE_ORDER if t in set(d["dtype"])]
    palette = dict(zip(gpu_order, sns.color_palette("colorblind", len(gpu_order)), strict=True))
    with theme():
        g = sns.catplot(
            data=d,
            kind="bar",
            x="impl",
            y="tflops",
            hue="gpu",
            col="panel",
            row="dtype",
            order=order,
            hue_order=gpu_order,
            col_order=list(panels),
            row_order=dtypes,
            palette=palette,
            height=FACET_HEIGHT,
            aspect=FACET_ASPECT,
            sharey=True,
            margin_titles=True,
            legend_out=True,
        )
        g.set_titles(row_template="{row_name}", col_template="{col_name}")
        g.set_axis_labels("", "TFLOP/s at the largest N")
        for ax in g.axes.flat:
            ax.tick_params(axis="x", labelrotation=45)
            for label in ax.get_xticklabels():
                label.set_horizontalalignment("right")
        g.figure.suptitle("GPU types side by side: forward throughput, FlashAttention-2 setting", fontweight="bold")
        g.figure.subplots_adjust(top=1 - 0.55 / g.figure.get_figheight())
        save(g.figure, out_png)
    cols = [
        "gpu",
        "gpu_name",
        "dtype",
        "head_dim",
        "causal",
        "impl",
        "batch",
        "heads",
        "seqlen_q",
        "ms_median",
        "tflops",
        "peak_tflops",
        "fraction_of_peak",
        "kernel_config",
    ]
    return d[cols].sort_values(["dtype", "head_dim", "causal", "impl", "gpu"]).reset_index(drop=True)
