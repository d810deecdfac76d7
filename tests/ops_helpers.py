"""Synthetic rows of the operator table (W4A16 and MoE points), shared by the two families' tests."""

from __future__ import annotations

import pandas as pd
from audit_helpers import all_claims, judge

from analysis import registry
from analysis.audit import Context, Results

OPS = registry.table("ops")

PROV = dict(
    gpu_name="NVIDIA H200",
    gpu="h200",
    driver="1",
    cuda="13",
    torch="2",
    triton="3",
    python="3",
    git_sha="abc",
    timestamp="t",
    kernel_config="",
)


COPY_GBPS = {128: 4000.0, 64: 2000.0}  # per group size: the copy rows must be told apart


def quant_rows(w4_ms=0.03, dequant_ms=0.4, linear_ms=0.10, group_sizes=(128,)):
    rows = []
    for model, (k, n) in {"llama3-8b-up": (4096, 14336), "llama3-70b-up": (8192, 28672)}.items():
        for g in group_sizes:
            for m in (1, 16, 4096):
                for impl, ms, mb in (
                    ("torch-linear", linear_ms, n * k * 2.0),
                    ("ours-w4a16", w4_ms, n * k * 0.539),
                    ("dequant-linear", dequant_ms, n * k * 4.5),
                ):
                    t = ms * (1 + m / 64)
                    rows.append(
                        dict(
                            experiment="w4a16",
                            family="w4a16",
                            op="linear",
                            impl=impl,
                            dtype="bfloat16",
                            model=model,
                            m=m,
                            n=n,
                            k=k,
                            group_size=g,
                            stage="total",
                            status="ok",
                            message="",
                            timed=True,
                            ms_median=t,
                            model_bytes=mb,
                            gbps=mb / t / 1e6,
                            **PROV,
                        )
                    )
            rows.append(
                dict(
                    experiment="w4a16",
                    family="w4a16",
                    op="linear",
                    impl="copy-weight",
                    dtype="bfloat16",
                    model=model,
                    n=n,
                    k=k,
                    group_size=g,
                    stage="total",
                    status="ok",
                    message="",
                    timed=True,
                    ms_median=0.01,
                    gbps=COPY_GBPS[g],
                    **PROV,
                )
            )
    return rows


def moe_rows(gemm_ms=0.3, gather_ms=5.0):
    rows = []
    for t in (256, 4096):
        base = dict(
            experiment="moe",
            family="moe",
            dtype="bfloat16",
            model="deepseek",
            m=6 * t,
            n=1408,
            k=2048,
            experts=64,
            top_k=6,
            tokens=t,
            routing="uniform",
            status="ok",
            message="",
            timed=True,
            **PROV,
        )
        for stage, ms in dict(routing=0.02, dispatch=0.05, gemm=gemm_ms, combine=0.03).items():
            rows.append(dict(base, op="moe-layer", impl="ours-moe", stage=stage, ms_median=ms))
        for impl, ms in {"ours-moe": 0.4, "loop-moe": 3.0, "gather-moe": gather_ms, "dense-ffn": 0.2}.items():
            if impl == "gather-moe" and t == 4096:
                rows.append(dict(base, op="moe-layer", impl=impl, stage="total", status="unsupported", message="cap"))
                continue
            rows.append(dict(base, op="moe-layer", impl=impl, stage="total", ms_median=ms, tflops=10.0))
        for impl, tf in {"ours-grouped": 300, "torch-grouped-mm": 280, "loop-grouped": 50}.items():
            rows.append(dict(base, op="grouped-gemm", impl=impl, stage="total", ms_median=0.1, tflops=tf))
    return rows


def table(rows, tmp_path) -> pd.DataFrame:
    path = tmp_path / "ops.csv"
    OPS.write_rows(rows, path)
    return OPS.read_rows([path])


def verdict(claim_id: str, rows, tmp_path) -> pd.Series:
    """The verdict of one claim on a context holding ``rows`` as H200's operator table (none: no table)."""
    ctx = Context()
    if rows is not None:
        ctx.tables["ops"] = Results({"h200": table(rows, tmp_path)}, {"h200": "ops.csv"})
    return judge([all_claims()[claim_id]], ctx).iloc[0]
