"""The W4A16 family: weight-only quantised linear layers (``kernels/w4a16``: int4 group-wise and int8
per-channel weights dequantised in registers), against cuBLAS, the unfused path and PyTorch's int4 kernel."""

from analysis.core.family import Family

FAMILY = Family(
    name="w4a16",
    package=__name__,
    title="W4A16 / W8A16 linear layers",
    table="ops",
    sections=(("w4a16", "W4A16 / W8A16 linear layers"),),
)
