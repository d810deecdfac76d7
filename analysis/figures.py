"""Figures for one GPU, drawn from the tidy result rows of ``analysis.tables``.

Every figure function takes ``(df, out_png)``, writes the PNG and returns the tidy frame it actually
plotted, so the caller can store that "table behind the figure" next to the image. Only rows that
finished (``status == "ok"``) and were timed are drawn; the memory figure also marks out-of-memory
points, because where a method runs out of memory is part of the result.

A function with nothing to draw raises ``NoDataError``; ``render_all`` turns that into a skip entry so
a partial run still gets a report.
"""

from __future__ import annotations

import json
import textwrap
from contextlib import contextmanager
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullFormatter

from analysis import outputs

# Files only, never a window: this runs in workflow jobs and on headless GPU machines.
matplotlib.use("Agg")

OURS = "ours-fa2"
BASELINE = "naive"

# One fixed colour and marker per implementation, so an impl looks the same in every figure and
# on every GPU. Markers differ too, so the lines stay apart in greyscale and for colour-blind readers.
PALETTE = {
    "ours-fa3": "#ff7f0e",
    "ours-fa2": "#d62728",
    "naive": "#7f7f7f",
    "sdpa-math": "#8c564b",
    "sdpa-efficient": "#1f77b4",
    "sdpa-flash": "#2ca02c",
    "sdpa-cudnn": "#9467bd",
}
MARKERS = {
    "ours-fa3": "*",
    "ours-fa2": "o",
    "naive": "s",
    "sdpa-math": "v",
    "sdpa-efficient": "^",
    "sdpa-flash": "D",
    "sdpa-cudnn": "P",
}
# Implementations outside PALETTE (added later) get these, in alphabetical order of their names.
_SPARE_COLOURS = ["#17becf", "#bcbd22", "#e377c2", "#ff7f0e", "#393b79", "#637939"]
DTYPE_ORDER = ["float16", "bfloat16", "float32", "float64"]
_TRUE = {"true", "1", "1.0", "yes"}
_SHAPE = ["batch", "heads", "seqlen_q", "seqlen_k", "head_dim"]
_NUMERIC = ["ms_median", "ms_p20", "ms_p80", "tflops", "peak_mem_mib", "model_bytes", "gbps", "pad_waste", "tokens"]
# Leading columns of every table behind a figure.
_ID = [
    "gpu",
    "gpu_name",
    "dtype",
    "head_dim",
    "causal",
    "panel",
    "impl",
    "mode",
    "batch",
    "heads",
    "heads_kv",
    "seqlen_q",
    "seqlen_k",
]
# What a row and its naive counterpart must share for a speed-up to compare like with like.
_MATCH = ["dtype", "head_dim", "causal", "seqlen_q", "seqlen_k", "batch", "heads", "mode"]

DPI = 110
FACET_HEIGHT = 2.8
FACET_ASPECT = 1.2


class NoDataError(ValueError):
    """The table holds no rows this figure can draw."""


class NotMeasured(NoDataError):
    """The run did not measure what this figure shows (no row of its experiment or mode, of any status):
    the report leaves the figure out instead of showing it as not drawn."""


def _measured_at_all(df: pd.DataFrame, section: str | None) -> bool:
    """Whether ``df`` has any row (of any status) of the experiment or family ``section``."""
    if not section or "experiment" not in df:
        return True
    hit = df["experiment"].astype(str) == section
    if "family" in df:
        hit |= df["family"].astype(str) == section
    return bool(hit.any())


def _as_bool(s: pd.Series) -> pd.Series:
    # A CSV round trip may hand back real bools or the strings "True"/"False".
    return s.map(lambda v: str(v).strip().lower() in _TRUE).astype(bool)


def prepare(df: pd.DataFrame, experiment: str, several_gpus: bool = False) -> pd.DataFrame:
    """Rows of one experiment with bools, numbers and the facet label (``panel``) normalised.

    Raises ``ValueError`` if the table mixes GPUs, unless ``several_gpus`` (the comparison figure):
    every other figure and summary is for one GPU.
    """
    gpus = df["gpu"].dropna().unique()
    if len(gpus) > 1 and not several_gpus:
        raise ValueError(f"figures are drawn for one GPU at a time, got {sorted(map(str, gpus))}")
    d = df[df["experiment"] == experiment].copy()
    d["causal"] = _as_bool(d["causal"])
    d["timed"] = _as_bool(d["timed"])
    for c in _SHAPE + _NUMERIC + ["heads_kv"]:
        d[c] = pd.to_numeric(d[c], errors="coerce")
    # A row without a shape cannot be placed on any axis.
    d = d.dropna(subset=_SHAPE)
    for c in _SHAPE:
        d[c] = d[c].astype("int64")
    d["dtype"] = d["dtype"].astype(str)
    d["panel"] = [_panel_label(h, c) for h, c in zip(d["head_dim"], d["causal"], strict=True)]
    return d


def _panel_label(head_dim: int, causal: bool) -> str:
    return f"d={head_dim}, {'causal' if causal else 'non-causal'}"


def ok_timed(d: pd.DataFrame) -> pd.DataFrame:
    """Rows of a ``prepare``d frame that finished and were timed: the only ones with a valid time."""
    return d[(d["status"] == "ok") & d["timed"]]


MAX_LISTED = 8  # failed points named one by one in a figure's note; the rest are counted


def failed(d: pd.DataFrame) -> pd.DataFrame:
    """Rows of a ``prepare``d frame that did not finish."""
    return d[d["status"] != "ok"]


def _point_label(r) -> str:
    parts = [str(r["impl"])]
    if r.get("experiment") == "decode":
        parts.append(f"Nk={_fmt_n(r['seqlen_k'])}")
    elif r.get("experiment") != "varlen":
        parts.append(f"N={_fmt_n(r['seqlen_q'])}")
    parts.append(f"d={r['head_dim']}")
    if r.get("kernel_config") and r.get("experiment") == "block-sweep":
        parts.append(str(r["kernel_config"]))
    return " ".join(parts) + f" ({r['status']})"


def missing_note(bad: pd.DataFrame) -> str:
    """One line naming the points that were attempted but not drawn ("" if none)."""
    if bad.empty:
        return ""
    labels = [_point_label(r) for r in bad.to_dict("records")]
    listed = "; ".join(labels[:MAX_LISTED])
    more = f"; and {len(labels) - MAX_LISTED} more" if len(labels) > MAX_LISTED else ""
    return f"Not drawn, {len(labels)} point(s) that did not finish: {listed}{more} (see the failures table)."


def _note(fig, text: str) -> None:
    """A note under a figure (what is missing from it); kept by ``bbox_inches="tight"`` when saved."""
    if text:
        # a tenth of an inch below the figure's bottom edge, so it never covers an axis label
        fig.text(0.01, -0.1 / fig.get_figheight(), "\n".join(textwrap.wrap(text, 150)), ha="left", va="top",
                 fontsize=7.5, color="#444")  # fmt: skip


def _require(d: pd.DataFrame, what: str) -> None:
    if d.empty:
        raise NoDataError(what)


def _impl_order(impls) -> list[str]:
    known = [i for i in PALETTE if i in set(impls)]
    return known + sorted(set(impls) - set(PALETTE))


def _colour(impl: str, order: list[str]) -> str:
    if impl in PALETTE:
        return PALETTE[impl]
    extras = [i for i in order if i not in PALETTE]
    return _SPARE_COLOURS[extras.index(impl) % len(_SPARE_COLOURS)]


def _line_style(impl: str, order: list[str]) -> dict:
    style = {"color": _colour(impl, order), "marker": MARKERS.get(impl, "o")}
    if impl in (OURS, "ours-fa3"):
        style.update(linewidth=2.8, markersize=7 if impl == OURS else 9, zorder=5)
    else:
        style.update(linewidth=1.4, markersize=4.5, zorder=3, alpha=0.9)
    return style


def _legend_handles(order: list[str]) -> dict:
    return {impl: Line2D([], [], **_line_style(impl, order)) for impl in order}


def _fmt_n(n: float) -> str:
    n = int(n)
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _log2_x(ax, ns) -> None:
    """log2 x-axis with a labelled tick at every sequence length that was measured."""
    ns = sorted({int(n) for n in ns})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns)
    ax.set_xticklabels([_fmt_n(n) for n in ns])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis="x", which="minor", bottom=False)


def _grid(d: pd.DataFrame, height: float = FACET_HEIGHT, aspect: float = FACET_ASPECT) -> sns.FacetGrid:
    """Columns: one per (head_dim, causal); rows: one per dtype."""
    panels = d[["head_dim", "causal", "panel"]].drop_duplicates().sort_values(["head_dim", "causal"])["panel"].tolist()
    present = set(d["dtype"])
    dtypes = [t for t in DTYPE_ORDER if t in present] + sorted(present - set(DTYPE_ORDER))
    return sns.FacetGrid(
        d,
        row="dtype",
        col="panel",
        row_order=dtypes,
        col_order=panels,
        height=height,
        aspect=aspect,
        margin_titles=True,
        sharex=True,
        sharey=True,
        dropna=False,
        despine=True,
    )


def _facets(g: sns.FacetGrid, d: pd.DataFrame):
    """(axis, rows of that facet) for every facet, empty facets included."""
    for (dtype, panel), ax in g.axes_dict.items():
        yield ax, d[(d["dtype"] == dtype) & (d["panel"] == panel)]


def _gpu_label(d: pd.DataFrame) -> str:
    """The GPU a figure's rows come from, for its title: the recorded name, else the type, else "GPU"."""
    names = d["gpu_name"].dropna().unique()
    return str(names[0]) if len(names) else str(next(iter(d["gpu"].dropna().unique()), "GPU"))


def _save(fig, out_png) -> None:
    """Write ``fig`` to ``out_png`` (its folder created) and close it."""
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=DPI, bbox_inches="tight")
    plt.close(fig)


def _title(d: pd.DataFrame, what: str) -> str:
    gpu = _gpu_label(d)
    # Name what the facets and the x-axis leave fixed: batch and heads themselves when constant,
    # else the products the FlashAttention-2 setting keeps fixed (tokens per batch, hidden size).
    setting = []
    for col, product, label, product_label in (
        ("batch", "seqlen_q", "B", "B×N"),
        ("heads", "head_dim", "H", "H×d"),
    ):
        if d[col].nunique() == 1:
            setting.append(f"{label} = {int(d[col].iloc[0])}")
        elif (d[col] * d[product]).nunique() == 1:
            setting.append(f"{product_label} = {int((d[col] * d[product]).iloc[0])}")
    return f"{gpu}: {what}" + (f" ({', '.join(setting)})" if setting else "")


def floor_at_zero(ax) -> None:
    """Start a linear y axis at 0 when everything drawn on it is non-negative (matplotlib's margin would
    run it below zero, to values no row can have)."""
    ys = [np.asarray(line.get_ydata(), dtype=float) for line in ax.get_lines()]
    ys = np.concatenate([y[np.isfinite(y)] for y in ys]) if ys else np.array([])
    if ax.get_yscale() == "linear" and ys.size and ys.min() >= 0 and ax.get_ylim()[0] < 0:
        ax.set_ylim(bottom=0)


def hide_empty_facets(g: sns.FacetGrid, xlabel: str, ylabel: str) -> None:
    """Hide the facets nothing was drawn in (a dtype measured at fewer head dims than another), and give
    the lowest drawn facet of each column the x tick labels and label, the first drawn one of each row the
    y label, which the hidden ones would have carried."""
    grid = g.axes
    for ax in grid.flat:
        if not ax.has_data():
            ax.set_visible(False)
    for j in range(grid.shape[1]):
        shown = [grid[i, j] for i in range(grid.shape[0]) if grid[i, j].get_visible()]
        if shown:
            shown[-1].xaxis.set_tick_params(which="major", labelbottom=True)
            shown[-1].set_xlabel(xlabel)
    for i in range(grid.shape[0]):
        shown = [grid[i, j] for j in range(grid.shape[1]) if grid[i, j].get_visible()]
        if shown:
            shown[0].yaxis.set_tick_params(which="major", labelleft=True)
            shown[0].set_ylabel(ylabel)
        if shown and not grid[i, -1].get_visible() and g.row_names:  # the row's title sat on its last facet
            shown[-1].annotate(str(g.row_names[i]), xy=(1.02, 0.5), xycoords="axes fraction", rotation=270,
                               ha="left", va="center")  # fmt: skip


def _finish(g: sns.FacetGrid, title: str, xlabel: str, ylabel: str, legend: dict, out_png) -> None:
    g.set_titles(row_template="{row_name}", col_template="{col_name}")
    g.set_axis_labels(xlabel, ylabel)
    hide_empty_facets(g, xlabel, ylabel)
    g.add_legend(legend_data=legend, title="implementation")
    g.figure.suptitle(title, fontweight="bold")
    # Room for the title above the column titles, in inches so it holds for any number of rows.
    g.figure.subplots_adjust(top=1 - 0.55 / g.figure.get_figheight())
    _save(g.figure, out_png)


@contextmanager
def _theme():
    # Scoped rather than sns.set_theme(), so importing this module changes no global matplotlib state.
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.85):
        yield


def fa2_forward(df: pd.DataFrame) -> pd.DataFrame:
    """Finished, timed forward rows of the ``fa2-setting`` experiment, ``prepare``d."""
    return fa2_mode(df, "fwd")


def fa2_mode(df: pd.DataFrame, mode: str) -> pd.DataFrame:
    """Finished, timed rows of one mode of the ``fa2-setting`` experiment, ``prepare``d."""
    d = prepare(df, "fa2-setting")
    return ok_timed(d[d["mode"] == mode])


MODE_TEXT = {"fwd": "forward", "bwd": "backward", "fwd+bwd": "forward + backward"}


def _tflops(df: pd.DataFrame, out_png, mode: str) -> pd.DataFrame:
    d = fa2_mode(df, mode).dropna(subset=["tflops"])
    prepared = prepare(df, "fa2-setting")
    if not (prepared["mode"] == mode).any():
        raise NotMeasured(f"this run measured no {mode} rows of experiment 'fa2-setting'")
    _require(d, f"no ok timed {mode} rows for experiment 'fa2-setting'")
    bad = prepared[(prepared["mode"] == mode) & (prepared["status"] != "ok")]
    d = d.assign(
        tflops_lo=d["tflops"] * d["ms_median"] / d["ms_p80"],
        tflops_hi=d["tflops"] * d["ms_median"] / d["ms_p20"],
    )
    order = _impl_order(d["impl"].unique())
    with _theme():
        g = _grid(d)
        for ax, sub in _facets(g, d):
            for impl in order:
                s = sub[sub["impl"] == impl].sort_values("seqlen_q")
                if s.empty:
                    continue
                style = _line_style(impl, order)
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
            _log2_x(ax, d["seqlen_q"])
        # after every facet is drawn: the axes share y, and a limit set per facet would clip later ones
        g.axes.flat[0].set_ylim(0, 1.05 * d[["tflops", "tflops_hi"]].max().max())
        if mode != "fwd" or not bad.empty:
            _note(g.figure, missing_note(bad))
        _finish(
            g,
            _title(d, f"{MODE_TEXT[mode]} attention throughput"),
            "sequence length N",
            "TFLOP/s",
            _legend_handles(order),
            out_png,
        )
    cols = _ID + [
        "ms_median",
        "ms_p20",
        "ms_p80",
        "tflops",
        "tflops_lo",
        "tflops_hi",
        "kernel_config",
    ]
    return _tidy(d[cols])


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
    ref = d[d["impl"] == BASELINE][_MATCH + ["ms_median"]].rename(columns={"ms_median": "naive_ms_median"})
    others = d[d["impl"] != BASELINE]
    out = others.merge(ref, on=_MATCH, how="inner")
    out = out.assign(speedup=out["naive_ms_median"] / out["ms_median"])
    cols = _ID + [
        "ms_median",
        "naive_ms_median",
        "speedup",
        "kernel_config",
    ]
    return _tidy(out[cols])


def attention_speedup(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """Forward speed-up of each implementation over naive PyTorch attention against N.

    Experiment ``fa2-setting``, mode ``fwd``; values from ``speedup_table``. Same facets as
    ``attention_tflops``; the dashed line at 1 is naive itself, so a point above it is faster.
    """
    d = speedup_table(df)
    _require(d, "no ok timed forward rows of 'fa2-setting' matched to a naive row")
    order = _impl_order(d["impl"].unique())
    with _theme():
        g = _grid(d)
        for ax, sub in _facets(g, d):
            ax.axhline(1.0, color=PALETTE[BASELINE], linestyle="--", linewidth=1.2, zorder=2)
            for impl in order:
                s = sub[sub["impl"] == impl].sort_values("seqlen_q")
                if not s.empty:
                    ax.plot(s["seqlen_q"], s["speedup"], **_line_style(impl, order))
            _log2_x(ax, d["seqlen_q"])
            # speed-ups span from below 1 (sdpa-math) to tens: a log axis shows both ends
            ax.set_yscale("log", base=2)
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        legend = _legend_handles(order)
        legend[f"{BASELINE} (= 1)"] = Line2D([], [], color=PALETTE[BASELINE], linestyle="--", linewidth=1.2)
        _finish(
            g,
            _title(d, "forward speed-up over naive attention"),
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
    ok = ok_timed(d).dropna(subset=["peak_mem_mib"])
    ok = ok[ok["peak_mem_mib"] > 0]  # zero cannot sit on a log axis
    _require(ok, f"no ok timed {mode} rows with a peak memory for experiment 'memory'")
    others = d[~d["status"].isin(["ok", "oom"])]
    oom = d[d["status"] == "oom"]
    d = pd.concat([ok, oom], ignore_index=True)
    order = _impl_order(d["impl"].unique())
    # One shared level for OOM marks, above every measured value, so they never read as a measurement.
    oom_y = ok["peak_mem_mib"].max() * 3
    with _theme():
        # Usually a single panel, so give it the room a whole row of the other figures gets.
        g = _grid(d, height=3.6, aspect=1.5)
        for ax, sub in _facets(g, d):
            for impl in order:
                s = sub[(sub["impl"] == impl) & (sub["status"] == "ok")].sort_values("seqlen_q")
                if not s.empty:
                    # Tiled kernels need exactly their output here, so their lines coincide: ours goes
                    # underneath and the others dashed on top, so that every one stays visible.
                    style = _line_style(impl, order)
                    style.update(zorder=2) if impl == OURS else style.update(linestyle="--")
                    ax.plot(s["seqlen_q"], s["peak_mem_mib"], **style)
            _draw_oom(ax, sub[sub["status"] == "oom"], oom_y, order)
            _log2_x(ax, d["seqlen_q"])
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_ylim(top=oom_y * 2.5)
        legend = _legend_handles(order)
        if not oom.empty:
            legend["out of memory"] = Line2D(
                [], [], color="black", marker="x", markersize=8, markeredgewidth=2, linestyle=":"
            )
        if not others.empty:
            _note(g.figure, missing_note(others))
        _finish(
            g,
            _title(d, f"extra peak memory of one {MODE_TEXT[mode]} call"),
            "sequence length N",
            "extra peak memory (MiB)",
            legend,
            out_png,
        )
    cols = _ID + [
        "status",
        "peak_mem_mib",
        "ms_median",
        "message",
    ]
    return _tidy(d[cols], extra_sort=["status"])


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
                color=_colour(impl, order),
                zorder=6,
            )


def _tidy(d: pd.DataFrame, extra_sort: list[str] | None = None) -> pd.DataFrame:
    keys = ["dtype", "head_dim", "causal", "impl"] + (extra_sort or []) + ["seqlen_q", "seqlen_k"]
    return d.sort_values(keys, kind="stable").reset_index(drop=True)


# figure name -> (function, caption file in reports/captions/, section: the experiment it shows)
FIGURES = {
    "attention_tflops": (attention_tflops, "attention_tflops.rst", "fa2-setting"),
    "attention_speedup": (attention_speedup, "attention_speedup.rst", "fa2-setting"),
    "attention_tflops_bwd": (attention_tflops_bwd, "attention_tflops_bwd.rst", "fa2-setting"),
    "attention_tflops_fwd_bwd": (attention_tflops_fwd_bwd, "attention_tflops_fwd_bwd.rst", "fa2-setting"),
    "attention_memory": (attention_memory, "attention_memory.rst", "memory"),
    "attention_memory_fwd_bwd": (attention_memory_fwd_bwd, "attention_memory_fwd_bwd.rst", "memory"),
}
# Sections of a GPU's figures in the report, in order: experiment -> title.
SECTIONS = {
    "fa2-setting": "FlashAttention-2 setting: throughput per mode",
    "fa1-setting": "FlashAttention-1 setting (paper Figure 3)",
    "gain-surface": "Where the IO-aware gain grows and vanishes",
    "block-sweep": "Block configurations",
    "rescale-ablation": "Lazy against eager rescaling",
    "memory": "Memory against sequence length",
    "decode": "Decoding",
    "varlen": "Variable-length batches",
    "fp8-speed": "FP8 attention: speed",
    "fp8-accuracy": "FP8 attention: accuracy",
    "fa3-ablation": "FlashAttention-3 ablation",
    "traffic": "HBM traffic",
    "quant": "W4A16 / W8A16 linear layers",
    "moe": "Mixture-of-experts layers",
}


def gpu_comparison(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """The GPU types side by side: forward TFLOP/s and the fraction of each GPU's dense peak reached, per
    implementation, at the largest N of the FlashAttention-2 setting, per (dtype, head_dim, causal).

    ``df`` holds the rows of several GPUs (one table per GPU, concatenated). The peak comes from the GPU
    specification table (``analysis.gpus``); a GPU type missing from it gets no fraction.
    """
    from analysis import gpus as specs

    d = ok_timed(prepare(df, "fa2-setting", several_gpus=True))
    d = d[d["mode"] == "fwd"].dropna(subset=["tflops"])
    _require(d, "no ok timed forward rows for experiment 'fa2-setting'")
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
    order = _impl_order(d["impl"].unique())
    panels = d[["head_dim", "causal", "panel"]].drop_duplicates().sort_values(["head_dim", "causal"])["panel"]
    dtypes = [t for t in DTYPE_ORDER if t in set(d["dtype"])]
    palette = dict(zip(gpu_order, sns.color_palette("colorblind", len(gpu_order)), strict=True))
    with _theme():
        g = sns.catplot(
            data=d, kind="bar", x="impl", y="tflops", hue="gpu", col="panel", row="dtype",
            order=order, hue_order=gpu_order, col_order=list(panels), row_order=dtypes, palette=palette,
            height=FACET_HEIGHT, aspect=FACET_ASPECT,
            sharey=True, margin_titles=True, legend_out=True,
        )  # fmt: skip
        g.set_titles(row_template="{row_name}", col_template="{col_name}")
        g.set_axis_labels("", "TFLOP/s at the largest N")
        for ax in g.axes.flat:
            ax.tick_params(axis="x", labelrotation=45)
            for label in ax.get_xticklabels():
                label.set_horizontalalignment("right")
        g.figure.suptitle("GPU types side by side: forward throughput, FlashAttention-2 setting", fontweight="bold")
        g.figure.subplots_adjust(top=1 - 0.55 / g.figure.get_figheight())
        _save(g.figure, out_png)
    cols = ["gpu", "gpu_name", "dtype", "head_dim", "causal", "impl", "batch", "heads", "seqlen_q", "ms_median",
            "tflops", "peak_tflops", "fraction_of_peak", "kernel_config"]  # fmt: skip
    return d[cols].sort_values(["dtype", "head_dim", "causal", "impl", "gpu"]).reset_index(drop=True)


COMPARISON_FIGURES = {"gpu_comparison": (gpu_comparison, "gpu_comparison.rst")}


CAPTIONS_DIR = Path(__file__).resolve().parents[1] / "reports" / "captions"


def caption_text(file_name: str) -> str:
    """A figure's caption from reports/captions/ (shared with the HTML report and Snakemake's report)."""
    return " ".join((CAPTIONS_DIR / file_name).read_text(encoding="utf-8").split())


def render_all(df: pd.DataFrame, out_dir, registry: dict | None = None, table_source: str | None = None) -> list[dict]:
    """Write ``<name>.png`` and ``<name>.csv`` for every figure of ``registry`` (default ``FIGURES``) into
    ``out_dir``, and ``manifest.json`` listing them.

    Returns one dict per figure: ``name``, ``png`` and ``csv`` (paths as str, or None when skipped),
    ``caption`` (the caption file name) and ``caption_text``, ``reason`` (why it was skipped, else None),
    ``table_source`` (the result file drawn from, if given) and ``section`` (the experiment the figure
    belongs to, a key of ``SECTIONS``, from the registry's optional third field). A figure with nothing
    to draw is skipped rather than failing, so a partial run still yields a report; a skipped entry says
    with ``measured`` whether the run measured its experiment at all (False: not in this grid, and the
    report leaves it out rather than showing it as not drawn).

    The folder is built under a temporary name and replaces ``out_dir`` whole once every figure is drawn
    (``analysis.outputs.folder``): a figure that fails leaves the previous folder as it was, and no figure
    of an earlier, fuller run can pass for this run's.
    """
    out_dir = Path(out_dir)
    entries = []
    with outputs.folder(out_dir) as work:
        for name, (func, caption, *section) in (registry or FIGURES).items():
            entry = {"name": name, "png": None, "csv": None, "caption": caption,
                     "caption_text": caption_text(caption), "reason": None, "table_source": table_source,
                     "section": section[0] if section else None}  # fmt: skip
            try:
                table = func(df, work / f"{name}.png")
            except NoDataError as e:
                entry["reason"] = str(e)
                entry["measured"] = not isinstance(e, NotMeasured) and _measured_at_all(df, entry["section"])
            else:
                table.to_csv(work / f"{name}.csv", index=False)
                entry.update(png=str(out_dir / f"{name}.png"), csv=str(out_dir / f"{name}.csv"))
            entries.append(entry)
        (work / "manifest.json").write_text(json.dumps(entries, indent=2) + "\n")
    return entries


# The figures of the other attention experiments, in analysis/attention_figures.py (which uses the helpers
# above, so it is imported when a figure is drawn rather than here).
def _deferred(name: str, module: str = "attention_figures"):
    def draw(df: pd.DataFrame, out_png) -> pd.DataFrame:
        import importlib

        return getattr(importlib.import_module(f"analysis.{module}"), name)(df, out_png)

    draw.__name__ = draw.__qualname__ = name
    return draw


FIGURES.update(
    {
        "fa1_figure3": (_deferred("fa1_figure3"), "fa1_figure3.rst", "fa1-setting"),
        "gain_surface": (_deferred("gain_surface"), "gain_surface.rst", "gain-surface"),
        "block_sweep": (_deferred("block_sweep"), "block_sweep.rst", "block-sweep"),
        "rescale_ablation": (_deferred("rescale_ablation"), "rescale_ablation.rst", "rescale-ablation"),
        "decode_latency": (_deferred("decode_latency"), "decode_latency.rst", "decode"),
        "varlen_padding": (_deferred("varlen_padding"), "varlen_padding.rst", "varlen"),
        "fp8_speed": (_deferred("fp8_speed"), "fp8_speed.rst", "fp8-speed"),
        "fp8_accuracy": (_deferred("fp8_accuracy"), "fp8_accuracy.rst", "fp8-accuracy"),
        "fa3_ladder": (_deferred("fa3_ladder", "fa3_figures"), "fa3_ladder.rst", "fa2-setting"),
        "fa3_ablation": (_deferred("fa3_ablation", "fa3_figures"), "fa3_ablation.rst", "fa3-ablation"),
    }
)
