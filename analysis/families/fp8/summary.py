"""The FP8 family's lines of a GPU's measured summary that have no target: the FP8 forward's speed against the
16-bit kernels and this run's GEMM ceilings, where the end-to-end call's time goes, and its accuracy on
FlashAttention-3's outlier inputs (from the attention table; the lines with a target are the family's targets,
``claims.yaml``)."""

from __future__ import annotations

import pandas as pd

from analysis.audit import Claim
from analysis.core.summaries import Line, span
from analysis.core.tables import finished
from analysis.families._shared.fa3_ablation import ABLATED

LONG = 4096
OUTLIER_N = 8192
OURS_BF16 = ("ours-fa3", "ours-fa2")  # our bf16 kernels, the fastest of which the end-to-end target is against


def lines(tables: dict[str, pd.DataFrame], targets: dict[str, Claim]) -> list[Line]:
    """The lines without a target (those with one are the family's ``targets``, by id: ``claims.yaml``)."""
    df = tables.get("attention")
    out: list[Line] = []
    speed = finished(df, experiment="fp8-speed")
    if len(speed):
        long = speed[speed["seqlen_q"] >= LONG]
        tf = long.pivot_table(index=["causal", "seqlen_q", "head_dim"], columns="impl", values="tflops")
        full = long[~long["causal"]]
        for impl, what in (("ours-fp8-tensor", "per tensor"), ("ours-fp8-block", "per block")):
            if impl not in tf:
                continue
            rows = full[full["impl"] == impl]["tflops"]
            ratio = (tf[impl] / tf["ours-fa2"]).dropna() if "ours-fa2" in tf else pd.Series(dtype=float)
            out.append(
                Line(
                    f"FP8 forward {what}, N ≥ {LONG}: TFLOP/s without a mask; against our bf16 FA-2, both masks",
                    f"{span(rows, '.0f', '')} TFLOP/s; {span(ratio)}",
                )
            )
        cudnn = full[full["impl"] == "sdpa-cudnn"]["tflops"]
        if len(cudnn):
            out.append(
                Line(
                    f"SDPA cuDNN in bf16 on the same points (N ≥ {LONG}, no mask)", f"{span(cudnn, '.0f', '')} TFLOP/s"
                )
            )
        ours = [i for i in OURS_BF16 if i in set(speed["impl"])]
        if ours:
            out += _e2e_time(speed, ours, targets["fp8-end-to-end"].asserted["at_least"])
        ceil = speed.groupby("impl")["tflops"]
        if {"fp8-mm", "bf16-mm"} <= set(speed["impl"]):
            fp8, bf16 = ceil.get_group("fp8-mm"), ceil.get_group("bf16-mm")
            out.append(
                Line(
                    "this run's GEMM ceilings (8192³): FP8 torch._scaled_mm, and over bf16 torch.matmul",
                    f"{span(fp8, '.0f', '')} TFLOP/s; {fp8.median() / bf16.median():.2f}×",
                )
            )
    abl = finished(df, experiment="fp8-ablation")
    if len(abl):
        out += _ablation(abl)
    acc = df[(df["experiment"] == "fp8-accuracy") & (df["status"] == "ok")] if df is not None else pd.DataFrame()
    acc = acc[(acc["inputs"] == "outliers") & (acc["seqlen_q"] == OUTLIER_N)] if len(acc) else acc
    if len(acc):
        err = acc.groupby("impl")["rms_err"].mean()
        fp16 = acc[(acc["impl"] == "ours-fa2") & (acc["dtype"] == "float16")]["rms_err"].mean()
        named = (
            ("ours-fp8-tensor", "per tensor"),
            ("ours-fp8-block", "per block"),
            ("ours-fp8-block-rot", "per block rotated"),
        )
        parts = [f"{what} {err[i]:.1e}" for i, what in named if i in err]
        out.append(
            Line(
                f"FP8 RMS error against float64, FlashAttention-3's outlier inputs (N = {OUTLIER_N})",
                "; ".join(parts) + f"; fp16 FA-2 {fp16:.1e}",
            )
        )
        under = acc.groupby("impl")[["p_underflow", "p_mass_lost"]].mean()
        if {"ours-fp8-block", "ours-fp8-block-p1"} <= set(under.index):
            no, yes = under.loc["ours-fp8-block-p1"], under.loc["ours-fp8-block"]
            text = (
                f"{100 * no['p_underflow']:.1f}% of entries ({100 * no['p_mass_lost']:.2g}% of the mass); "
                f"{100 * yes['p_underflow']:.1f}% ({100 * yes['p_mass_lost']:.2g}%)"
            )
            out.append(
                Line(
                    f"share of P that e4m3 flushes to zero (outliers, N = {OUTLIER_N}): without P's scale, with it",
                    text,
                )
            )
    return out


def _e2e_time(speed: pd.DataFrame, ours: list[str], target: float) -> list[Line]:
    """Where the end-to-end call's time goes, from the rows: the quantiser (the -e2e row less the kernel's,
    same point), and the kernel alone against the time the end-to-end target leaves it."""
    long = speed[(speed["head_dim"] == 128) & (speed["seqlen_q"] >= LONG)]
    ms = long.pivot_table(index=["causal", "seqlen_q"], columns="impl", values="ms_median")
    if not {"ours-fp8-block", "ours-fp8-block-e2e"} <= set(ms.columns):
        return []
    e2e, kernel = ms["ours-fp8-block-e2e"], ms["ours-fp8-block"]
    quant = (e2e - kernel).dropna()
    allowed = ms[ours].min(axis=1) / target  # the end-to-end time that meets the target
    return [
        Line(
            f"FP8 end to end, where the time goes (per block; d = 128, N ≥ {LONG}, both masks): the quantiser "
            "(the -e2e row less the kernel's) and its share of the call; the kernel alone against the time "
            f"the {target:g}× target allows the whole call",
            f"{span(quant * 1000, '.0f', ' µs')}, {span(100 * quant / e2e, '.0f', '%')}; {span(kernel / allowed)}",
        )
    ]


def _ablation(abl: pd.DataFrame) -> list[Line]:
    """What each of FA-3's techniques buys the FP8 kernel: the change when it is switched off from the full
    schedule (``ours-fp8-block-fa3``)."""
    full = abl[abl["impl"] == "ours-fp8-block-fa3"].set_index(["head_dim", "causal", "seqlen_q"])["tflops"]
    parts = []
    for bf16_name, what in ABLATED.items():
        switch = bf16_name.removeprefix("ours-fa3-")
        off = abl[abl["impl"] == f"ours-fp8-block-{switch}"].set_index(["head_dim", "causal", "seqlen_q"])["tflops"]
        change = (100 * (off / full - 1)).dropna()
        if len(change):
            parts.append(f"{what} {span(change, '+.1f', '%')}")
    if not parts:
        return []
    return [
        Line(
            "FP8 FA-3 ablation (inputs quantised): change when one technique is switched off from FA-3's full "
            "schedule (FP8's default runs without ping-pong)",
            "; ".join(parts),
        )
    ]
