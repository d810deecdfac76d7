"""Figures of the operator experiments (``analysis.ops_tables`` rows): W4A16 linear layers and MoE layers.

- ``w4a16_speedup``: speed-up over bf16 ``F.linear`` (the line at 1) against M, one panel per layer shape:
  the shape of the Marlin figure (large at decode sizes, where the layer streams its weights, towards or
  below 1 where it is compute-bound);
- ``w4a16_bandwidth``: GB/s on the weight bytes each implementation reads, against M, with the measured copy
  bandwidth of the packed weight (dashed) as the ceiling;
- ``moe_time_split``: our MoE layer's time split into routing, dispatch, grouped GEMMs and combine (stacked
  bars per token count), one panel per (shape, routing);
- ``moe_layer``: the whole layer's time against tokens for every implementation (ours, the per-expert loop,
  per-token weight gathering, torch._grouped_mm, the dense FFN of equal FLOPs);
- ``moe_grouped_gemm``: TFLOP/s of the grouped GEMM alone (ours, torch._grouped_mm, a loop of matmuls).

Each function takes ``(df, out_png)``, draws rows with ``status == "ok"`` that were timed, and returns the
table it drew; ``render_all`` (``analysis.figures``) stores it next to the PNG, and a figure with nothing to
draw becomes a skip entry with the reason.

GPU time and eager cost. The plotted times are GPU time (``ms_median``: the harness hides the host side of
a call). A call issued eagerly, one after another, costs about the larger of its GPU time and its host
side (``host_ms``: checks, allocations, launches, any synchronisation), ``eager_ms``. Where the two differ
by more than ``EAGER_GAP`` (20%) at some point of a line, the figure also draws that line from the eager
cost, dotted ("<impl>, eager call"), so that a speed-up that exists only on the GPU's clock is seen as
such; the tables carry ``host_ms`` and the eager values beside the GPU ones. Rows measured before
``host_ms`` existed have no eager line. The MoE time split shows GPU time only.
"""

from __future__ import annotations

import logging

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from analysis import figures
from analysis.figures import NoDataError, _as_bool, _gpu_label, _log2_x, _save, _theme, floor_at_zero
from analysis.ops_tables import STAGES, moe_stage_split, with_copy_gbps

matplotlib.use("Agg")

log = logging.getLogger(__name__)

_NUMERIC = ["m", "n", "k", "group_size", "experts", "top_k", "tokens", "ms_median", "ms_p20", "ms_p80", "host_ms",
            "tflops", "model_bytes", "gbps", "peak_mem_mib", "max_abs_err", "rel_err", "quant_err"]  # fmt: skip
QUANT_ORDER = ["ours-w4a16", "ours-w8a16", "torch-int4pack", "dequant-linear", "torch-linear"]
MOE_ORDER = ["ours-moe", "grouped-mm-moe", "loop-moe", "gather-moe", "dense-ffn"]
GROUPED_ORDER = ["ours-grouped", "torch-grouped-mm", "loop-grouped"]
STAGE_COLOURS = dict(zip(STAGES[:-1], ("#8c564b", "#1f77b4", "#d62728", "#2ca02c"), strict=True))
_COLOURS = dict(zip(QUANT_ORDER + MOE_ORDER + GROUPED_ORDER, sns.color_palette("colorblind", 13), strict=True))
_MARKERS = dict(zip(QUANT_ORDER + MOE_ORDER + GROUPED_ORDER, "oDsv^" * 3, strict=False))
_THICK = {"ours-w4a16", "ours-moe", "ours-grouped"}  # the line of our kernel in each figure
EAGER_GAP = 0.2  # draw the eager-cost line where it differs from the GPU-time one by more than this


def prepare(df: pd.DataFrame, family: str) -> pd.DataFrame:
    """Ok, timed rows of one family with numbers normalised; refuses a table that mixes GPUs."""
    gpus = df["gpu"].dropna().unique()
    if len(gpus) > 1:
        raise ValueError(f"figures are drawn for one GPU at a time, got {sorted(map(str, gpus))}")
    d = df[df["family"] == family].copy()
    for c in _NUMERIC:
        d[c] = pd.to_numeric(d[c], errors="coerce")
    d["timed"] = _as_bool(d["timed"])
    d = d[(d["status"] == "ok") & d["timed"]].copy()
    # what an eager call costs: the larger of GPU time and host time (NaN where host_ms was not measured)
    d["eager_ms"] = np.fmax(d["ms_median"], d["host_ms"]).where(d["host_ms"].notna())
    return d


def eager_differs(gpu: pd.Series, eager: pd.Series) -> pd.Series:
    """Where an eager-cost value differs from its GPU-time value by more than ``EAGER_GAP``."""
    return (eager / gpu - 1.0).abs() > EAGER_GAP


def _title(d: pd.DataFrame, what: str) -> str:
    gpu = _gpu_label(d)
    dtypes = ", ".join(sorted(map(str, d["dtype"].dropna().unique())))
    return f"{gpu}: {what}" + (f" ({dtypes})" if dtypes else "")


def _panels(n: int, width: float = 4.0, height: float = 3.2):
    cols = min(n, 3)
    rows = int(np.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _shape_label(r) -> str:
    return f"{r['model']} ({int(r['k'])}→{int(r['n'])})"


def _finish(fig, axes, title: str, out_png) -> None:
    """The legend beside the last panel, the title, and the PNG."""
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    fig.suptitle(title, fontweight="bold")
    fig.tight_layout()
    _save(fig, out_png)


def _line_panels(d: pd.DataFrame, panel: str, panels: list[str], order: list[str], x: str, value: str,
                 labels: tuple[str, str], what: str, out_png, width: float = 4.0, mark=None,
                 eager: str | None = None) -> None:  # fmt: skip
    """One panel per value of column ``panel`` (in the order of ``panels``): ``value`` against ``x`` on a log2
    axis, a line per implementation of ``order`` present (ours thicker), axes labelled ``labels`` (x, y) and
    the figure titled ``what``; ``mark(ax, rows)`` adds what a panel has besides (a reference line, a log
    y-axis). ``eager``: the column of ``value`` at the eager cost; a line where it differs from ``value`` by
    more than ``EAGER_GAP`` at some point is drawn again from it, dotted (module docstring)."""
    with _theme():
        fig, axes = _panels(len(panels), width=width)
        for ax, name in zip(axes, panels, strict=True):
            s = d[d[panel] == name]
            for impl in [i for i in order if i in set(s["impl"])]:
                line = s[s["impl"] == impl].sort_values(x)
                ax.plot(line[x], line[value], marker=_MARKERS[impl], color=_COLOURS[impl], label=impl,
                        linewidth=2.4 if impl in _THICK else 1.4)  # fmt: skip
                if eager is not None and eager_differs(line[value], line[eager]).any():
                    ax.plot(line[x], line[eager], marker=_MARKERS[impl], color=_COLOURS[impl], linestyle=":",
                            fillstyle="none", linewidth=1.2, label=f"{impl}, eager call")  # fmt: skip
            if mark is not None:
                mark(ax, s)
            floor_at_zero(ax)
            _log2_x(ax, [v for v in s[x] if v == v])
            ax.set_title(name, fontsize=9)
            ax.set_xlabel(labels[0])
            ax.set_ylabel(labels[1])
        _finish(fig, axes, _title(d, what), out_png)


def w4a16_speedup(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """Speed-up over bf16 F.linear against M, per layer shape (see the module docstring)."""
    d = prepare(df, "quant")
    keys = ["model", "dtype", "group_size", "m"]
    base = d[d["impl"] == "torch-linear"].set_index(keys)[["ms_median", "eager_ms"]]
    base = base.rename(columns={"ms_median": "linear_ms", "eager_ms": "linear_eager_ms"})
    d = d[d["impl"].isin(QUANT_ORDER) & (d["impl"] != "torch-linear")].join(base, on=keys).dropna(subset=["linear_ms"])
    if d.empty:
        raise NoDataError("no ok quant rows with a bf16 F.linear row at the same M")
    d["speedup"] = d["linear_ms"] / d["ms_median"]
    d["eager_speedup"] = d["linear_eager_ms"] / d["eager_ms"]  # both called eagerly
    d["shape"] = [_shape_label(r) for r in d.to_dict("records")]
    shapes = list(dict.fromkeys(d.sort_values(["n", "k"])["shape"]))

    def parity(ax, s):
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1.0, label="bf16 F.linear = 1")

    _line_panels(d, "shape", shapes, QUANT_ORDER, "m", "speedup", ("M (rows of x)", "speed-up over F.linear"),
                 "weight-only quantised linear layers against bf16 F.linear", out_png, mark=parity,
                 eager="eager_speedup")  # fmt: skip
    cols = ["gpu", "gpu_name", "dtype", "model", "n", "k", "group_size", "impl", "m", "ms_median", "host_ms",
            "linear_ms", "speedup", "eager_speedup", "gbps", "max_abs_err", "quant_err", "kernel_config"]  # fmt: skip
    return d[cols].sort_values(["model", "impl", "m"]).reset_index(drop=True)


def w4a16_bandwidth(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """GB/s on the weight bytes read against M, with the copy bandwidth of the packed weight."""
    d = prepare(df, "quant").dropna(subset=["gbps"])
    lines = d[d["impl"].isin(QUANT_ORDER) & (d["impl"] != "dequant-linear")]
    if lines.empty:
        raise NoDataError("no ok quant rows with a bandwidth")
    lines = lines.assign(copy_gbps=with_copy_gbps(lines, d), shape=[_shape_label(r) for r in lines.to_dict("records")])
    lines["fraction_of_copy"] = lines["gbps"] / lines["copy_gbps"]
    lines["eager_gbps"] = lines["gbps"] * lines["ms_median"] / lines["eager_ms"]
    shapes = list(dict.fromkeys(lines.sort_values(["n", "k"])["shape"]))

    def ceiling(ax, s):
        copy = s["copy_gbps"].dropna()
        if len(copy):
            ax.axhline(float(copy.iloc[0]), color="black", linestyle="--", linewidth=1.0,
                       label="copy of the packed weight")  # fmt: skip

    _line_panels(lines, "shape", shapes, QUANT_ORDER, "m", "gbps", ("M (rows of x)", "GB/s on the weight bytes"),
                 "bandwidth on the weight bytes read", out_png, mark=ceiling, eager="eager_gbps")  # fmt: skip
    cols = ["gpu", "gpu_name", "dtype", "model", "n", "k", "group_size", "impl", "m", "ms_median", "host_ms",
            "model_bytes", "gbps", "eager_gbps", "copy_gbps", "fraction_of_copy"]  # fmt: skip
    return lines[cols].sort_values(["model", "impl", "m"]).reset_index(drop=True)


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
    with _theme():
        fig, axes = _panels(len(panels), width=3.6)
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
        _finish(fig, axes, _title(d, "where our MoE layer's time goes"), out_png)
    return wide.drop(columns=["panel"]).sort_values(["model", "routing", "tokens"]).reset_index(drop=True)


def _lines_vs_tokens(d: pd.DataFrame, order: list[str], value: str, eager: str, ylabel: str, what: str,
                     out_png) -> pd.DataFrame:  # fmt: skip
    d = d.assign(panel=[_moe_panel(r) for r in d.to_dict("records")])
    d["eager_tflops"] = d["tflops"] * d["ms_median"] / d["eager_ms"]
    panels = list(dict.fromkeys(d.sort_values(["model", "routing"])["panel"]))
    _line_panels(d, "panel", panels, order, "tokens", value, ("tokens", ylabel), what, out_png, width=3.8,
                 mark=lambda ax, s: ax.set_yscale("log"), eager=eager)  # fmt: skip
    cols = ["gpu", "gpu_name", "dtype", "model", "experts", "top_k", "k", "n", "routing", "impl", "tokens",
            "ms_median", "host_ms", "eager_ms", "tflops", "eager_tflops", "model_bytes", "gbps", "peak_mem_mib",
            "max_abs_err"]  # fmt: skip
    return d[cols].sort_values(["model", "routing", "impl", "tokens"]).reset_index(drop=True)


def moe_layer(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """The whole MoE layer's time against tokens, every implementation."""
    d = prepare(df, "moe")
    d = d[(d["op"] == "moe-layer") & (d["stage"] == "total") & d["impl"].isin(MOE_ORDER)]
    if d.empty:
        raise NoDataError("no ok timed rows of the whole MoE layer")
    return _lines_vs_tokens(d, MOE_ORDER, "ms_median", "eager_ms", "time per layer call (ms)",
                            "MoE layer against its baselines", out_png)  # fmt: skip


def moe_grouped_gemm(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """TFLOP/s of the grouped GEMM alone (the gate projection on the dispatched rows)."""
    d = prepare(df, "moe")
    d = d[(d["op"] == "grouped-gemm") & d["impl"].isin(GROUPED_ORDER)].dropna(subset=["tflops"])
    if d.empty:
        raise NoDataError("no ok timed grouped-GEMM rows")
    what = "grouped GEMM (gate projection)"
    return _lines_vs_tokens(d, GROUPED_ORDER, "tflops", "eager_tflops", "TFLOP/s", what, out_png)


# name -> (function, caption file in reports/captions/, section of the report)
FIGURES = {
    "w4a16_speedup": (w4a16_speedup, "w4a16_speedup.rst", "quant"),
    "w4a16_bandwidth": (w4a16_bandwidth, "w4a16_bandwidth.rst", "quant"),
    "moe_time_split": (moe_time_split, "moe_time_split.rst", "moe"),
    "moe_layer": (moe_layer, "moe_layer.rst", "moe"),
    "moe_grouped_gemm": (moe_grouped_gemm, "moe_grouped_gemm.rst", "moe"),
}


def render_all(df: pd.DataFrame, out_dir, table_source: str | None = None) -> list[dict]:
    """Draw every ops figure into ``out_dir`` (PNG, the table behind it, ``manifest.json``)."""
    return figures.render_all(df, out_dir, FIGURES, table_source)
