"""FlashAttention-3's ablation as the attention-table families name it: the switches of ``kernels/attention/fa3.py``
(``FA3_ABLATIONS``, a test keeps them equal to ``fa3.SCHEDULES``), our FA-3's implementation names, the words
the audit and the summaries use for each switch (``ABLATED``) and the figures' order and labels. Torch-free."""

from __future__ import annotations

# ours-fa3 is the kernel's full schedule; ours-fa3-<name> the same kernel with one technique switched off
FA3_ABLATIONS = ("no-warp-specialize", "no-pingpong", "no-overlap", "no-tma")
FA3 = "ours-fa3"
FA3_IMPLS = (FA3,) + tuple(f"{FA3}-{a}" for a in FA3_ABLATIONS)

# what each switched-off variant lacks, in the words of the verdicts and summary lines
ABLATED = {
    "ours-fa3-no-warp-specialize": "warp specialisation",
    "ours-fa3-no-pingpong": "ping-pong",
    "ours-fa3-no-overlap": "intra-warpgroup overlap",
    "ours-fa3-no-tma": "TMA",
}

# the bars of an ablation figure, in order, and their labels
ABLATION_ORDER = [FA3, "ours-fa3-no-pingpong", "ours-fa3-no-overlap", "ours-fa3-no-tma", "ours-fa3-no-warp-specialize"]
ABLATION_LABELS = {
    FA3: "FA-3 (all on)",
    "ours-fa3-no-pingpong": "no ping-pong",
    "ours-fa3-no-overlap": "no softmax/GEMM overlap",
    "ours-fa3-no-tma": "no TMA (cp.async)",
    "ours-fa3-no-warp-specialize": "no warp specialisation",
    "ours-fa2": "our FA-2 (Triton)",
    "sdpa-cudnn": "SDPA cuDNN",
}
