"""The FP8 family: FP8 attention in the FlashAttention-3 manner (``kernels/attention/fp8.py``), its speed and
what it costs in accuracy; its rows go to the attention table."""

from analysis.core.family import Family

FAMILY = Family(
    name="fp8",
    package=__name__,
    title="FP8 attention",
    table="attention",
    sections=(
        ("fp8-speed", "FP8 attention: speed"),
        ("fp8-ablation", "FP8 attention: FA-3 ablation"),
        ("fp8-accuracy", "FP8 attention: accuracy"),
    ),
)
