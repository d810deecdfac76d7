"""Weight-only quantised linear layers (W4A16, W8A16) in Triton, their formats and their reference.

``quantize`` / ``quantize_w8`` make the int4 group-wise and int8 per-channel weights (``formats``);
``matmul`` / ``matmul_w8`` multiply by them with the weight dequantised in registers (``w4a16``: the public
calls; ``plans``: the launch plans kept per weight; ``w4a16_kernels``: the default path's jit kernels,
``tc_kernels`` and ``streamk_kernels`` the candidate paths'; ``w4a16_config``: the configurations and the
unadopted path heuristic ``choose_path``); ``reference`` is the float64 product tests and benchmarks compare
with.
"""

from kernels.w4a16.formats import (
    GROUP_SIZES,
    W4Weight,
    W8Weight,
    dequantize,
    dequantize_w8,
    pack_codes,
    quantize,
    quantize_w8,
    unpack_codes,
    unpack_to_memory,
)
from kernels.w4a16.w4a16 import matmul, matmul_w8
from kernels.w4a16.w4a16_config import PATHS, SMALL_M, W4A16Config, choose_config, choose_path

__all__ = [
    "GROUP_SIZES",
    "PATHS",
    "SMALL_M",
    "W4A16Config",
    "W4Weight",
    "W8Weight",
    "choose_config",
    "choose_path",
    "dequantize",
    "dequantize_w8",
    "matmul",
    "matmul_w8",
    "pack_codes",
    "quantize",
    "quantize_w8",
    "unpack_codes",
    "unpack_to_memory",
]
