"""The traffic family's claim evaluators on small fixture tables: the measured halves of the standard
attention byte formula and of FlashAttention's HBM accesses."""

from __future__ import annotations

import pandas as pd
import pytest
from audit_helpers import audit_one, context, measured_row

from analysis import audit, registry

TRAFFIC = registry.table("traffic")


def _traffic_frame(points: list[tuple[str, int, float]], resident: int | None = None) -> pd.DataFrame:
    """Traffic rows: one kernel per (impl, N, total bytes); ``resident``: the N whose tensors fit in L2."""
    rows = []
    for impl, n, total in points:
        row = dict.fromkeys(TRAFFIC.columns, float("nan"))
        row.update(
            experiment="traffic-scaling",
            impl=impl,
            kernel="k",
            kernel_index=0,
            kernel_role="attention",
            dtype="float16",
            batch=1,
            heads=16,
            seqlen=n,
            head_dim=128,
            causal=False,
            dram_read_bytes=0.75 * total,
            dram_write_bytes=0.25 * total,
            l2_resident=(n == resident),
            status="ok",
            message="",
            gpu="h200",
        )
        rows.append(row)
    return pd.DataFrame(rows, columns=TRAFFIC.columns)


def _traffic_ctx(points, resident=None):
    return context({"h200": _traffic_frame(points, resident)}, {"h200": "traffic.csv"}, table="traffic")


@pytest.mark.parametrize(
    "n2_bytes, expected",
    [
        pytest.param(8, "fails", id="per-kernel-8N2"),  # what the three kernels must move
        pytest.param(6, "holds", id="article-6N2"),
    ],
)
def test_std_bytes_formula_measured_part(claims, n2_bytes, expected):
    # 16 heads × (c·N² + 8·N·128) bytes; N=1024 is marked L2-resident and must be ignored
    pts = [("naive", n, 16 * (n2_bytes * n * n + 8 * n * 128)) for n in (2048, 4096, 8192)]
    pts.append(("naive", 1024, 1.0))
    df = audit_one(claims, "std-bytes-formula", _traffic_ctx(pts, resident=1024))
    assert df[df["gpu"] == audit.ANALYTIC]["verdict"].item() == "inconsistent"
    row = measured_row(df)
    assert row["verdict"] == expected
    assert row["observed"].startswith(f"{n2_bytes:.2f}")


@pytest.mark.parametrize(
    "power, expected", [pytest.param(1, "holds", id="linear"), pytest.param(2, "fails", id="quadratic")]
)
def test_fa_hbm_on_measured_part(claims, power, expected):
    pts = [("ours-fa2", n, 16 * 4 * 128 * 2 * n**power / 1024 ** (power - 1)) for n in (2048, 4096, 8192)]
    row = measured_row(audit_one(claims, "fa-hbm-on", _traffic_ctx(pts)))
    assert row["verdict"] == expected
    assert f"N^{power:.2f}" in row["observed"]
