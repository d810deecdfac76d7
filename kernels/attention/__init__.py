"""Attention kernels (Triton) and their references.

``kernels.attention.fa2.attention`` is the FlashAttention-2 forward; ``kernels.attention.reference`` holds
the naive, SDPA and float64 implementations that tests and benchmarks compare it with.
"""
