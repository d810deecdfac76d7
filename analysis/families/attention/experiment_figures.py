"""Figures of the attention experiments beyond the FA-2 setting: FA-1's Figure 3, the gain surface, the block
sweep, the rescaling ablation, decoding and variable-length batches.

Same contract as every figure (``analysis.core.plotting``, whose palette and style these share): each function takes
``(df, out_png)``, draws what the table holds, writes the PNG and returns the tidy frame behind it, or
raises ``NoDataError`` when it has nothing to draw. A figure drawn from a partial table says what is
missing: points of its experiment that did not finish (out of memory, refused, mismatched) are listed in
a note under the figure, with their status, and the returned table keeps them with their ``status``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.ticker import FuncFormatter, NullFormatter

from analysis.core.plotting import DTYPE_ORDER, OURS, colour, fmt_n, impl_order, line_style, log2_x, require, theme
from analysis.core.tables import finished
from analysis.families._shared.attention_plots import (
    ID,
    failed,
    missing_note,
    pair,
    prepare,
    save_with_note,
    tidy,
    title,
    with_failed,
)
from analysis.families.attention.plots import BASELINE

FA1 = "ours-fa1"


_FA1_KEYS = ["dtype", "head_dim", "causal", "batch", "heads", "seqlen_q", "seqlen_k", "mode"]


def fa1_figure3(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """FA-1 paper Figure 3 analogue (experiment ``fa1-setting``): speed-up over naive attention (naive median
    time / ours) and memory saving (naive extra peak memory / ours) against N for ours-fa2 and ours-fa1, one
    row of panels per mode. Where naive ran out of memory there is no ratio: a dotted line marks the first
    such N.
    """
    d = prepare(df, "fa1-setting")
    ok = finished(d)
    pairs = pair(ok, _FA1_KEYS, BASELINE).merge(
        ok[ok["impl"] == BASELINE][_FA1_KEYS + ["peak_mem_mib"]].rename(columns={"peak_mem_mib": "peak_ref"}),
        on=_FA1_KEYS,
    )
    pairs = pairs[pairs["impl"].isin([OURS, FA1])].assign(
        speedup=lambda x: x["ms_median_ref"] / x["ms_median"],
        memory_saving=lambda x: x["peak_ref"] / x["peak_mem_mib"],
    )
    require(pairs, "no ok timed rows of 'fa1-setting' with ours and naive at the same N")
    naive_oom = d[(d["impl"] == BASELINE) & (d["status"] == "oom")]
    modes = [m for m in ("fwd", "bwd", "fwd+bwd") if m in set(pairs["mode"])]
    order = impl_order(pairs["impl"].unique())
    with theme():
        fig, axes = plt.subplots(len(modes), 2, figsize=(9.5, 3.2 * len(modes)), squeeze=False)
        for row, mode in enumerate(modes):
            sub = pairs[pairs["mode"] == mode]
            oom_n = naive_oom[naive_oom["mode"] == mode]["seqlen_q"]
            for col, (value, label) in enumerate(
                (("speedup", "speed-up over naive (×)"), ("memory_saving", "memory saving over naive (×)"))
            ):
                ax = axes[row, col]
                ax.axhline(1.0, color="#7f7f7f", linestyle="--", linewidth=1)
                for impl in order:
                    s = sub[sub["impl"] == impl].sort_values("seqlen_q")
                    if not s.empty:
                        style = line_style(impl, order)
                        if impl != OURS:  # drawn dashed on top: equal memory savings would hide it otherwise
                            style.update(linestyle="--", zorder=6)
                        ax.plot(s["seqlen_q"], s[value], label=impl, **style)
                        for x, y in zip(s["seqlen_q"], s[value], strict=True):
                            ax.annotate(
                                f"{y:.1f}",
                                (x, y),
                                textcoords="offset points",
                                xytext=(0, 5),
                                fontsize=7,
                                ha="center",
                                color=colour(impl, order),
                            )
                if len(oom_n):
                    ax.axvline(oom_n.min(), color="black", linestyle=":", linewidth=1)
                    ax.text(
                        oom_n.min(),
                        0.97,
                        "naive out of memory ",
                        transform=ax.get_xaxis_transform(),
                        fontsize=7.5,
                        va="top",
                        ha="right",
                    )
                log2_x(ax, d["seqlen_q"])
                ax.set_yscale("log", base=2)
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                ax.set_title(f"{mode}: {label.split(' (')[0]}", fontsize=10)
                ax.set_xlabel("sequence length N")
                ax.set_ylabel(label)
        axes[0, 0].legend(title="implementation", fontsize=8)
        fig.suptitle(title(d, "FlashAttention-1 paper, Figure 3 setting"), fontweight="bold")
        fig.tight_layout()
        save_with_note(fig, out_png, missing_note(failed(d)))
    cols = ID + ["ms_median", "ms_median_ref", "speedup", "peak_mem_mib", "peak_ref", "memory_saving"]
    table = with_failed(pairs, failed(d), cols).rename(
        columns={"ms_median_ref": "naive_ms_median", "peak_ref": "naive_peak_mem_mib"}
    )
    return tidy(table, extra_sort=["mode", "status"])


def gain_surface(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """Speed-up of ours-fa2 over naive attention (naive median time / ours) over sequence length N (columns)
    and head dim d (rows), experiment ``gain-surface``, one heatmap per mode, annotated; a cell where either
    did not finish shows its status instead of a number.
    """
    d = prepare(df, "gain-surface")
    keys = ["dtype", "causal", "batch", "heads", "head_dim", "seqlen_q", "seqlen_k", "mode"]
    pairs = pair(finished(d), keys, BASELINE)
    pairs = pairs[pairs["impl"] == OURS].assign(speedup=lambda x: x["ms_median_ref"] / x["ms_median"])
    require(pairs, "no ok timed rows of 'gain-surface' with ours and naive at the same point")
    bad = failed(d)
    modes = [m for m in ("fwd", "bwd", "fwd+bwd") if m in set(pairs["mode"])]
    with theme():
        width = max(5.0, 2.2 + 1.0 * d["seqlen_q"].nunique())
        height = max(3.0, 1.4 + 0.6 * d["head_dim"].nunique())
        fig, axes = plt.subplots(1, len(modes), figsize=(width * len(modes), height), squeeze=False)
        for ax, mode in zip(axes[0], modes, strict=True):
            sub = pairs[pairs["mode"] == mode]
            grid = sub.pivot_table(index="head_dim", columns="seqlen_q", values="speedup", aggfunc="median")
            all_d = sorted(d[d["mode"] == mode]["head_dim"].unique())
            all_n = sorted(d[d["mode"] == mode]["seqlen_q"].unique())
            grid = grid.reindex(index=all_d, columns=all_n)
            text = grid.map(lambda v: "" if pd.isna(v) else f"{v:.1f}×")
            vmax = max(2.0, float(np.nanmax(grid.to_numpy())))
            sns.heatmap(
                np.log2(grid.astype(float)),
                ax=ax,
                annot=text.to_numpy(),
                fmt="",
                cmap="RdBu_r",
                center=0,
                vmin=-np.log2(vmax),
                vmax=np.log2(vmax),
                linewidths=0.5,
                linecolor="white",
                cbar_kws={"label": "log₂ speed-up over naive"},
                annot_kws={"fontsize": 8},
            )
            ax.grid(False)
            ax.set_facecolor("#eeeeee")  # a cell without a ratio
            # seaborn leaves empty cells unannotated: name what happened there
            for r in bad[bad["mode"] == mode].drop_duplicates(["head_dim", "seqlen_q"]).to_dict("records"):
                if (
                    r["head_dim"] in all_d
                    and r["seqlen_q"] in all_n
                    and pd.isna(grid.loc[r["head_dim"], r["seqlen_q"]])
                ):
                    x, y = all_n.index(r["seqlen_q"]) + 0.5, all_d.index(r["head_dim"]) + 0.5
                    ax.text(x, y, f"{r['impl']}\n{r['status']}", ha="center", va="center", fontsize=7.5, color="#333")
            ax.set_xticklabels([fmt_n(n) for n in all_n])
            ax.set_yticklabels([str(x) for x in all_d], rotation=0)
            ax.set_xlabel("sequence length N")
            ax.set_ylabel("head dim d")
            ax.set_title(f"{mode}: naive time / {OURS} time", fontsize=10)
        fig.suptitle(title(d, "speed-up of our FA-2 over naive attention"), fontweight="bold")
        fig.tight_layout()
        save_with_note(fig, out_png, missing_note(bad))
    cols = ID + ["ms_median", "ms_median_ref", "speedup"]
    table = with_failed(pairs, bad, cols).rename(columns={"ms_median_ref": "naive_ms_median"})
    return tidy(table, extra_sort=["mode", "status"])


def _config_label(text: str) -> str:
    f = dict(p.split("=") for p in str(text).split(",") if "=" in p)
    return f"{f.get('BLOCK_M', '?')}×{f.get('BLOCK_N', '?')} w{f.get('num_warps', '?')} s{f.get('num_stages', '?')}"


def _config_key(label: str) -> tuple:
    """Sort "128×64 w8 s2" labels by tile rows, tile columns, warps, stages (numerically)."""
    parts = label.replace("×", " ").replace("w", "").replace("s", "").split()
    return tuple(int(x) if x.isdigit() else 0 for x in parts)


def block_sweep(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """Runtime of our FA-2 forward pinned to each block configuration (experiment ``block-sweep``), one panel
    per (head dim, N): bars of the median time with the 20–80th percentile range, the fastest configuration
    darker; a configuration that failed is named under its empty slot with its status.
    """
    d = prepare(df, "block-sweep")
    d["config"] = d["kernel_config"].fillna("").map(_config_label)
    ok = finished(d).dropna(subset=["ms_median"])
    require(ok, "no ok timed rows of 'block-sweep'")
    panels = d[["head_dim", "seqlen_q"]].drop_duplicates().sort_values(["head_dim", "seqlen_q"])
    configs = sorted(set(d["config"]), key=_config_key)
    with theme():
        fig, axes = plt.subplots(1, len(panels), figsize=(0.55 * len(configs) * len(panels) + 2.5, 3.6), squeeze=False)
        for ax, (hd, n) in zip(axes[0], panels.itertuples(index=False), strict=True):
            here = d[(d["head_dim"] == hd) & (d["seqlen_q"] == n)]
            good = ok[(ok["head_dim"] == hd) & (ok["seqlen_q"] == n)].set_index("config")
            best = good["ms_median"].idxmin() if not good.empty else None
            x = np.arange(len(configs))
            for i, cfg in enumerate(configs):
                if cfg in good.index:
                    r = good.loc[cfg]
                    shade = "#8b1a1a" if cfg == best else "#e08080"
                    ax.bar(
                        i,
                        r["ms_median"],
                        color=shade,
                        width=0.7,
                        yerr=[[r["ms_median"] - r["ms_p20"]], [r["ms_p80"] - r["ms_median"]]],
                        capsize=2,
                    )
                    ax.text(i, r["ms_p80"], f"{r['tflops']:.0f}", ha="center", va="bottom", fontsize=7)
                else:
                    status = here[here["config"] == cfg]["status"]
                    if len(status):
                        ax.text(
                            i,
                            0.02,
                            str(status.iloc[0]),
                            transform=ax.get_xaxis_transform(),
                            rotation=90,
                            ha="center",
                            va="bottom",
                            fontsize=8,
                            color="#444",
                        )
            ax.set_xticks(x)
            ax.set_xticklabels(configs, rotation=60, ha="right", fontsize=8)
            ax.set_title(
                f"d={hd}, N={fmt_n(n)} (B={int(here['batch'].iloc[0])}, H={int(here['heads'].iloc[0])})", fontsize=10
            )
            ax.set_ylabel("median time (ms)")
            ax.margins(y=0.15)
        fig.suptitle(title(d, "our FA-2 forward per block configuration (label: TFLOP/s)"), fontweight="bold")
        fig.tight_layout()
        save_with_note(fig, out_png, missing_note(failed(d)))
    cols = ID + ["kernel_config", "config", "ms_median", "ms_p20", "ms_p80", "tflops"]
    return tidy(with_failed(ok, failed(d), cols), extra_sort=["status", "kernel_config"])


def rescale_ablation(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """Eager over lazy rescaling (experiment ``rescale-ablation``): the median time of ours-fa2-eager
    (normalising at every K/V tile) divided by that of ours-fa2 (one division at the end) against N, one
    line per dtype, panels per head dim and mask. Above 1, the lazy kernel is faster.
    """
    d = prepare(df, "rescale-ablation")
    keys = ["dtype", "head_dim", "causal", "batch", "heads", "seqlen_q", "seqlen_k", "mode"]
    pairs = pair(finished(d), keys, OURS)
    pairs = pairs[pairs["impl"] == "ours-fa2-eager"].assign(ratio=lambda x: x["ms_median"] / x["ms_median_ref"])
    require(pairs, "no ok timed rows of 'rescale-ablation' with both the lazy and the eager kernel")
    panels = pairs[["head_dim", "causal", "panel"]].drop_duplicates().sort_values(["head_dim", "causal"])
    dtypes = [t for t in DTYPE_ORDER if t in set(pairs["dtype"])]
    colours = dict(zip(dtypes, sns.color_palette("colorblind", len(dtypes)), strict=True))
    with theme():
        fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.3), squeeze=False, sharey=True)
        for ax, p in zip(axes[0], panels.itertuples(index=False), strict=True):
            ax.axhline(1.0, color="#7f7f7f", linestyle="--", linewidth=1)
            sub = pairs[pairs["panel"] == p.panel]
            for dtype in dtypes:
                s = sub[sub["dtype"] == dtype].sort_values("seqlen_q")
                if not s.empty:
                    ax.plot(s["seqlen_q"], s["ratio"], marker="o", color=colours[dtype], label=dtype)
                    for x, y in zip(s["seqlen_q"], s["ratio"], strict=True):
                        ax.annotate(
                            f"{y:.2f}", (x, y), textcoords="offset points", xytext=(0, 5), fontsize=7, ha="center"
                        )
            log2_x(ax, d["seqlen_q"])
            ax.set_title(p.panel, fontsize=10)
            ax.set_xlabel("sequence length N")
        axes[0, 0].set_ylabel("eager time / lazy time")
        axes[0, 0].legend(title="dtype", fontsize=8)
        fig.suptitle(title(d, "lazy against eager rescaling (forward)"), fontweight="bold")
        fig.tight_layout()
        save_with_note(fig, out_png, missing_note(failed(d)))
    cols = ID + ["ms_median", "ms_median_ref", "ratio", "kernel_config"]
    table = with_failed(pairs, failed(d), cols).rename(columns={"ms_median_ref": "lazy_ms_median"})
    return tidy(table, extra_sort=["status"])


COPY = "copy-kv"


def decode_latency(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """Decoding (experiment ``decode``): median latency against K/V length, log–log, per implementation
    (left), and the bandwidth each achieved, ``model_bytes`` / time in GB/s (right), with the measured
    device-copy bandwidth of the same K/V bytes (``copy-kv``) as the dashed reference. One row of panels per
    (K/V heads, query length).
    """
    d = prepare(df, "decode")
    ok = finished(d).dropna(subset=["ms_median"])
    require(ok, "no ok timed rows of 'decode'")
    settings = (
        ok[["heads_kv", "seqlen_q"]].drop_duplicates().sort_values(["heads_kv", "seqlen_q"], ascending=[False, True])
    )
    order = impl_order([i for i in ok["impl"].unique() if i != COPY])
    with theme():
        fig, axes = plt.subplots(len(settings), 2, figsize=(11, 3.4 * len(settings)), squeeze=False)
        for row, (hk, nq) in enumerate(settings.itertuples(index=False)):
            sub = ok[(ok["heads_kv"] == hk) & (ok["seqlen_q"] == nq)]
            copy = sub[sub["impl"] == COPY].sort_values("seqlen_k")
            h = int(sub["heads"].iloc[0])
            for col, value in enumerate(("ms_median", "gbps")):
                ax = axes[row, col]
                for impl in order:
                    s = sub[sub["impl"] == impl].sort_values("seqlen_k")
                    if not s.empty:
                        ax.plot(s["seqlen_k"], s[value], label=impl, **line_style(impl, order))
                if not copy.empty:
                    ax.plot(
                        copy["seqlen_k"],
                        copy[value],
                        color="black",
                        linestyle="--",
                        linewidth=1.3,
                        label=f"{COPY} (device copy of K and V)",
                    )
                log2_x(ax, d["seqlen_k"])
                ax.set_yscale("log")
                ax.yaxis.set_minor_formatter(NullFormatter())
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                ax.set_xlabel("K/V length")
                what = "latency (ms)" if value == "ms_median" else "achieved GB/s (K+V+Q+O bytes / time)"
                ax.set_ylabel(what)
                ax.set_title(f"H={h}, H_kv={hk}, query length {nq}: {what.split(' (')[0]}", fontsize=10)
        handles, labels = axes[0, 0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), title="implementation", fontsize=8)
        fig.suptitle(title(d, "decoding attention against the K/V length"), fontweight="bold")
        fig.tight_layout()
        save_with_note(fig, out_png, missing_note(failed(d)))
    cols = ID + ["ms_median", "ms_p20", "ms_p80", "model_bytes", "gbps", "tflops", "kernel_config"]
    return tidy(with_failed(ok, failed(d), cols), extra_sort=["status", "heads_kv"])


def varlen_padding(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """One mixed-length batch (experiment ``varlen``): useful TFLOP/s (the real sequences' FLOPs per median
    time) of the packed kernel and of the padded runs, one panel per (mask, mode), each bar labelled with
    its time; the panel title gives the share of the padded batch's FLOPs spent on padding (``pad_waste``).
    """
    d = prepare(df, "varlen")
    ok = finished(d).dropna(subset=["tflops"])
    require(ok, "no ok timed rows of 'varlen'")
    panels = d[["causal", "mode"]].drop_duplicates().sort_values(["causal", "mode"])
    order = impl_order(d["impl"].unique())
    with theme():
        fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels) + 1, 3.6), squeeze=False, sharey=True)
        for ax, (causal, mode) in zip(axes[0], panels.itertuples(index=False), strict=True):
            here = d[(d["causal"] == causal) & (d["mode"] == mode)]
            good = ok[(ok["causal"] == causal) & (ok["mode"] == mode)].set_index("impl")
            for i, impl in enumerate(order):
                if impl in good.index:
                    r = good.loc[impl]
                    ax.bar(i, r["tflops"], color=colour(impl, order), width=0.7)
                    ax.text(i, r["tflops"], f"{r['ms_median']:.3g} ms", ha="center", va="bottom", fontsize=8)
                else:
                    status = here[here["impl"] == impl]["status"]
                    if len(status):
                        ax.text(i, 0, str(status.iloc[0]), rotation=90, ha="center", va="bottom", fontsize=8)
            waste = here["pad_waste"].dropna()
            waste_text = f", padding {100 * waste.iloc[0]:.0f}% of padded FLOPs" if len(waste) else ""
            ax.set_title(f"{'causal' if causal else 'non-causal'}, {mode}{waste_text}", fontsize=9.5)
            ax.set_xticks(range(len(order)))
            ax.set_xticklabels(order, rotation=30, ha="right", fontsize=8.5)
            ax.margins(y=0.15)
        axes[0, 0].set_ylabel("useful TFLOP/s")
        first = d.iloc[0]
        tokens = f"{int(first['tokens'])} tokens" if pd.notna(first["tokens"]) else ""
        what = f"one batch of {int(first['batch'])} sequences, {tokens}, longest {int(first['seqlen_q'])}"
        gpu = str(first["gpu_name"]) if pd.notna(first["gpu_name"]) else str(first["gpu"])
        fig.suptitle(
            f"{gpu}: packed against padded attention ({what}, H={int(first['heads'])}, "
            f"d={int(first['head_dim'])}, {first['dtype']})",
            fontweight="bold",
        )
        fig.tight_layout()
        save_with_note(fig, out_png, missing_note(failed(d)))
    cols = ID + ["tokens", "pad_waste", "ms_median", "tflops", "message"]
    table = pd.concat([ok, failed(d)], ignore_index=True)
    return tidy(table[[c for c in cols if c in table.columns] + ["status"]], extra_sort=["mode", "status"])
