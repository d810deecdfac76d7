"""The figure toolkit every family draws with: one look per implementation, axes, saving, ``render_all``.

A figure function takes ``(df, out_png)``, writes the PNG and returns the tidy frame it actually plotted (the
"table behind the figure"), or raises ``NoDataError`` when the table holds nothing it can draw.
``render_all`` draws a family's figures into a folder with their tables and a ``manifest.json`` (name,
caption, section, and why a figure was skipped), built under a temporary name and swapped in whole.

One fixed colour and marker per implementation (``PALETTE``, ``MARKERS``; names outside them get spare
colours in alphabetical order), so an implementation looks the same in every figure and on every GPU;
markers differ too, so the lines stay apart in greyscale and for colour-blind readers. Figures are files
only, never windows (the Agg backend): this runs in workflow jobs and on headless GPU machines.
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
from matplotlib.ticker import NullFormatter

from analysis.core import outputs, tables
from analysis.core.paths import ROOT

matplotlib.use("Agg")

OURS = "ours-fa2"  # our main kernel: its lines are drawn thicker, as are ours-fa3's


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
DPI = 110
FACET_HEIGHT = 2.8
FACET_ASPECT = 1.2


class NoDataError(ValueError):
    """The table holds no rows this figure can draw."""


class NotMeasured(NoDataError):
    """The run did not measure what this figure shows (no row of its experiment or mode, of any status):
    the report leaves the figure out instead of showing it as not drawn."""


def measured_at_all(df: pd.DataFrame, section: str | None) -> bool:
    """Whether ``df`` has any row (of any status) of the experiment or family ``section``."""
    if not section or "experiment" not in df:
        return True
    return bool(tables.section_mask(df, section).any())


def note(fig, text: str) -> None:
    """A note under a figure (what is missing from it); kept by ``bbox_inches="tight"`` when saved."""
    if text:
        # a tenth of an inch below the figure's bottom edge, so it never covers an axis label
        fig.text(
            0.01,
            -0.1 / fig.get_figheight(),
            "\n".join(textwrap.wrap(text, 150)),
            ha="left",
            va="top",
            fontsize=7.5,
            color="#444",
        )


def require(d: pd.DataFrame, what: str) -> None:
    if d.empty:
        raise NoDataError(what)


def impl_order(impls) -> list[str]:
    known = [i for i in PALETTE if i in set(impls)]
    return known + sorted(set(impls) - set(PALETTE))


def colour(impl: str, order: list[str]) -> str:
    if impl in PALETTE:
        return PALETTE[impl]
    extras = [i for i in order if i not in PALETTE]
    return _SPARE_COLOURS[extras.index(impl) % len(_SPARE_COLOURS)]


def line_style(impl: str, order: list[str]) -> dict:
    style = {"color": colour(impl, order), "marker": MARKERS.get(impl, "o")}
    if impl in (OURS, "ours-fa3"):
        style.update(linewidth=2.8, markersize=7 if impl == OURS else 9, zorder=5)
    else:
        style.update(linewidth=1.4, markersize=4.5, zorder=3, alpha=0.9)
    return style


def legend_handles(order: list[str]) -> dict:
    return {impl: Line2D([], [], **line_style(impl, order)) for impl in order}


def fmt_n(n: float) -> str:
    n = int(n)
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def log2_x(ax, ns) -> None:
    """log2 x-axis with a labelled tick at every sequence length that was measured."""
    ns = sorted({int(n) for n in ns})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns)
    ax.set_xticklabels([fmt_n(n) for n in ns])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis="x", which="minor", bottom=False)


def gpu_label(d: pd.DataFrame) -> str:
    """The GPU a figure's rows come from, for its title: the recorded name, else the type, else "GPU"."""
    names = d["gpu_name"].dropna().unique()
    return str(names[0]) if len(names) else str(next(iter(d["gpu"].dropna().unique()), "GPU"))


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
            shown[-1].annotate(
                str(g.row_names[i]), xy=(1.02, 0.5), xycoords="axes fraction", rotation=270, ha="left", va="center"
            )


def save(fig, out_png) -> None:
    """Write ``fig`` to ``out_png`` (its folder created) and close it."""
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=DPI, bbox_inches="tight")
    plt.close(fig)


@contextmanager
def theme():
    # Scoped rather than sns.set_theme(), so importing this module changes no global matplotlib state.
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.85):
        yield


def caption_text(path: str) -> str:
    """A caption file's text on one line (``path`` relative to the repository root)."""
    return " ".join((ROOT / path).read_text(encoding="utf-8").split())


def render_all(df: pd.DataFrame, out_dir, figures: dict, caption_of, table_source: str | None = None) -> list[dict]:
    """Write ``<name>.png`` and ``<name>.csv`` for every figure of ``figures`` (name → ``Figure``) into
    ``out_dir``, and ``manifest.json`` listing them; ``caption_of(name)`` is the caption file of a figure,
    relative to the repository root (``Family.caption``).

    Returns one dict per figure: ``name``, ``png`` and ``csv`` (paths as str, or None when skipped),
    ``caption`` (the caption file) and ``caption_text``, ``reason`` (why it was skipped, else None),
    ``table_source`` (the result file drawn from, if given) and ``section`` (the report section the figure
    belongs to). A figure with nothing to draw is skipped rather than failing, so a partial run still yields
    a report; a skipped entry says with ``measured`` whether the run measured its section at all (False: not
    in this grid, and the report leaves it out rather than showing it as not drawn).

    The folder is built under a temporary name and replaces ``out_dir`` whole once every figure is drawn
    (``analysis.core.outputs.folder``): a figure that fails leaves the previous folder as it was, and no
    figure of an earlier, fuller run can pass for this run's.
    """
    out_dir = Path(out_dir)
    entries = []
    with outputs.folder(out_dir) as work:
        for name, figure in figures.items():
            caption = caption_of(name)
            entry = {
                "name": name,
                "png": None,
                "csv": None,
                "caption": caption,
                "caption_text": caption_text(caption),
                "reason": None,
                "table_source": table_source,
                "section": figure.section,
            }
            try:
                table = figure.draw(df, work / f"{name}.png")
            except NoDataError as e:
                entry["reason"] = str(e)
                entry["measured"] = not isinstance(e, NotMeasured) and measured_at_all(df, entry["section"])
            else:
                table.to_csv(work / f"{name}.csv", index=False)
                entry.update(png=str(out_dir / f"{name}.png"), csv=str(out_dir / f"{name}.csv"))
            entries.append(entry)
        (work / "manifest.json").write_text(json.dumps(entries, indent=2) + "\n")
    return entries
