"""The FP8 family's lines of a GPU's measured summary: the FP8 forward's speed against the 16-bit kernels and
this run's GEMM ceilings, and its accuracy on FlashAttention-3's outlier inputs (from the attention table)."""

from __future__ import annotations

import pandas as pd

from analysis.core.summaries import Line, ok_timed, span

LONG = 4096
OUTLIER_N = 8192


def lines(tables: dict[str, pd.DataFrame]) -> list[Line]:
    df = tables.get("attention")
    out: list[Line] = []
    speed = ok_timed(df, experiment="fp8-speed")
    if len(speed):
        long = speed[speed["seqlen_q"] >= LONG]
        tf = long.pivot_table(index=["causal", "seqlen_q", "head_dim"], columns="impl", values="tflops")
        full = long[long["causal"].astype(str) == "False"]
        for impl, what in (("ours-fp8-tensor", "per tensor"), ("ours-fp8-block", "per block")):
            if impl not in tf:
                continue
            rows = full[full["impl"] == impl]["tflops"]
            ratio = (tf[impl] / tf["ours-fa2"]).dropna() if "ours-fa2" in tf else pd.Series(dtype=float)
            out.append(Line(f"FP8 forward {what}, N ≥ {LONG}: TFLOP/s without a mask; against our bf16 FA-2, "
                            "both masks", f"{span(rows, '.0f', '')} TFLOP/s; {span(ratio)}"))  # fmt: skip
        cudnn = full[full["impl"] == "sdpa-cudnn"]["tflops"]
        if len(cudnn):
            out.append(Line(f"SDPA cuDNN in bf16 on the same points (N ≥ {LONG}, no mask)",
                            f"{span(cudnn, '.0f', '')} TFLOP/s"))  # fmt: skip
        ceil = speed.groupby("impl")["tflops"]
        if {"fp8-mm", "bf16-mm"} <= set(speed["impl"]):
            fp8, bf16 = ceil.get_group("fp8-mm"), ceil.get_group("bf16-mm")
            out.append(Line("this run's GEMM ceilings (8192³): FP8 torch._scaled_mm, and over bf16 torch.matmul",
                            f"{span(fp8, '.0f', '')} TFLOP/s; {fp8.median() / bf16.median():.2f}×"))  # fmt: skip
    acc = df[(df["experiment"] == "fp8-accuracy") & (df["status"] == "ok")] if df is not None else pd.DataFrame()
    acc = acc[(acc["inputs"] == "outliers") & (acc["seqlen_q"] == OUTLIER_N)] if len(acc) else acc
    if len(acc):
        err = acc.groupby("impl")["rms_err"].mean()
        fp16 = acc[(acc["impl"] == "ours-fa2") & (acc["dtype"] == "float16")]["rms_err"].mean()
        named = (("ours-fp8-tensor", "per tensor"), ("ours-fp8-block", "per block"),
                 ("ours-fp8-block-rot", "per block rotated"))
        parts = [f"{what} {err[i]:.1e}" for i, what in named if i in err]
        out.append(Line(f"FP8 RMS error against float64, FlashAttention-3's outlier inputs (N = {OUTLIER_N})",
                        "; ".join(parts) + f"; fp16 FA-2 {fp16:.1e}"))  # fmt: skip
        under = acc.groupby("impl")[["p_underflow", "p_mass_lost"]].mean()
        if {"ours-fp8-block", "ours-fp8-block-p1"} <= set(under.index):
            no, yes = under.loc["ours-fp8-block-p1"], under.loc["ours-fp8-block"]
            text = (f"{100 * no['p_underflow']:.1f}% of entries ({100 * no['p_mass_lost']:.2g}% of the mass); "
                    f"{100 * yes['p_underflow']:.1f}% ({100 * yes['p_mass_lost']:.2g}%)")
            out.append(Line(f"share of P that e4m3 flushes to zero (outliers, N = {OUTLIER_N}): without P's scale, "
                            "with it", text))  # fmt: skip
    return out
