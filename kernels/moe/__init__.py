"""Mixture-of-experts kernels (Triton) and their references.

``grouped_gemm`` multiplies contiguous per-expert row segments by per-expert matrices in one launch
(torch._grouped_mm's conventions; ``grouped_kernels``: its kernels, the default and a persistent candidate);
``moe_ffn`` is a routed SwiGLU expert layer built on it. ``routing``
holds the router and the device-side dispatch/combine; ``reference`` the plain-PyTorch loops that tests
and benchmarks compare with.
"""

from kernels.moe.ffn import moe_ffn
from kernels.moe.grouped_gemm import grouped_gemm

__all__ = ["grouped_gemm", "moe_ffn"]
