"""The operator table's plotting helpers (``ops.csv``), shared by the W4A16 and MoE families' figures.

One palette over the table's implementations (``PALETTE``): each family's lines take colours of their own
from it (``line_styles``), so that no two implementations of the table look alike.

GPU time and eager cost. The plotted times are GPU time (``ms_median``: the harness hides the host side of a
call). A call issued eagerly, one after another, costs about the larger of its GPU time and its host side
(``host_ms``: checks, allocations, launches, any synchronisation), ``eager_ms``. Where the two differ by more
than ``EAGER_GAP`` (20%) at some point of a line, ``line_panels`` also draws that line from the eager cost,
dotted ("<impl>, eager call"), so that a speed-up that exists only on the GPU's clock is seen as such; the
tables carry ``host_ms`` and the eager values beside the GPU ones. Rows measured before ``host_ms`` existed
have no eager line.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from analysis.core.plotting import floor_at_zero, gpu_label, log2_x, save, theme
from analysis.core.tables import finished

# One colour per implementation of the table; a family's lines take a run of them (``line_styles``).
PALETTE = sns.color_palette("colorblind", 13)
MARKER_CYCLE = "oDsv^"


def line_styles(order: list[str], first: int) -> dict[str, dict]:
    """Each implementation of ``order`` with the look of its line: colours ``first``, ``first`` + 1, … of
    ``PALETTE``, markers in turn, and the first of them (our kernel) drawn thicker. The dict keeps the
    order, which is the order lines are drawn in."""
    if first < 0 or first + len(order) > len(PALETTE):
        raise ValueError(f"first={first}: {len(order)} implementations do not fit in the {len(PALETTE)} colours")
    return {
        impl: {
            "color": PALETTE[first + i],
            "marker": MARKER_CYCLE[i % len(MARKER_CYCLE)],
            "linewidth": 2.4 if i == 0 else 1.4,
        }
        for i, impl in enumerate(order)
    }


CANDIDATE_LOOKS = ({"linestyle": "--", "marker": "x"}, {"linestyle": "-.", "marker": "+"})


def with_candidates(styles: dict[str, dict], candidates: dict[str, tuple[str, ...]]) -> dict[str, dict]:
    """``styles`` and, after them, the looks of candidate implementations (``candidates``: an implementation of
    ``styles`` → its candidates): each in its implementation's colour, thin, dashed (the first candidate) or
    dash-dotted (the second), so that a candidate path reads as a variant of the kernel it may replace."""
    out = dict(styles)
    for impl, names in candidates.items():
        if len(names) > len(CANDIDATE_LOOKS):
            raise ValueError(f"{impl}: {len(names)} candidates, looks for {len(CANDIDATE_LOOKS)}")
        for name, look in zip(names, CANDIDATE_LOOKS, strict=False):
            out[name] = {"color": styles[impl]["color"], "linewidth": 1.4, **look}
    return out


EAGER_GAP = 0.2  # draw the eager-cost line where it differs from the GPU-time one by more than this


def prepare(df: pd.DataFrame, experiment: str) -> pd.DataFrame:
    """Ok, timed rows of one experiment (w4a16, moe) with their eager cost; refuses a table that mixes GPUs."""
    gpus = df["gpu"].dropna().unique()
    if len(gpus) > 1:
        raise ValueError(f"figures are drawn for one GPU at a time, got {sorted(map(str, gpus))}")
    d = finished(df, experiment=experiment).copy()
    # what an eager call costs: the larger of GPU time and host time (NaN where host_ms was not measured)
    d["eager_ms"] = np.fmax(d["ms_median"], d["host_ms"]).where(d["host_ms"].notna())
    return d


def eager_differs(gpu: pd.Series, eager: pd.Series) -> pd.Series:
    """Where an eager-cost value differs from its GPU-time value by more than ``EAGER_GAP``."""
    return (eager / gpu - 1.0).abs() > EAGER_GAP


def title(d: pd.DataFrame, what: str) -> str:
    gpu = gpu_label(d)
    dtypes = ", ".join(sorted(map(str, d["dtype"].dropna().unique())))
    return f"{gpu}: {what}" + (f" ({dtypes})" if dtypes else "")


def panel_grid(n: int, width: float = 4.0, height: float = 3.2):
    cols = min(n, 3)
    rows = int(np.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def finish(fig, axes, title: str, out_png) -> None:
    """The legend beside the last panel, the title, and the PNG."""
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    fig.suptitle(title, fontweight="bold")
    fig.tight_layout()
    save(fig, out_png)


def line_panels(
    d: pd.DataFrame,
    panel: str,
    panels: list[str],
    styles: dict[str, dict],
    x: str,
    value: str,
    labels: tuple[str, str],
    what: str,
    out_png,
    width: float = 4.0,
    mark=None,
    eager: str | None = None,
) -> None:
    """One panel per value of column ``panel`` (in the order of ``panels``): ``value`` against ``x`` on a log2
    axis, a line per implementation of ``styles`` present (``line_styles``: in its order, with its look), axes
    labelled ``labels`` (x, y) and the figure titled ``what``; ``mark(ax, rows)`` adds what a panel has besides
    (a reference line, a log y-axis). ``eager``: the column of ``value`` at the eager cost; a line where it
    differs from ``value`` by more than ``EAGER_GAP`` at some point is drawn again from it, dotted (module
    docstring)."""
    with theme():
        fig, axes = panel_grid(len(panels), width=width)
        for ax, name in zip(axes, panels, strict=True):
            s = d[d[panel] == name]
            for impl in [i for i in styles if i in set(s["impl"])]:
                look = styles[impl]
                line = s[s["impl"] == impl].sort_values(x)
                ax.plot(line[x], line[value], label=impl, **look)
                if eager is not None and eager_differs(line[value], line[eager]).any():
                    ax.plot(
                        line[x],
                        line[eager],
                        marker=look["marker"],
                        color=look["color"],
                        linestyle=":",
                        fillstyle="none",
                        linewidth=1.2,
                        label=f"{impl}, eager call",
                    )
            if mark is not None:
                mark(ax, s)
            floor_at_zero(ax)
            log2_x(ax, s[x].dropna())
            ax.set_title(name, fontsize=9)
            ax.set_xlabel(labels[0])
            ax.set_ylabel(labels[1])
        finish(fig, axes, title(d, what), out_png)
