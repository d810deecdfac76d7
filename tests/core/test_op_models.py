"""The FLOP and byte models of the operator families (hand-computed)."""

from __future__ import annotations

import pytest

from analysis.core import models
from analysis.core.flops import gemm_flops, moe_ffn_flops


def test_gemm_and_moe_flops():
    assert gemm_flops(3, 5, 7) == 210
    # 2 tokens × top-2 = 4 rows; gate and up 2·4·8·6 each, down 2·4·6·8: 3 × 384
    assert moe_ffn_flops(2, 2, 8, 6) == 1152
    assert moe_ffn_flops(2, 1, 8, 12) == moe_ffn_flops(2, 2, 8, 6)  # the dense FFN of equal active FLOPs


def test_weight_byte_models():
    # 16 × 256 int4: 2048 B of codes; 2 groups of 128 per row, fp16 scale + uint8 zero: 16 × 2 × 3 = 96 B
    assert models.int4_weight_bytes(16, 256, 128, scale_bytes=2, zero_bytes=1) == 2144
    assert models.int4_weight_bytes(16, 256, 128, scale_bytes=2, zero_bytes=0) == 2112
    assert models.int4pack_weight_bytes(16, 256, 128) == 2048 + 16 * 2 * 4
    assert models.int8_weight_bytes(16, 256, scale_bytes=4) == 4096 + 64
    assert models.dense_weight_bytes(16, 256) == 8192
    assert models.unfused_dequant_bytes(16, 256, 2144) == 2144 + 2 * 8192
    assert models.moe_expert_weight_bytes(3, 8, 6) == 3 * 3 * 48 * 2
    assert models.gather_moe_bytes(2, 2, 8, 6) == 2 * 4 * 3 * 48 * 2
    with pytest.raises(ValueError, match="multiple of group_size"):
        models.int4_weight_bytes(16, 100, 32, 2)
    # 4096 × 14336 bf16 against int4 with float32 scales, uint8 zeros, group 128: 3.71× fewer bytes
    ratio = models.dense_weight_bytes(14336, 4096) / models.int4_weight_bytes(14336, 4096, 128, 4, 1)
    assert ratio == pytest.approx(2 / (0.5 + 5 / 128))
