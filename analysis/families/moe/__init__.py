"""The MoE family: routed SwiGLU expert layers and the grouped GEMM (``kernels/moe``), against PyTorch loops,
per-token weight gathering, ``torch._grouped_mm`` and a dense FFN; its rows share the operator table with W4A16."""

from analysis.core.family import Family
from analysis.families.moe import plan

FAMILY = Family(
    name="moe",
    plan=plan,
    title="Mixture-of-experts layers",
    table="ops",
    sections=(("moe", "Mixture-of-experts layers"),),
)
