"""The attention table's plotting helpers, shared by the attention and FP8 families' figures.

``prepare(df, experiment)`` gives one experiment's rows with the facet label (``panel``);
``analysis.core.tables.finished`` and ``failed`` split them; ``title`` names what the facets leave fixed;
``missing_note`` names the points that did not finish, for the note under a figure, and ``with_failed`` keeps
them in the table behind it; ``pair`` joins every implementation's rows to a reference's at the same point;
``ablation_bars`` draws an ablation (FA-3's, in bf16 or in FP8). Only rows that finished and were timed are
drawn; where an implementation ran out of memory is part of the result, so the memory figure marks those
points.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from analysis.core.plotting import fmt_n, gpu_label, note, require, save, theme
from analysis.core.tables import finished

SHAPE = ["batch", "heads", "seqlen_q", "seqlen_k", "head_dim"]


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


def prepare(df: pd.DataFrame, experiment: str, several_gpus: bool = False) -> pd.DataFrame:
    """Rows of one experiment (of the table as its reader typed it) with plain integer shapes and the facet
    label (``panel``).

    Raises ``ValueError`` if the table mixes GPUs, unless ``several_gpus`` (the comparison figure):
    every other figure and summary is for one GPU.
    """
    gpus = df["gpu"].dropna().unique()
    if len(gpus) > 1 and not several_gpus:
        raise ValueError(f"figures are drawn for one GPU at a time, got {sorted(map(str, gpus))}")
    d = df[df["experiment"] == experiment].copy()
    # A row without a shape cannot be placed on any axis.
    d = d.dropna(subset=SHAPE)
    for c in SHAPE:
        d[c] = d[c].astype("int64")
    d["panel"] = [panel_label(h, c) for h, c in zip(d["head_dim"], d["causal"], strict=True)]
    return d


def panel_label(head_dim: int, causal: bool) -> str:
    return f"d={head_dim}, {'causal' if causal else 'non-causal'}"


MAX_LISTED = 8  # failed points named one by one in a figure's note; the rest are counted


def failed(d: pd.DataFrame) -> pd.DataFrame:
    """Rows of a ``prepare``d frame that did not finish."""
    return d[d["status"] != "ok"]


def point_label(r) -> str:
    parts = [str(r["impl"])]
    if r.get("experiment") == "decode-serving":
        page = r.get("page_size")
        parts.append(
            f"B={r['batch']} contexts≤{fmt_n(r['seqlen_k'])}" + (f" page={int(page)}" if pd.notna(page) else "")
        )
    elif r.get("experiment") == "decode":
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


def ablation_bars(
    df: pd.DataFrame, out_png, experiment: str, full: str, order: list[str], labels: dict[str, str], heading: str
) -> pd.DataFrame:
    """An ablation's bars (the rows of ``experiment``): forward TFLOP/s of ``full`` and of every other
    implementation of ``order`` present, one panel per (dtype, head dim, mask, N), each bar labelled with its
    change against ``full`` at the same point (column ``change_pct``; ``full_tflops``)."""
    d = prepare(df, experiment)
    ok = finished(d).dropna(subset=["tflops"])
    keys = ["dtype", "head_dim", "causal", "seqlen_q", "batch", "heads"]
    ref = ok[ok["impl"] == full][keys + ["tflops"]].rename(columns={"tflops": "full_tflops"})
    ok = ok.merge(ref, on=keys, how="inner")
    require(ok, f"no ok timed rows of {experiment!r} with {full}")
    ok = ok.assign(change_pct=100 * (ok["tflops"] / ok["full_tflops"] - 1))
    order = [i for i in order if i in set(ok["impl"])]
    panels = ok[keys[:4]].drop_duplicates().sort_values(["head_dim", "causal", "seqlen_q"])
    palette = dict(zip(order, sns.color_palette("colorblind", len(order)), strict=True))
    with theme():
        width = max(3.6, 0.55 * len(order) + 1.2)  # per panel: room for every bar's label
        fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), 3.9), squeeze=False, sharey=True)
        for ax, p in zip(axes[0], panels.itertuples(index=False), strict=True):
            sub = ok[
                (ok["dtype"] == p.dtype)
                & (ok["head_dim"] == p.head_dim)
                & (ok["causal"] == p.causal)
                & (ok["seqlen_q"] == p.seqlen_q)
            ].set_index("impl")
            present = [i for i in order if i in sub.index]
            ax.bar(range(len(present)), sub.loc[present, "tflops"], color=[palette[i] for i in present])
            for x, impl in enumerate(present):
                change = sub.loc[impl, "change_pct"]
                text = f"{sub.loc[impl, 'tflops']:.0f}" + ("" if impl == full else f"\n{change:+.0f}%")
                ax.annotate(
                    text,
                    (x, sub.loc[impl, "tflops"]),
                    textcoords="offset points",
                    xytext=(0, 2),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
            ax.set_xticks(range(len(present)))
            ax.set_xticklabels([labels.get(i, i) for i in present], rotation=40, ha="right", fontsize=7.5)
            ax.set_title(
                f"{p.dtype}, d={p.head_dim}, {'causal' if p.causal else 'non-causal'}, N={fmt_n(p.seqlen_q)}",
                fontsize=9,
            )
            ax.margins(y=0.18)
        axes[0, 0].set_ylabel("forward TFLOP/s")
        fig.suptitle(title(d, heading), fontweight="bold")
        fig.tight_layout()
        save_with_note(fig, out_png, missing_note(failed(d)))
    cols = ID + ["ms_median", "ms_p20", "ms_p80", "tflops", "full_tflops", "change_pct", "kernel_config"]
    return tidy(with_failed(ok, failed(d), cols), extra_sort=["status"])
