"""Figures of the W4A16 family (rows of ``ops.csv``), drawn with the operator table's helpers
(``analysis.families._shared.operator_plots``).

- ``w4a16_speedup``: speed-up over bf16 ``F.linear`` (the line at 1) against M, one panel per layer shape:
  large at decode sizes, where the layer streams its weights, towards or below 1 where it is compute-bound
  (our kernels' candidate paths dashed, in their kernel's colour);
- ``w4a16_bandwidth``: GB/s on the weight bytes each implementation reads, against M, with the measured copy
  bandwidth of the packed weight (dashed) as the ceiling.

Each draws rows with ``status == "ok"`` that were timed and returns the table it drew; a figure with nothing
to draw raises ``NoDataError`` (``analysis.core.plotting``).
"""

from __future__ import annotations

import pandas as pd

from analysis.core.family import Figure
from analysis.core.plotting import NoDataError
from analysis.families._shared.operator_plots import line_panels, line_styles, prepare, with_candidates
from analysis.families.w4a16.plan import CANDIDATES
from analysis.families.w4a16.tables import with_copy_gbps

QUANT_ORDER = ["ours-w4a16", "ours-w8a16", "torch-int4pack", "dequant-linear", "torch-linear"]
# the first colours of the operator table's palette; our kernels' candidate paths as variants of them
QUANT_STYLES = with_candidates(line_styles(QUANT_ORDER, first=0), CANDIDATES)


def shape_label(r) -> str:
    return f"{r['model']} ({int(r['k'])}→{int(r['n'])})"


def w4a16_speedup(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """Speed-up over bf16 F.linear against M, per layer shape (see the module docstring)."""
    d = prepare(df, "w4a16")
    keys = ["model", "dtype", "group_size", "m"]
    base = d[d["impl"] == "torch-linear"].set_index(keys)[["ms_median", "eager_ms"]]
    base = base.rename(columns={"ms_median": "linear_ms", "eager_ms": "linear_eager_ms"})
    d = d[d["impl"].isin(QUANT_STYLES) & (d["impl"] != "torch-linear")].join(base, on=keys).dropna(subset=["linear_ms"])
    if d.empty:
        raise NoDataError("no ok quant rows with a bf16 F.linear row at the same M")
    d["speedup"] = d["linear_ms"] / d["ms_median"]
    d["eager_speedup"] = d["linear_eager_ms"] / d["eager_ms"]  # both called eagerly
    d["shape"] = [shape_label(r) for r in d.to_dict("records")]
    shapes = list(dict.fromkeys(d.sort_values(["n", "k"])["shape"]))

    def parity(ax, s):
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1.0, label="bf16 F.linear = 1")

    line_panels(
        d,
        "shape",
        shapes,
        QUANT_STYLES,
        "m",
        "speedup",
        ("M (rows of x)", "speed-up over F.linear"),
        "weight-only quantised linear layers against bf16 F.linear",
        out_png,
        mark=parity,
        eager="eager_speedup",
    )
    cols = [
        "gpu",
        "gpu_name",
        "dtype",
        "model",
        "n",
        "k",
        "group_size",
        "impl",
        "m",
        "ms_median",
        "host_ms",
        "linear_ms",
        "speedup",
        "eager_speedup",
        "gbps",
        "max_abs_err",
        "quant_err",
        "kernel_config",
    ]
    return d[cols].sort_values(["model", "impl", "m"]).reset_index(drop=True)


def w4a16_bandwidth(df: pd.DataFrame, out_png) -> pd.DataFrame:
    """GB/s on the weight bytes read against M, with the copy bandwidth of the packed weight."""
    d = prepare(df, "w4a16").dropna(subset=["gbps"])
    lines = d[d["impl"].isin(QUANT_STYLES) & (d["impl"] != "dequant-linear")]
    if lines.empty:
        raise NoDataError("no ok quant rows with a bandwidth")
    lines = lines.assign(copy_gbps=with_copy_gbps(lines, d), shape=[shape_label(r) for r in lines.to_dict("records")])
    lines["fraction_of_copy"] = lines["gbps"] / lines["copy_gbps"]
    lines["eager_gbps"] = lines["gbps"] * lines["ms_median"] / lines["eager_ms"]
    shapes = list(dict.fromkeys(lines.sort_values(["n", "k"])["shape"]))

    def ceiling(ax, s):
        copy = s["copy_gbps"].dropna()
        if len(copy):
            ax.axhline(
                float(copy.iloc[0]), color="black", linestyle="--", linewidth=1.0, label="copy of the packed weight"
            )

    line_panels(
        lines,
        "shape",
        shapes,
        QUANT_STYLES,
        "m",
        "gbps",
        ("M (rows of x)", "GB/s on the weight bytes"),
        "bandwidth on the weight bytes read",
        out_png,
        mark=ceiling,
        eager="eager_gbps",
    )
    cols = [
        "gpu",
        "gpu_name",
        "dtype",
        "model",
        "n",
        "k",
        "group_size",
        "impl",
        "m",
        "ms_median",
        "host_ms",
        "model_bytes",
        "gbps",
        "eager_gbps",
        "copy_gbps",
        "fraction_of_copy",
    ]
    return lines[cols].sort_values(["model", "impl", "m"]).reset_index(drop=True)


# name -> figure (caption: captions/<name>.rst; section: the report section)
FIGURES = {
    "w4a16_speedup": Figure(w4a16_speedup, "w4a16"),
    "w4a16_bandwidth": Figure(w4a16_bandwidth, "w4a16"),
}
