"""Figures of the attention experiments beyond the forward FA-2 setting: modes, FA-1's Figure 3, the gain
surface, the block sweep, the rescaling ablation, decoding, variable-length batches and FP8 attention.

Same contract as ``analysis.figures`` (whose helpers, palette and style these share): each function takes
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

from analysis import figures
from analysis.figures import (
    _ID,
    BASELINE,
    DTYPE_ORDER,
    OURS,
    NoDataError,
    _colour,
    _fmt_n,
    _impl_order,
    _line_style,
    _log2_x,
    _note,
    _require,
    _theme,
    _tidy,
    _title,
    failed,
    missing_note,
    ok_timed,
    prepare,
)

FA1 = "ours-fa1"


# ---------------------------------------------------------------------------------------------------
# Shared: what is missing, and saving
# ---------------------------------------------------------------------------------------------------


def _save(fig, out_png, note: str = "") -> None:
    _note(fig, note)
    figures._save(fig, out_png)


def _with_failed(drawn: pd.DataFrame, bad: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    """The table behind a figure: what was drawn, then the failed points (status and message)."""
    cols = [c for c in cols if c in drawn.columns or c in bad.columns]
    extra = [c for c in ("status", "message") if c not in cols]
    out = pd.concat([drawn.assign(status="ok", message=""), bad], ignore_index=True)
    return out[cols + extra].reset_index(drop=True)


def _pair(d: pd.DataFrame, keys: list[str], ref_impl: str, value: str = "ms_median") -> pd.DataFrame:
    """Every other impl's rows joined with ``ref_impl``'s row at the same point (``<value>_ref``)."""
    ref = d[d["impl"] == ref_impl][keys + [value]].rename(columns={value: f"{value}_ref"})
    return d[d["impl"] != ref_impl].merge(ref, on=keys, how="inner")


# ---------------------------------------------------------------------------------------------------
# FA-1 paper, Figure 3: speed-up and memory saving over naive attention
# ---------------------------------------------------------------------------------------------------

_FA1_KEYS = ["dtype", "head_dim", "causal", "batch", "heads", "seqlen_q", "seqlen_k", "mode"]


def fa1_figure3(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """FA-1 paper Figure 3 analogue (experiment ``fa1-setting``): speed-up over naive attention (naive median
    time / ours) and memory saving (naive extra peak memory / ours) against N for ours-fa2 and ours-fa1, one
    row of panels per mode. Where naive ran out of memory there is no ratio: a dotted line marks the first
    such N.
    """
    d = prepare(df, "fa1-setting")
    ok = ok_timed(d)
    pairs = _pair(ok, _FA1_KEYS, BASELINE).merge(
        ok[ok["impl"] == BASELINE][_FA1_KEYS + ["peak_mem_mib"]].rename(columns={"peak_mem_mib": "peak_ref"}),
        on=_FA1_KEYS,
    )
    pairs = pairs[pairs["impl"].isin([OURS, FA1])].assign(
        speedup=lambda x: x["ms_median_ref"] / x["ms_median"],
        memory_saving=lambda x: x["peak_ref"] / x["peak_mem_mib"],
    )
    _require(pairs, "no ok timed rows of 'fa1-setting' with ours and naive at the same N")
    naive_oom = d[(d["impl"] == BASELINE) & (d["status"] == "oom")]
    modes = [m for m in ("fwd", "bwd", "fwd+bwd") if m in set(pairs["mode"])]
    order = _impl_order(pairs["impl"].unique())
    with _theme():
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
                        style = _line_style(impl, order)
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
                                color=_colour(impl, order),
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
                _log2_x(ax, d["seqlen_q"])
                ax.set_yscale("log", base=2)
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                ax.set_title(f"{mode}: {label.split(' (')[0]}", fontsize=10)
                ax.set_xlabel("sequence length N")
                ax.set_ylabel(label)
        axes[0, 0].legend(title="implementation", fontsize=8)
        fig.suptitle(_title(d, "FlashAttention-1 paper, Figure 3 setting"), fontweight="bold")
        fig.tight_layout()
        _save(fig, out_png, missing_note(failed(d)))
    cols = _ID + ["ms_median", "ms_median_ref", "speedup", "peak_mem_mib", "peak_ref", "memory_saving"]
    table = _with_failed(pairs, failed(d), cols).rename(
        columns={"ms_median_ref": "naive_ms_median", "peak_ref": "naive_peak_mem_mib"}
    )
    return _tidy(table, extra_sort=["mode", "status"])


# ---------------------------------------------------------------------------------------------------
# Gain surface: speed-up of ours over naive over N × d
# ---------------------------------------------------------------------------------------------------


def gain_surface(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """Speed-up of ours-fa2 over naive attention (naive median time / ours) over sequence length N (columns)
    and head dim d (rows), experiment ``gain-surface``, one heatmap per mode, annotated; a cell where either
    did not finish shows its status instead of a number.
    """
    d = prepare(df, "gain-surface")
    keys = ["dtype", "causal", "batch", "heads", "head_dim", "seqlen_q", "seqlen_k", "mode"]
    pairs = _pair(ok_timed(d), keys, BASELINE)
    pairs = pairs[pairs["impl"] == OURS].assign(speedup=lambda x: x["ms_median_ref"] / x["ms_median"])
    _require(pairs, "no ok timed rows of 'gain-surface' with ours and naive at the same point")
    bad = failed(d)
    modes = [m for m in ("fwd", "bwd", "fwd+bwd") if m in set(pairs["mode"])]
    with _theme():
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
            ax.set_xticklabels([_fmt_n(n) for n in all_n])
            ax.set_yticklabels([str(x) for x in all_d], rotation=0)
            ax.set_xlabel("sequence length N")
            ax.set_ylabel("head dim d")
            ax.set_title(f"{mode}: naive time / {OURS} time", fontsize=10)
        fig.suptitle(_title(d, "speed-up of our FA-2 over naive attention"), fontweight="bold")
        fig.tight_layout()
        _save(fig, out_png, missing_note(bad))
    cols = _ID + ["ms_median", "ms_median_ref", "speedup"]
    table = _with_failed(pairs, bad, cols).rename(columns={"ms_median_ref": "naive_ms_median"})
    return _tidy(table, extra_sort=["mode", "status"])


# ---------------------------------------------------------------------------------------------------
# Block sweep: runtime per pinned configuration
# ---------------------------------------------------------------------------------------------------


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
    ok = ok_timed(d).dropna(subset=["ms_median"])
    _require(ok, "no ok timed rows of 'block-sweep'")
    panels = d[["head_dim", "seqlen_q"]].drop_duplicates().sort_values(["head_dim", "seqlen_q"])
    configs = sorted(set(d["config"]), key=_config_key)
    with _theme():
        fig, axes = plt.subplots(1, len(panels), figsize=(0.55 * len(configs) * len(panels) + 2.5, 3.6), squeeze=False)
        for ax, (hd, n) in zip(axes[0], panels.itertuples(index=False), strict=True):
            here = d[(d["head_dim"] == hd) & (d["seqlen_q"] == n)]
            good = ok[(ok["head_dim"] == hd) & (ok["seqlen_q"] == n)].set_index("config")
            best = good["ms_median"].idxmin() if not good.empty else None
            x = np.arange(len(configs))
            for i, cfg in enumerate(configs):
                if cfg in good.index:
                    r = good.loc[cfg]
                    colour = "#8b1a1a" if cfg == best else "#e08080"
                    ax.bar(
                        i,
                        r["ms_median"],
                        color=colour,
                        width=0.7,
                        yerr=[[r["ms_median"] - r["ms_p20"]], [r["ms_p80"] - r["ms_median"]]],
                        capsize=2,
                    )
                    ax.text(i, r["ms_p80"], f"{r['tflops']:.0f}", ha="center", va="bottom", fontsize=7)
                else:
                    status = here[here["config"] == cfg]["status"]
                    if len(status):
                        ax.text(i, 0.02, str(status.iloc[0]), transform=ax.get_xaxis_transform(), rotation=90,
                                ha="center", va="bottom", fontsize=8, color="#444")  # fmt: skip
            ax.set_xticks(x)
            ax.set_xticklabels(configs, rotation=60, ha="right", fontsize=8)
            ax.set_title(
                f"d={hd}, N={_fmt_n(n)} (B={int(here['batch'].iloc[0])}, H={int(here['heads'].iloc[0])})", fontsize=10
            )
            ax.set_ylabel("median time (ms)")
            ax.margins(y=0.15)
        fig.suptitle(_title(d, "our FA-2 forward per block configuration (label: TFLOP/s)"), fontweight="bold")
        fig.tight_layout()
        _save(fig, out_png, missing_note(failed(d)))
    cols = _ID + ["kernel_config", "config", "ms_median", "ms_p20", "ms_p80", "tflops"]
    return _tidy(_with_failed(ok, failed(d), cols), extra_sort=["status", "kernel_config"])


# ---------------------------------------------------------------------------------------------------
# Rescaling ablation: eager / lazy
# ---------------------------------------------------------------------------------------------------


def rescale_ablation(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """Eager over lazy rescaling (experiment ``rescale-ablation``): the median time of ours-fa2-eager
    (normalising at every K/V tile) divided by that of ours-fa2 (one division at the end) against N, one
    line per dtype, panels per head dim and mask. Above 1, the lazy kernel is faster.
    """
    d = prepare(df, "rescale-ablation")
    keys = ["dtype", "head_dim", "causal", "batch", "heads", "seqlen_q", "seqlen_k", "mode"]
    pairs = _pair(ok_timed(d), keys, OURS)
    pairs = pairs[pairs["impl"] == "ours-fa2-eager"].assign(ratio=lambda x: x["ms_median"] / x["ms_median_ref"])
    _require(pairs, "no ok timed rows of 'rescale-ablation' with both the lazy and the eager kernel")
    panels = pairs[["head_dim", "causal", "panel"]].drop_duplicates().sort_values(["head_dim", "causal"])
    dtypes = [t for t in DTYPE_ORDER if t in set(pairs["dtype"])]
    colours = dict(zip(dtypes, sns.color_palette("colorblind", len(dtypes)), strict=True))
    with _theme():
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
            _log2_x(ax, d["seqlen_q"])
            ax.set_title(p.panel, fontsize=10)
            ax.set_xlabel("sequence length N")
        axes[0, 0].set_ylabel("eager time / lazy time")
        axes[0, 0].legend(title="dtype", fontsize=8)
        fig.suptitle(_title(d, "lazy against eager rescaling (forward)"), fontweight="bold")
        fig.tight_layout()
        _save(fig, out_png, missing_note(failed(d)))
    cols = _ID + ["ms_median", "ms_median_ref", "ratio", "kernel_config"]
    table = _with_failed(pairs, failed(d), cols).rename(columns={"ms_median_ref": "lazy_ms_median"})
    return _tidy(table, extra_sort=["status"])


# ---------------------------------------------------------------------------------------------------
# Decoding: latency and bandwidth against the K/V length
# ---------------------------------------------------------------------------------------------------

COPY = "copy-kv"


def decode_latency(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """Decoding (experiment ``decode``): median latency against K/V length, log–log, per implementation
    (left), and the bandwidth each achieved, ``model_bytes`` / time in GB/s (right), with the measured
    device-copy bandwidth of the same K/V bytes (``copy-kv``) as the dashed reference. One row of panels per
    (K/V heads, query length).
    """
    d = prepare(df, "decode")
    for c in ("model_bytes", "gbps"):
        d[c] = pd.to_numeric(d[c], errors="coerce")
    ok = ok_timed(d).dropna(subset=["ms_median"])
    _require(ok, "no ok timed rows of 'decode'")
    settings = (
        ok[["heads_kv", "seqlen_q"]].drop_duplicates().sort_values(["heads_kv", "seqlen_q"], ascending=[False, True])
    )
    order = _impl_order([i for i in ok["impl"].unique() if i != COPY])
    with _theme():
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
                        ax.plot(s["seqlen_k"], s[value], label=impl, **_line_style(impl, order))
                if not copy.empty:
                    ax.plot(
                        copy["seqlen_k"],
                        copy[value],
                        color="black",
                        linestyle="--",
                        linewidth=1.3,
                        label=f"{COPY} (device copy of K and V)",
                    )
                _log2_x(ax, d["seqlen_k"])
                ax.set_yscale("log")
                ax.yaxis.set_minor_formatter(NullFormatter())
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                ax.set_xlabel("K/V length")
                what = "latency (ms)" if value == "ms_median" else "achieved GB/s (K+V+Q+O bytes / time)"
                ax.set_ylabel(what)
                ax.set_title(f"H={h}, H_kv={hk}, query length {nq}: {what.split(' (')[0]}", fontsize=10)
        handles, labels = axes[0, 0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), title="implementation", fontsize=8)
        fig.suptitle(_title(d, "decoding attention against the K/V length"), fontweight="bold")
        fig.tight_layout()
        _save(fig, out_png, missing_note(failed(d)))
    cols = _ID + ["ms_median", "ms_p20", "ms_p80", "model_bytes", "gbps", "tflops", "kernel_config"]
    return _tidy(_with_failed(ok, failed(d), cols), extra_sort=["status", "heads_kv"])


# ---------------------------------------------------------------------------------------------------
# Variable-length batches: packed against padded
# ---------------------------------------------------------------------------------------------------


def varlen_padding(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """One mixed-length batch (experiment ``varlen``): useful TFLOP/s (the real sequences' FLOPs per median
    time) of the packed kernel and of the padded runs, one panel per (mask, mode), each bar labelled with
    its time; the panel title gives the share of the padded batch's FLOPs spent on padding (``pad_waste``).
    """
    d = prepare(df, "varlen")
    for c in ("pad_waste", "tokens"):
        d[c] = pd.to_numeric(d[c], errors="coerce")
    ok = ok_timed(d).dropna(subset=["tflops"])
    _require(ok, "no ok timed rows of 'varlen'")
    panels = d[["causal", "mode"]].drop_duplicates().sort_values(["causal", "mode"])
    order = _impl_order(d["impl"].unique())
    with _theme():
        fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels) + 1, 3.6), squeeze=False, sharey=True)
        for ax, (causal, mode) in zip(axes[0], panels.itertuples(index=False), strict=True):
            here = d[(d["causal"] == causal) & (d["mode"] == mode)]
            good = ok[(ok["causal"] == causal) & (ok["mode"] == mode)].set_index("impl")
            for i, impl in enumerate(order):
                if impl in good.index:
                    r = good.loc[impl]
                    ax.bar(i, r["tflops"], color=_colour(impl, order), width=0.7)
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
        _save(fig, out_png, missing_note(failed(d)))
    cols = _ID + ["tokens", "pad_waste", "ms_median", "tflops", "message"]
    table = pd.concat([ok, failed(d)], ignore_index=True)
    return _tidy(table[[c for c in cols if c in table.columns] + ["status"]], extra_sort=["mode", "status"])


# ---------------------------------------------------------------------------------------------------
# FP8 attention: speed against the 16-bit kernels and the GEMM ceilings, and accuracy
# ---------------------------------------------------------------------------------------------------

CEILINGS = {"fp8-mm": "FP8 GEMM ceiling", "bf16-mm": "bf16 GEMM ceiling"}


def fp8_speed(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """Forward TFLOP/s against N of our FP8 kernels (on quantised inputs and, ``-e2e``, on the bf16 ones with
    the quantiser timed), our bf16 FA-3 / FA-2 and SDPA (experiment ``fp8-speed``), one
    panel per (head_dim, mask), with this run's FP8 and bf16 GEMM ceilings (median over the shard's
    points) as horizontal lines; the returned table adds each row's speed-up over ours-fa2."""
    d = prepare(df, "fp8-speed")
    ok = ok_timed(d).dropna(subset=["tflops"])
    _require(ok, "no ok timed rows of 'fp8-speed'")
    curves = ok[~ok["impl"].isin(list(CEILINGS))]
    ceil = ok[ok["impl"].isin(list(CEILINGS))]
    _require(curves, "no ok timed attention rows of 'fp8-speed'")
    panels = sorted(curves["panel"].unique())
    order = _impl_order(curves["impl"].unique())
    with _theme():
        fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels) + 1, 3.8), squeeze=False, sharey=True)
        for ax, panel in zip(axes[0], panels, strict=True):
            here = curves[curves["panel"] == panel]
            for impl in order:
                r = here[here["impl"] == impl].sort_values("seqlen_q")
                if len(r):
                    ax.plot(r["seqlen_q"], r["tflops"], label=impl, **_line_style(impl, order))
            for impl, text in CEILINGS.items():
                c = ceil[(ceil["panel"] == panel) & (ceil["impl"] == impl)]["tflops"]
                if len(c):
                    ax.axhline(c.median(), color="0.35", ls="--" if impl == "fp8-mm" else ":", lw=1)
                    ax.text(here["seqlen_q"].min(), c.median(), f" {text} {c.median():.0f}", va="bottom",
                            fontsize=7.5, color="0.3")  # fmt: skip
            _log2_x(ax, here["seqlen_q"].unique())
            ax.set_title(panel, fontsize=9.5)
            ax.set_xlabel("sequence length N")
        axes[0, 0].set_ylabel("forward TFLOP/s")
        axes[0, 0].set_ylim(bottom=0)
        axes[0, -1].legend(fontsize=7.5, loc="lower right")
        fig.suptitle(_title(d, "FP8 attention forward: inputs quantised before timing; -e2e: quantisation timed too"),
                     fontweight="bold")  # fmt: skip
        fig.tight_layout()
        _save(fig, out_png, missing_note(failed(d)))
    keys = ["dtype", "head_dim", "causal", "batch", "heads", "seqlen_q", "seqlen_k"]
    paired = _pair(curves, keys, OURS)  # every attention row beside ours-fa2's time at its point
    paired["speedup_vs_fa2"] = paired["ms_median_ref"] / paired["ms_median"]
    table = pd.concat([paired, ok[ok["impl"] == OURS].assign(speedup_vs_fa2=1.0), ceil], ignore_index=True)
    cols = _ID + ["ms_median", "tflops", "speedup_vs_fa2", "kernel_config"]
    return _tidy(_with_failed(table, failed(d), [c for c in cols if c in table.columns]))


FP8_ACCURACY_ORDER = ["naive", "ours-fa2", "ours-fp8-none", "ours-fp8-tensor", "ours-fp8-tensor-rot", "ours-fp8-head",
                      "ours-fp8-head-rot", "ours-fp8-block", "ours-fp8-block-rot", "ours-fp8-block-p1"]  # fmt: skip


def fp8_accuracy(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """RMS error against float64 of the same inputs (experiment ``fp8-accuracy``): one panel per input
    distribution, bars per implementation and input dtype at the largest N, log scale; below, the share
    of P that e4m3 flushes to zero there, per FP8 variant (with and without P's scale)."""
    d = prepare(df, "fp8-accuracy")
    d["inputs"] = d["inputs"].fillna("normal").astype(str)
    for c in ("rms_err", "max_abs_err", "p_underflow", "p_mass_lost"):
        d[c] = pd.to_numeric(d[c], errors="coerce")
    ok = d[d["status"] == "ok"].dropna(subset=["rms_err"])
    _require(ok, "no ok rows of 'fp8-accuracy'")
    inputs = [i for i in ("normal", "outliers", "large", "small") if i in set(ok["inputs"])]
    largest = ok["seqlen_q"].max()
    at_n = ok[ok["seqlen_q"] == largest]
    order = [i for i in FP8_ACCURACY_ORDER if i in set(at_n["impl"])] + sorted(
        set(at_n["impl"]) - set(FP8_ACCURACY_ORDER)
    )
    dtypes = [t for t in DTYPE_ORDER if t in set(at_n["dtype"])]
    with _theme():
        fig, axes = plt.subplots(2, len(inputs), figsize=(4.6 * len(inputs) + 1, 7.2), squeeze=False)
        for j, kind in enumerate(inputs):
            ax = axes[0, j]
            here = at_n[at_n["inputs"] == kind]
            sns.barplot(data=here, x="impl", y="rms_err", hue="dtype", order=order, hue_order=dtypes, ax=ax,
                        palette="muted")  # fmt: skip
            ax.set_yscale("log")
            ax.set_title(f"inputs: {kind}, N={_fmt_n(largest)}", fontsize=9.5)
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
                sns.barplot(data=under, x="impl", y="p_flushed", hue="dtype", order=fp8_impls, hue_order=dtypes,
                            ax=ax2, palette="muted", legend=False)  # fmt: skip
                top = float(under["p_flushed"].max())
                ax2.set_ylim(0, 1.15 * top if top > 0 else 1.0)  # never below zero: a share of P
                if top == 0:
                    ax2.text(0.5, 0.5, "no element of P flushed", transform=ax2.transAxes, ha="center",
                             va="center", color="#555")  # fmt: skip
                ax2.tick_params(axis="x", rotation=40, labelsize=7.5)
                for lab in ax2.get_xticklabels():
                    lab.set_ha("right")
            else:
                ax2.set_visible(False)
            ax2.set_xlabel("")
            ax2.set_ylabel(f"% of P flushed to 0 by e4m3, N={_fmt_n(largest)}" if j == 0 else "")
        fig.suptitle(_title(d, "FP8 attention accuracy"), fontweight="bold")
        fig.tight_layout()
        _save(fig, out_png, missing_note(failed(d)))
    cols = _ID + ["inputs", "rms_err", "max_abs_err", "p_underflow", "p_mass_lost", "kernel_config"]
    return _tidy(_with_failed(ok, failed(d), [c for c in cols if c in ok.columns]), extra_sort=["inputs"])


__all__ = [
    "fa1_figure3",
    "gain_surface",
    "block_sweep",
    "rescale_ablation",
    "decode_latency",
    "varlen_padding",
    "fp8_speed",
    "fp8_accuracy",
    "missing_note",
    "NoDataError",
]
