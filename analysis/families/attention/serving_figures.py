"""The figure of ``decode-serving``: how much of the copy bandwidth decoding reaches, against batch × context.

Same contract as every figure (``analysis.core.plotting``): ``decode_serving(df, out_png)`` draws what the table
holds, writes the PNG and returns the tidy frame behind it, or raises ``NoDataError``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from analysis.core.plotting import fmt_n, impl_order, line_style, require, theme
from analysis.core.tables import finished
from analysis.families._shared.attention_plots import ID, failed, missing_note, prepare, save_with_note, tidy, title
from analysis.families.attention.serving_plan import EXPERIMENT

COPY, GATHER, OURS = "copy-kv", "gather-kv", "ours-paged"
SETTING = ["dtype", "head_dim", "heads", "heads_kv", "page_size", "seqlen_q"]
POINT = SETTING + ["batch", "seqlen_k"]


def bandwidth_shares(d: pd.DataFrame) -> pd.DataFrame:
    """Every finished decoding row with ``copy_gbps`` (copy-kv's GB/s at the same point) and ``share``, its own
    GB/s (the step's compulsory bytes per median time) over that."""
    ok = finished(d).dropna(subset=["gbps"])
    copy = ok[ok["impl"] == COPY][POINT + ["gbps"]].rename(columns={"gbps": "copy_gbps"})
    rows = ok[~ok["impl"].isin([COPY, GATHER])].merge(copy, on=POINT)
    return rows.assign(share=rows["gbps"] / rows["copy_gbps"])


def _heatmap(ax, grid: pd.DataFrame, setting: str):
    image = ax.imshow(grid.to_numpy(dtype=float), vmin=0.0, vmax=1.0, cmap="viridis", origin="lower", aspect="auto")
    for (i, j), v in np.ndenumerate(grid.to_numpy(dtype=float)):
        if np.isfinite(v):
            ax.text(
                j, i, f"{100 * v:.0f}%", ha="center", va="center", fontsize=8, color="white" if v < 0.6 else "black"
            )
    ax.set_xticks(range(grid.shape[1]), [str(b) for b in grid.columns])
    ax.set_yticks(range(grid.shape[0]), [fmt_n(c) for c in grid.index])
    ax.set_xlabel("batch (requests)")
    ax.set_ylabel("longest context")
    ax.set_title(f"{setting}: {OURS}, share of copy-kv", fontsize=9.5)
    ax.grid(False)
    return image


def decode_serving(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """Decoding as a server runs it (experiment ``decode-serving``): one row of panels per (heads, page size,
    new tokens). Left: our paged kernel's bandwidth as a share of copy-kv's (a device copy of the pool) at each
    batch × longest context. Right: every decoding implementation's share at every point, points ordered by
    batch then context. Bandwidth = the step's compulsory bytes (each K/V byte once) per median time, the same
    bytes for every implementation."""
    d = prepare(df, EXPERIMENT)
    shares = bandwidth_shares(d)
    require(shares, f"no ok timed rows of {EXPERIMENT!r} beside a copy-kv row at the same point")
    settings = shares[SETTING].drop_duplicates().sort_values(SETTING).to_dict("records")
    order = impl_order(shares["impl"].unique())
    with theme():
        fig, axes = plt.subplots(
            len(settings),
            2,
            figsize=(14, 4.6 * len(settings)),
            squeeze=False,
            layout="constrained",
            gridspec_kw={"width_ratios": [1, 1.5]},
        )
        image = None
        for row, s in enumerate(settings):
            sub = shares[np.logical_and.reduce([shares[k] == v for k, v in s.items()])]
            label = f"H={s['heads']}/{s['heads_kv']}, page {s['page_size']}, {s['seqlen_q']} new"
            ours = sub[sub["impl"] == OURS]
            if not ours.empty:
                image = _heatmap(
                    axes[row, 0], ours.pivot_table(index="seqlen_k", columns="batch", values="share"), label
                )
            else:
                axes[row, 0].set_axis_off()
            points = sub[["batch", "seqlen_k"]].drop_duplicates().sort_values(["batch", "seqlen_k"])
            where = {p: i for i, p in enumerate(points.itertuples(index=False, name=None))}
            ax = axes[row, 1]
            for impl in order:
                s_impl = sub[sub["impl"] == impl]
                if s_impl.empty:
                    continue
                x = [where[(b, c)] for b, c in zip(s_impl["batch"], s_impl["seqlen_k"], strict=True)]
                style = {**line_style(impl, order), "linestyle": "none"}
                if impl == OURS:
                    style.update(markersize=9, zorder=6, marker="D")
                ax.plot(x, s_impl["share"], label=impl, **style)
            ax.axhline(1.0, color="black", linestyle="--", linewidth=1.2, label=f"{COPY} (device copy of the pool)")
            ax.set_xticks(range(len(where)), [f"{b}×{fmt_n(c)}" for b, c in where], rotation=45, ha="right", fontsize=8)
            ax.set_ylim(0, max(1.1, float(sub["share"].max()) * 1.05))
            ax.set_xlabel("batch × longest context")
            ax.set_ylabel("share of copy-kv's GB/s")
            ax.set_title(f"{label}: every implementation", fontsize=9.5)
        if image is not None:
            fig.colorbar(image, ax=axes[:, 0].tolist(), shrink=0.8, label="share of copy-kv's GB/s")
        handles, labels = axes[0, 1].get_legend_handles_labels()
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), title="implementation", fontsize=8)
        fig.suptitle(
            title(d, "decoding a batch of paged requests: bandwidth against batch × context"), fontweight="bold"
        )
        save_with_note(fig, out_png, missing_note(failed(d)))
    cols = ID + ["page_size", "tokens", "ms_median", "ms_p20", "ms_p80", "host_ms", "model_bytes", "gbps"]
    cols += ["copy_gbps", "share", "kernel_config", "status"]
    frame = pd.concat([shares, failed(d)], ignore_index=True)
    return tidy(frame[[c for c in cols if c in frame.columns]], extra_sort=["heads_kv", "page_size", "batch"])
