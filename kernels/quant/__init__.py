"""Weight-only quantised linear layers (Triton) and their quantisers.

``kernels.quant.w4a16`` holds the int4 group-wise and int8 per-channel weight formats (``quantize``,
``dequantize``, ``quantize_w8``, ``dequantize_w8``) and the fused dequantise-and-multiply kernels
(``matmul``, ``matmul_w8``) that read the packed weights and never write a 16-bit copy of them.
"""
