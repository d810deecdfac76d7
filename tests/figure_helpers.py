"""Helpers of the figure tests: synthetic attention-table rows, a family's figures rendered from a frame, and
what a drawn PNG looks like."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis import registry
from analysis.core import plotting
from analysis.core.flops import attention_flops

ATTENTION = registry.table("attention")


def attention_row(experiment, impl, n, d=128, b=1, h=16, mode="fwd", causal=False, ms=1.0, status="ok", **kw) -> dict:
    """One row of the attention table; a finished one is timed at ``ms`` (its TFLOP/s from the FLOP model)."""
    row = dict.fromkeys(ATTENTION.columns, float("nan"))
    nk = kw.pop("nk", n)
    flops = attention_flops(b, h, n, nk, d, causal, mode)
    row.update(
        experiment=experiment,
        family="attention",
        op="attention",
        impl=impl,
        dtype=kw.pop("dtype", "float16"),
        mode=mode,
        batch=b,
        heads=h,
        heads_kv=kw.pop("hk", h),
        seqlen_q=n,
        seqlen_k=nk,
        head_dim=d,
        causal=causal,
        status=status,
        message="" if status == "ok" else f"{status}: synthetic",
        timed=True,
        gpu="h200",
        gpu_name="NVIDIA H200",
        kernel_config=kw.pop("kernel_config", ""),
    )
    if status == "ok":
        row.update(ms_median=ms, ms_p20=0.95 * ms, ms_p80=1.1 * ms, tflops=flops / (ms * 1e-3) / 1e12)
    row.update(kw)
    return row


def render(family: str, df: pd.DataFrame, out_dir) -> list[dict]:
    """Every figure of ``family`` drawn from ``df`` into ``out_dir``, as the pipeline's figures step does."""
    fam = registry.family(family)
    return plotting.render_all(df, out_dir, fam.figures(), fam.caption)


def is_png(path) -> bool:
    data = Path(path).read_bytes()
    return len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"
