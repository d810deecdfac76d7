"""The attention table's plotting helpers, shared by the attention and FP8 families' figures.

``prepare(df, experiment)`` gives one experiment's rows with bools, numbers and the facet label (``panel``)
normalised; ``ok_timed`` and ``failed`` split them; ``facet_grid`` lays out one column per (head_dim, causal)
and one row per dtype; ``title`` names what the facets leave fixed; ``missing_note`` names the points that did
not finish, for the note under a figure, and ``with_failed`` keeps them in the table behind it. Only rows that
finished and were timed are drawn; where an implementation ran out of memory is part of the result, so the
memory figure marks those points.
"""

from __future__ import annotations

import pandas as pd
import seaborn as sns

from analysis.core.plotting import (
    DTYPE_ORDER,
    FACET_ASPECT,
    FACET_HEIGHT,
    as_bool,
    fmt_n,
    gpu_label,
    hide_empty_facets,
    note,
    save,
)

BASELINE = "naive"


SHAPE = ["batch", "heads", "seqlen_q", "seqlen_k", "head_dim"]


NUMERIC = ["ms_median", "ms_p20", "ms_p80", "tflops", "peak_mem_mib", "model_bytes", "gbps", "pad_waste", "tokens"]


# Leading columns of every table behind a figure.
ID = [
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
MATCH = ["dtype", "head_dim", "causal", "seqlen_q", "seqlen_k", "batch", "heads", "mode"]


def prepare(df: pd.DataFrame, experiment: str, several_gpus: bool = False) -> pd.DataFrame:
    """Rows of one experiment with bools, numbers and the facet label (``panel``) normalised.

    Raises ``ValueError`` if the table mixes GPUs, unless ``several_gpus`` (the comparison figure):
    every other figure and summary is for one GPU.
    """
    gpus = df["gpu"].dropna().unique()
    if len(gpus) > 1 and not several_gpus:
        raise ValueError(f"figures are drawn for one GPU at a time, got {sorted(map(str, gpus))}")
    d = df[df["experiment"] == experiment].copy()
    d["causal"] = as_bool(d["causal"])
    d["timed"] = as_bool(d["timed"])
    for c in SHAPE + NUMERIC + ["heads_kv"]:
        d[c] = pd.to_numeric(d[c], errors="coerce")
    # A row without a shape cannot be placed on any axis.
    d = d.dropna(subset=SHAPE)
    for c in SHAPE:
        d[c] = d[c].astype("int64")
    d["dtype"] = d["dtype"].astype(str)
    d["panel"] = [panel_label(h, c) for h, c in zip(d["head_dim"], d["causal"], strict=True)]
    return d


def panel_label(head_dim: int, causal: bool) -> str:
    return f"d={head_dim}, {'causal' if causal else 'non-causal'}"


def ok_timed(d: pd.DataFrame) -> pd.DataFrame:
    """Rows of a ``prepare``d frame that finished and were timed: the only ones with a valid time."""
    return d[(d["status"] == "ok") & d["timed"]]


MAX_LISTED = 8  # failed points named one by one in a figure's note; the rest are counted


def failed(d: pd.DataFrame) -> pd.DataFrame:
    """Rows of a ``prepare``d frame that did not finish."""
    return d[d["status"] != "ok"]


def point_label(r) -> str:
    parts = [str(r["impl"])]
    if r.get("experiment") == "decode":
        parts.append(f"Nk={fmt_n(r['seqlen_k'])}")
    elif r.get("experiment") != "varlen":
        parts.append(f"N={fmt_n(r['seqlen_q'])}")
    parts.append(f"d={r['head_dim']}")
    if r.get("kernel_config") and r.get("experiment") == "block-sweep":
        parts.append(str(r["kernel_config"]))
    return " ".join(parts) + f" ({r['status']})"


def missing_note(bad: pd.DataFrame) -> str:
    """One line naming the points that were attempted but not drawn ("" if none)."""
    if bad.empty:
        return ""
    labels = [point_label(r) for r in bad.to_dict("records")]
    listed = "; ".join(labels[:MAX_LISTED])
    more = f"; and {len(labels) - MAX_LISTED} more" if len(labels) > MAX_LISTED else ""
    return f"Not drawn, {len(labels)} point(s) that did not finish: {listed}{more} (see the failures table)."


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


def title(d: pd.DataFrame, what: str) -> str:
    gpu = gpu_label(d)
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
    return ok_timed(d[d["mode"] == mode])


MODE_TEXT = {"fwd": "forward", "bwd": "backward", "fwd+bwd": "forward + backward"}


def tidy(d: pd.DataFrame, extra_sort: list[str] | None = None) -> pd.DataFrame:
    keys = ["dtype", "head_dim", "causal", "impl"] + (extra_sort or []) + ["seqlen_q", "seqlen_k"]
    return d.sort_values(keys, kind="stable").reset_index(drop=True)


def save_with_note(fig, out_png, text: str = "") -> None:
    """Write the figure with ``text`` (what is missing from it) under it."""
    note(fig, text)
    save(fig, out_png)


def with_failed(drawn: pd.DataFrame, bad: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    """The table behind a figure: what was drawn, then the failed points (status and message)."""
    cols = [c for c in cols if c in drawn.columns or c in bad.columns]
    extra = [c for c in ("status", "message") if c not in cols]
    out = pd.concat([drawn.assign(status="ok", message=""), bad], ignore_index=True)
    return out[cols + extra].reset_index(drop=True)


def pair(d: pd.DataFrame, keys: list[str], ref_impl: str, value: str = "ms_median") -> pd.DataFrame:
    """Every other impl's rows joined with ``ref_impl``'s row at the same point (``<value>_ref``)."""
    ref = d[d["impl"] == ref_impl][keys + [value]].rename(columns={value: f"{value}_ref"})
    return d[d["impl"] != ref_impl].merge(ref, on=keys, how="inner")
