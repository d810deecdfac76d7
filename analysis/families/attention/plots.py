"""The attention family's own plotting helpers, beside the attention table's shared ones
(``analysis.families._shared.attention_plots``): the facet grid of the FA-2 setting's figures (one column per
(head_dim, causal), one row per dtype), the FA-2 setting's rows of one mode, and the words for the modes.
"""

from __future__ import annotations

import pandas as pd
import seaborn as sns

from analysis.core.plotting import DTYPE_ORDER, FACET_ASPECT, FACET_HEIGHT, hide_empty_facets, save
from analysis.core.tables import finished
from analysis.families._shared.attention_plots import prepare

BASELINE = "naive"


# What a row and its naive counterpart must share for a speed-up to compare like with like.
MATCH = ["dtype", "head_dim", "causal", "seqlen_q", "seqlen_k", "batch", "heads", "mode"]


def facet_grid(d: pd.DataFrame, height: float = FACET_HEIGHT, aspect: float = FACET_ASPECT) -> sns.FacetGrid:
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


def facets(g: sns.FacetGrid, d: pd.DataFrame):
    """(axis, rows of that facet) for every facet, empty facets included."""
    for (dtype, panel), ax in g.axes_dict.items():
        yield ax, d[(d["dtype"] == dtype) & (d["panel"] == panel)]


def finish(g: sns.FacetGrid, title: str, xlabel: str, ylabel: str, legend: dict, out_png) -> None:
    g.set_titles(row_template="{row_name}", col_template="{col_name}")
    g.set_axis_labels(xlabel, ylabel)
    hide_empty_facets(g, xlabel, ylabel)
    g.add_legend(legend_data=legend, title="implementation")
    g.figure.suptitle(title, fontweight="bold")
    # Room for the title above the column titles, in inches so it holds for any number of rows.
    g.figure.subplots_adjust(top=1 - 0.55 / g.figure.get_figheight())
    save(g.figure, out_png)


def fa2_forward(df: pd.DataFrame) -> pd.DataFrame:
    """Finished, timed forward rows of the ``fa2-setting`` experiment, ``prepare``d."""
    return fa2_mode(df, "fwd")


def fa2_mode(df: pd.DataFrame, mode: str) -> pd.DataFrame:
    """Finished, timed rows of one mode of the ``fa2-setting`` experiment, ``prepare``d."""
    d = prepare(df, "fa2-setting")
    return finished(d[d["mode"] == mode])


MODE_TEXT = {"fwd": "forward", "bwd": "backward", "fwd+bwd": "forward + backward"}
