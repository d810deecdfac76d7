"""The attention family's lines of a GPU's measured summary: its kernels against SDPA's backends and their
performance targets, computed from the attention table (``analysis.summary`` writes them)."""

from __future__ import annotations

import pandas as pd

from analysis.core.summaries import Line, kilo, met, span
from analysis.core.tables import finished

LONG = 4096  # "N ≥ 4096": where the targets are judged
DECODE_LONG = 32768  # "K/V ≥ 32K"


def _ratios(rows: pd.DataFrame, ours: str, other: str, keys: list[str]) -> pd.Series:
    """ours / other TFLOP/s at every point both finished."""
    wide = rows.pivot_table(index=keys, columns="impl", values="tflops")
    if ours not in wide or other not in wide:
        return pd.Series(dtype=float)
    return (wide[ours] / wide[other]).dropna()


def lines(tables: dict[str, pd.DataFrame]) -> list[Line]:
    df = tables.get("attention")
    out: list[Line] = []
    keys = ["dtype", "causal", "seqlen_q"]
    fwd = finished(df, experiment="fa2-setting", mode="fwd", head_dim=128)
    fwd = fwd[fwd["seqlen_q"] >= LONG] if len(fwd) else fwd
    where = f"FA-2 setting, d = 128, N ≥ {LONG}, fp16 and bf16"
    if len(fwd):
        r = _ratios(fwd, "ours-fa2", "sdpa-cudnn", keys)
        ours = fwd[fwd["impl"] == "ours-fa2"]["tflops"]
        cudnn = fwd[fwd["impl"] == "sdpa-cudnn"]["tflops"]
        tf = f" ({span(ours, '.0f', '')} TFLOP/s against {span(cudnn, '.0f', '')})"
        out.append(Line(f"FA-2 forward vs SDPA cuDNN ({where})", span(r) + tf, "≥ 0.95×", met(r >= 0.95)))
        r = _ratios(fwd, "ours-fa2", "sdpa-flash", keys)
        out.append(Line(f"FA-2 forward vs SDPA flash (FA-2; {where})", span(r)))
        r = _ratios(fwd, "ours-fa3", "sdpa-cudnn", keys)
        if len(r):
            out.append(Line(f"FA-3 forward vs SDPA cuDNN ({where})", span(r)))
    bwd = finished(df, experiment="fa2-setting", mode="bwd", head_dim=128)
    bwd = bwd[bwd["seqlen_q"] >= LONG] if len(bwd) else bwd
    if len(bwd):
        for causal in (False, True):
            r = _ratios(bwd[bwd["causal"] == causal], "ours-fa2", "sdpa-flash", keys)
            mask = "causal" if causal else "non-causal"
            out.append(
                Line(f"FA-2 backward vs SDPA flash, {mask} (d = 128, N ≥ {LONG})", span(r), "≥ 1.2×", met(r >= 1.2))
            )
        r = _ratios(bwd, "ours-fa2", "sdpa-cudnn", keys)
        out.append(Line(f"FA-2 backward vs SDPA cuDNN (d = 128, N ≥ {LONG})", span(r), "≥ 1×", met(r >= 1.0)))
    out += _decode(df)
    mem = finished(df, experiment="memory", mode="fwd+bwd", seqlen_q=32768)
    if len(mem):
        peak = mem.groupby("impl")["peak_mem_mib"].max()
        if "ours-fa2" in peak:
            sdpa = [peak[i] for i in ("sdpa-flash", "sdpa-cudnn") if i in peak]
            text = (
                f"{peak['ours-fa2']:.0f} MiB (SDPA flash {peak.get('sdpa-flash', float('nan')):.0f}, cuDNN "
                f"{peak.get('sdpa-cudnn', float('nan')):.0f})"
            )
            out.append(
                Line(
                    "extra peak memory of forward + backward, B = 1, H = 16, N = 32K",
                    text,
                    "≤ 1.1× SDPA",
                    met([peak["ours-fa2"] <= 1.1 * min(sdpa)]) if sdpa else "",
                )
            )
    return out


def _decode(df: pd.DataFrame | None) -> list[Line]:
    dec = finished(df, experiment="decode", heads_kv=16, seqlen_q=1)
    if not len(dec):
        return []
    ms = dec.pivot_table(index="seqlen_k", columns="impl", values="ms_median")
    gbps = dec.pivot_table(index="seqlen_k", columns="impl", values="gbps")
    long = [n for n in ms.index if n >= DECODE_LONG]
    out = []
    if {"ours-decode", "ours-decode-unsplit"} <= set(ms.columns):
        speed = {n: ms.loc[n, "ours-decode-unsplit"] / ms.loc[n, "ours-decode"] for n in long}
        text = ", ".join(f"{v:.1f}× at {kilo(n)}" for n, v in speed.items())
        out.append(
            Line(
                f"split-KV decoding vs our unsplit kernel (B = 1, 16 heads, K/V ≥ {kilo(DECODE_LONG)})",
                text,
                "≥ 5×",
                met(v >= 5 for v in speed.values()),
            )
        )
    if {"ours-decode", "copy-kv"} <= set(gbps.columns):
        share = {n: gbps.loc[n, "ours-decode"] / gbps.loc[n, "copy-kv"] for n in long}
        text = ", ".join(f"{100 * v:.0f}% at {kilo(n)}" for n, v in share.items())
        out.append(
            Line(
                "decoding bandwidth / measured copy bandwidth (same K/V)",
                text,
                "≥ 60%",
                met(v >= 0.6 for v in share.values()),
            )
        )
    return out
