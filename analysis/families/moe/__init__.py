"""The MoE family: routed SwiGLU expert layers and the grouped GEMM (``kernels/moe``), against PyTorch loops,
per-token weight gathering, ``torch._grouped_mm`` and a dense FFN; its rows share the operator table with W4A16."""

from analysis.core.family import Family

FAMILY = Family(
    name="moe",
    package=__name__,
    title="Mixture-of-experts layers",
    table="ops",
    sections=(("moe", "Mixture-of-experts layers"),),
)
