"""Figures of measured HBM traffic (the traffic table) against the byte models of ``analysis.core.models``.

- ``traffic_vs_n``: a point's measured DRAM bytes (read + write, summed over its kernels) against N,
  log–log, one column per head dim. Top row: standard (materialising) attention with the model's
  8N² + 8Nd (S written and read back, P written and read back) and the article's 6N² + 8Nd; a hollow
  marker is a point whose N×N tensor fits in L2, where DRAM writes can be under-counted. Bottom row: the
  tiled kernels (ours and SDPA's backends) with the compulsory 4Nd (Q, K, V read once, O written once)
  and our kernel's no-cache FA-2 model (K and V re-read for every block of BLOCK_M query rows), i.e.
  whether the traffic grows like O(N) or like N²d²/M.
- ``traffic_blocks``: our kernel at fixed N and d across block configurations: DRAM bytes read and
  written (bars, log axis) with the no-cache model and the minimum, and the kernel's runtime under the
  profiler (line, right axis); the block-size experiment of the FlashAttention-1 paper's Figure 2.

Each function takes ``(df, out_png)``, draws from rows with ``status == "ok"`` only, and returns the table
it drew (one row per point), which ``render_all`` (``analysis.core.plotting``) stores next to the PNG. A
figure with nothing to draw raises ``NoDataError`` and becomes a skip entry in the manifest with the reason.
"""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, NullFormatter

from analysis.core import models
from analysis.core.family import Figure

# the toolkit's look (palette, markers, theme, N axis) is shared so an implementation looks the same everywhere
from analysis.core.plotting import MARKERS, OURS, NoDataError, colour, gpu_label, impl_order, log2_x, save, theme
from analysis.families.traffic import plan as traffic

matplotlib.use("Agg")

GB = 1e9
GROUPS = {"materialising": "standard attention", "tiled": "tiled kernels"}


def prepare(df: pd.DataFrame) -> pd.DataFrame:
    """Traffic rows (as the table's reader typed them: ``l2_resident`` a nullable bool, empty where unknown);
    refuses a table that mixes GPUs."""
    gpus = df["gpu"].dropna().unique()
    if len(gpus) > 1:
        raise ValueError(f"figures are drawn for one GPU at a time, got {sorted(map(str, gpus))}")
    return df.copy()


def _resident(col: pd.Series) -> pd.Series:
    """Where ``l2_resident`` is known to be true (unknown counts as not resident)."""
    return col.astype("boolean").fillna(False).astype(bool)


def point_totals(df: pd.DataFrame) -> pd.DataFrame:
    """One row per point whose every kernel finished: bytes and time summed over its kernels."""
    d = prepare(df)
    d = d.dropna(subset=["seqlen", "head_dim", "batch", "heads"])
    if d.empty:
        return pd.DataFrame()
    keys = traffic.POINT_KEYS
    ok = d.groupby(keys, dropna=False)["status"].transform(lambda s: bool((s == "ok").all()))
    d = d[ok.astype(bool) & (d["status"] == "ok")]
    if d.empty:
        return pd.DataFrame()
    out = (
        d.groupby(keys, dropna=False, sort=True)
        .agg(
            n_kernels=("kernel_index", "size"),
            dram_read_bytes=("dram_read_bytes", "sum"),
            dram_write_bytes=("dram_write_bytes", "sum"),
            gpu_time_ns=("gpu_time_ns", "sum"),
            model_bytes=("model_bytes", "first"),
            model_bytes_nocache=("model_bytes_nocache", "first"),
            l2_resident=("l2_resident", "first"),
            gpu=("gpu", "first"),
            gpu_name=("gpu_name", "first"),
        )
        .reset_index()
    )
    out["dram_bytes"] = out["dram_read_bytes"] + out["dram_write_bytes"]
    out["measured_over_model"] = out["dram_bytes"] / out["model_bytes"]
    return out


def _elem(dtype: str) -> int:
    return traffic.ELEM_BYTES.get(str(dtype), 2)


def _reference_lines(p: pd.DataFrame) -> pd.DataFrame:
    """The model curves at each point's shape (NaN for causal points: the models are for full attention)."""
    full = ~p["causal"]

    def each(f):
        shapes = zip(p["seqlen"], p["head_dim"], p["batch"], p["heads"], p["dtype"], strict=True)
        vals = [f(int(n), int(d), int(b), int(h), _elem(t)) for n, d, b, h, t in shapes]
        return pd.Series(vals, index=p.index).where(full)

    return p.assign(
        model_standard=each(models.standard_attention_total_bytes),
        # the article's count: S written, S read and P written, P read (3N² elements) plus Q, K, V, O
        model_standard_6=each(lambda n, d, b, h, e: models.formula_attention_bytes(n, d, 6, b, h, e)),
        model_minimum=each(models.minimum_attention_bytes),
    )


def _title(p: pd.DataFrame, what: str) -> str:
    gpu = gpu_label(p)
    fixed = []
    for col, label in (("batch", "B"), ("heads", "H"), ("dtype", "")):
        vals = p[col].dropna().unique()
        if len(vals) == 1:
            fixed.append(f"{label} = {int(vals[0])}" if label else str(vals[0]))
    return f"{gpu}: {what}" + (f" ({', '.join(fixed)})" if fixed else "")


def _gb_axis(ax) -> None:
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _style(impl: str, order: list[str]) -> dict:
    style = {"color": colour(impl, order), "marker": MARKERS.get(impl, "o"), "markersize": 5}
    style.update(linewidth=2.6, zorder=5) if impl == OURS else style.update(linewidth=1.4, zorder=3)
    return style


def traffic_vs_n(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """Measured DRAM bytes per forward call against N, with the models (see the module docstring)."""
    p = point_totals(df)
    if not p.empty:
        p = p[p["experiment"] == "traffic-scaling"]
    if p.empty:
        raise NoDataError("no ok rows of experiment 'traffic-scaling'")
    p = _reference_lines(p)
    p["group"] = np.where(p["impl"].isin(traffic.MATERIALISING), "materialising", "tiled")
    groups = [g for g in GROUPS if g in set(p["group"])]
    dims = sorted(p["head_dim"].astype(int).unique())
    order = impl_order(p["impl"].unique())
    with theme():
        fig, axes = plt.subplots(
            len(groups),
            len(dims),
            figsize=(4.4 * len(dims), 3.4 * len(groups)),
            sharex=True,
            sharey="row",
            squeeze=False,
        )
        for r, group in enumerate(groups):
            for c, d in enumerate(dims):
                ax = axes[r][c]
                sub = p[(p["group"] == group) & (p["head_dim"] == d)]
                _draw_group(ax, sub, group, order)
                log2_x(ax, p["seqlen"])
                _gb_axis(ax)
                ax.set_title(f"{GROUPS[group]}, d={d}", fontsize=9)
                if c == 0:
                    ax.set_ylabel("DRAM bytes (GB, 10⁹ B)")
                if r == len(groups) - 1:
                    ax.set_xlabel("sequence length N")
            axes[r][-1].legend(
                handles=_legend(p[p["group"] == group], group, order),
                fontsize=7,
                loc="upper left",
                bbox_to_anchor=(1.02, 1.0),
                frameon=False,
            )
        fig.suptitle(_title(p, "DRAM traffic of one forward call, measured and modelled"), fontweight="bold")
        fig.tight_layout()
        save(fig, out_png)
    cols = [
        "gpu",
        "gpu_name",
        "dtype",
        "head_dim",
        "causal",
        "group",
        "impl",
        "batch",
        "heads",
        "seqlen",
        "block_m",
        "block_n",
        "n_kernels",
        "dram_read_bytes",
        "dram_write_bytes",
        "dram_bytes",
        "model_bytes",
        "measured_over_model",
        "model_standard",
        "model_standard_6",
        "model_minimum",
        "model_bytes_nocache",
        "l2_resident",
    ]
    return p[cols].sort_values(["group", "head_dim", "impl", "seqlen"], kind="stable").reset_index(drop=True)


def _draw_group(ax, sub: pd.DataFrame, group: str, order: list[str]) -> None:
    if sub.empty:
        return
    ref = sub.drop_duplicates("seqlen").sort_values("seqlen")
    # model lines thin and on top: a measurement that matches its model must not hide it
    model = dict(color="black", linewidth=1.1, zorder=7)
    if group == "materialising":
        ax.plot(ref["seqlen"], ref["model_standard"] / GB, linestyle="--", **model)
        ax.plot(ref["seqlen"], ref["model_standard_6"] / GB, linestyle=":", **model)
    else:
        ax.plot(ref["seqlen"], ref["model_minimum"] / GB, linestyle="--", **model)
    for impl in order:
        s = sub[sub["impl"] == impl].sort_values("seqlen")
        if s.empty:
            continue
        style = _style(impl, order)
        ax.plot(s["seqlen"], s["dram_bytes"] / GB, **{**style, "marker": None})
        # filled: a measurement the counters see whole; hollow: the N×N tensor fits in L2 (writes may hide).
        # Only standard attention writes an N×N tensor, so only its points can be hollow.
        resident = _resident(s["l2_resident"]) & (group == "materialising")
        ax.plot(
            s.loc[~resident, "seqlen"],
            s.loc[~resident, "dram_bytes"] / GB,
            linestyle="none",
            marker=style["marker"],
            color=style["color"],
            markersize=5,
            zorder=style["zorder"] + 1,
        )
        ax.plot(
            s.loc[resident, "seqlen"],
            s.loc[resident, "dram_bytes"] / GB,
            linestyle="none",
            marker=style["marker"],
            markerfacecolor="white",
            markeredgecolor=style["color"],
            markersize=6,
            zorder=style["zorder"] + 1,
        )
        if impl == OURS and s["model_bytes_nocache"].notna().any():
            ax.plot(
                s["seqlen"], s["model_bytes_nocache"] / GB, color=style["color"], linestyle=":", linewidth=1.4, zorder=7
            )


def _legend(p: pd.DataFrame, group: str, order: list[str]) -> list:
    handles = []
    for impl in order:
        if impl in set(p["impl"]):
            style = _style(impl, order)
            handles.append(Line2D([], [], label=f"{impl} (measured)", **style))
    if group == "materialising":
        handles.append(Line2D([], [], color="black", linestyle="--", label="model 8N²+8Nd (S, P written + read)"))
        handles.append(Line2D([], [], color="black", linestyle=":", label="article's 6N²+8Nd"))
        if _resident(p["l2_resident"]).any():
            handles.append(
                Line2D(
                    [],
                    [],
                    linestyle="none",
                    marker="o",
                    markerfacecolor="white",
                    markeredgecolor="black",
                    label="N×N tensor fits in L2",
                )
            )
    else:
        handles.append(Line2D([], [], color="black", linestyle="--", label="minimum 4Nd (Q, K, V, O once)"))
        if OURS in set(p["impl"]) and p.loc[p["impl"] == OURS, "model_bytes_nocache"].notna().any():
            handles.append(
                Line2D(
                    [], [], color=colour(OURS, order), linestyle=":", label="FA-2, no cache reuse (K, V per Q block)"
                )
            )
    return handles


def _config_label(row) -> str:
    return f"{int(row.block_m)}×{int(row.block_n)}\nw{int(row.num_warps)} s{int(row.num_stages)}"


def traffic_blocks(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """Our kernel's DRAM bytes and runtime across block configurations at fixed N and d."""
    p = point_totals(df)
    if not p.empty:
        p = p[(p["experiment"] == "traffic-blocks") & (p["impl"] == OURS)].dropna(subset=["block_m", "block_n"])
    if p.empty:
        raise NoDataError("no ok rows of experiment 'traffic-blocks' with a block configuration")
    p = _reference_lines(p).sort_values(["head_dim", "seqlen", "block_m", "block_n", "num_warps", "num_stages"])
    p["config"] = [_config_label(r) for r in p.itertuples()]
    p["gpu_time_ms"] = p["gpu_time_ns"] / 1e6
    panels = p[["head_dim", "seqlen"]].drop_duplicates().itertuples(index=False)
    panels = list(panels)
    read_c, write_c = "#4c72b0", "#9ecae1"
    with theme():
        fig, axes = plt.subplots(
            1, len(panels), figsize=(max(4.5, 1.1 * p["config"].nunique() + 1.5) * len(panels), 3.8), squeeze=False
        )
        for ax, (d, n) in zip(axes[0], panels, strict=True):
            s = p[(p["head_dim"] == d) & (p["seqlen"] == n)].reset_index(drop=True)
            x = np.arange(len(s))
            ax.bar(x - 0.2, s["dram_read_bytes"] / GB, width=0.4, color=read_c, zorder=3)
            ax.bar(x + 0.2, s["dram_write_bytes"] / GB, width=0.4, color=write_c, zorder=3)
            ax.plot(
                x,
                s["model_bytes_nocache"] / GB,
                linestyle="none",
                marker="_",
                markersize=22,
                markeredgewidth=2.2,
                color="black",
                zorder=4,
            )
            ax.plot(x, s["model_minimum"] / GB, color="black", linestyle="--", linewidth=1.1, zorder=2)
            _gb_axis(ax)
            ax.set_xticks(x)
            ax.set_xticklabels(s["config"], fontsize=8)
            ax.set_xlabel("BLOCK_M × BLOCK_N, warps, stages")
            ax.set_ylabel("DRAM bytes (GB, 10⁹ B)")
            ax.set_title(f"N={int(n)}, d={int(d)}", fontsize=9)
            rt = ax.twinx()
            rt.plot(x, s["gpu_time_ms"], color=colour(OURS, [OURS]), marker="o", linewidth=2, zorder=5)
            rt.set_ylim(0, 1.15 * float(s["gpu_time_ms"].max()))
            rt.set_ylabel("runtime under ncu (ms)")
            rt.grid(False)
        handles = [
            Patch(color=read_c, label="DRAM read (measured)"),
            Patch(color=write_c, label="DRAM write (measured)"),
            Line2D([], [], linestyle="none", marker="_", markersize=14, mew=2, color="k", label="FA-2 model, no cache"),
            Line2D([], [], color="black", linestyle="--", label="minimum 4Nd"),
            Line2D([], [], color=colour(OURS, [OURS]), marker="o", label="runtime (right axis)"),
        ]
        axes[0][-1].legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.12, 1.0), frameon=False)
        fig.suptitle(_title(p, "our FA-2 kernel: DRAM traffic and runtime by block size"), fontweight="bold")
        fig.tight_layout()
        save(fig, out_png)
    cols = [
        "gpu",
        "gpu_name",
        "dtype",
        "head_dim",
        "causal",
        "impl",
        "batch",
        "heads",
        "seqlen",
        "block_m",
        "block_n",
        "num_warps",
        "num_stages",
        "dram_read_bytes",
        "dram_write_bytes",
        "dram_bytes",
        "gpu_time_ms",
        "model_bytes_nocache",
        "model_minimum",
        "l2_resident",
    ]
    return p[cols].reset_index(drop=True)


# name -> figure (caption: captions/<name>.rst; section: the report section)
FIGURES = {
    "traffic_bytes": Figure(traffic_vs_n, "traffic"),
    "traffic_blocks": Figure(traffic_blocks, "traffic"),
}
