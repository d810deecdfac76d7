"""The attention family: FlashAttention-1, -2 and -3, split-KV decoding (contiguous and paged K/V caches) and
variable-length batches (``kernels/attention``), against naive attention and every SDPA backend."""

from analysis.core.family import Family

FAMILY = Family(
    name="attention",
    package=__name__,
    title="Attention: FlashAttention-1, -2, -3, decoding, variable-length batches",
    sections=(
        ("fa2-setting", "FlashAttention-2 setting: throughput per mode"),
        ("fa1-setting", "FlashAttention-1 setting (paper Figure 3)"),
        ("gain-surface", "Where the IO-aware gain grows and vanishes"),
        ("block-sweep", "Block configurations"),
        ("rescale-ablation", "Lazy against eager rescaling"),
        ("memory", "Memory against sequence length"),
        ("decode", "Decoding"),
        ("decode-serving", "Decoding as a server runs it: paged K/V, batches of mixed lengths"),
        ("varlen", "Variable-length batches"),
        ("fa3-ablation", "FlashAttention-3 ablation"),
    ),
    compares=True,
)
