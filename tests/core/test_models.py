"""The analytic models (``analysis.core.models``) against values computed by hand.

Every expected value is a literal with the arithmetic that produced it in a comment; none is re-derived
with the formula under test.
"""

from __future__ import annotations

import pytest

from analysis.core import models

# --- standard attention's HBM traffic -----------------------------------------------------------------


def test_standard_attention_bytes_per_kernel_n4096_d128():
    parts = models.standard_attention_bytes(4096, 128)
    assert set(parts) == {"qk", "softmax", "pv"}
    # qk: read Q, K (2·4096·128 = 1,048,576) + write S (4096² = 16,777,216) = 17,825,792 elements × 2 B
    assert parts["qk"] == 35_651_584
    # softmax: read S + write P = 2·4096² = 33,554,432 elements × 2 B
    assert parts["softmax"] == 67_108_864
    # pv: read P (16,777,216) + read V, write O (2·4096·128 = 1,048,576) = 17,825,792 elements × 2 B
    assert parts["pv"] == 35_651_584


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        # 8N² + 8Nd = 8·16,777,216 + 8·524,288 = 134,217,728 + 4,194,304
        pytest.param({}, 138_412_032, id="n4096-d128-fp16"),
        # ×(2·3) batch·heads = 6 × 138,412,032
        pytest.param({"batch": 2, "heads": 3}, 830_472_192, id="batch2-heads3"),
        # 4-byte elements: 2 × 138,412,032
        pytest.param({"elem_bytes": 4}, 276_824_064, id="fp32"),
    ],
)
def test_standard_attention_total_bytes(kwargs, expected):
    assert models.standard_attention_total_bytes(4096, 128, **kwargs) == expected
    assert sum(models.standard_attention_bytes(4096, 128, **kwargs).values()) == expected


def test_standard_attention_total_small_shape():
    # N=8, d=2: 8·64 + 8·8·2 = 512 + 128 = 640 bytes
    assert models.standard_attention_total_bytes(8, 2) == 640


@pytest.mark.parametrize(
    "args, kwargs, expected",
    [
        # read Q, K, V and write O: 4·4096·128 = 2,097,152 elements × 2 B
        pytest.param((4096, 128), {}, 4_194_304, id="n4096-d128"),
        # × batch·heads = 8
        pytest.param((4096, 128), {"batch": 2, "heads": 4}, 33_554_432, id="batch2-heads4"),
        # 4·1000·64 = 256,000 elements × 4 B
        pytest.param((1000, 64), {"elem_bytes": 4}, 1_024_000, id="n1000-d64-fp32"),
    ],
)
def test_minimum_attention_bytes(args, kwargs, expected):
    assert models.minimum_attention_bytes(*args, **kwargs) == expected


@pytest.mark.parametrize(
    "args, kwargs, expected",
    [
        # 8192² = 67,108,864 elements × 2 B
        pytest.param((8192,), {}, 134_217_728, id="n8192"),
        # 131072² = 17,179,869,184 elements × 2 B
        pytest.param((131072,), {}, 34_359_738_368, id="n131072"),
        # 8192² × 4 B × (2·32) = 67,108,864 · 256
        pytest.param((8192,), {"batch": 2, "heads": 32, "elem_bytes": 4}, 17_179_869_184, id="n8192-b2-h32-fp32"),
    ],
)
def test_score_matrix_bytes(args, kwargs, expected):
    assert models.score_matrix_bytes(*args, **kwargs) == expected


# --- FlashAttention-1 blocks and traffic ----------------------------------------------------------------


@pytest.mark.parametrize(
    "m, d, expected",
    [
        # Bc = ⌈82000/256⌉ = ⌈320.3125⌉ = 321; Br = min(321, 64) = 64
        pytest.param(82000, 64, (64, 321), id="a100-m82000-d64"),
        # Bc = 51200/512 = 100 exactly; Br = min(100, 128) = 100
        pytest.param(51200, 128, (100, 100), id="m51200-d128"),
        # Bc = 65536/256 = 256 exactly (no rounding up); Br = min(256, 64) = 64
        pytest.param(65536, 64, (64, 256), id="exact-division"),
        # Bc = ⌈100000/256⌉ = ⌈390.625⌉ = 391; Br = 64
        pytest.param(100000, 64, (64, 391), id="rounds-up"),
        # Bc = 1024/512 = 2; Br = min(2, 128) = 2 (small M: Br follows Bc)
        pytest.param(1024, 128, (2, 2), id="small-m"),
    ],
)
def test_fa1_block_sizes(m, d, expected):
    assert models.fa1_block_sizes(m, d) == expected


def test_fa1_forward_bytes_q_only_accounting():
    p = models.fa1_forward_bytes(8192, 128, 51200, full=False)
    # Bc = 100, Tc = ⌈8192/100⌉ = ⌈81.92⌉ = 82
    assert p["tc"] == 82
    # K and V once: 2·8192·128 = 2,097,152 elements × 2 B
    assert p["kv"] == 4_194_304
    # Q re-read once per outer iteration: 82·8192·128·2
    assert p["q_rereads"] == 171_966_464
    assert p["o_read_write"] == 0
    assert p["stats"] == 0
    # O written once: 8192·128·2
    assert p["o_final"] == 2_097_152
    # kv + q + o_final = 4,194,304 + 171,966,464 + 2,097,152
    assert p["total"] == 178_257_920


def test_fa1_forward_bytes_full_algorithm_1():
    p = models.fa1_forward_bytes(8192, 128, 51200)  # full=True is the default
    assert p["tc"] == 82
    assert p["kv"] == 4_194_304
    assert p["q_rereads"] == 171_966_464
    # O read and written per outer iteration: 82·2·8192·128·2
    assert p["o_read_write"] == 343_932_928
    # ℓ and m read and written per outer iteration: 82·4·8192 values × 4 B
    assert p["stats"] == 10_747_904
    assert p["o_final"] == 0
    # 4,194,304 + 171,966,464 + 343,932,928 + 10,747,904
    assert p["total"] == 530_841_600


def test_fa1_forward_bytes_scales_with_batch_heads():
    # 2·2 = 4 × 530,841,600; Tc does not depend on batch·heads
    p = models.fa1_forward_bytes(8192, 128, 51200, batch=2, heads=2)
    assert p["total"] == 2_123_366_400
    assert p["tc"] == 82


def test_fa1_forward_bytes_a100_d64_n16384():
    p = models.fa1_forward_bytes(16384, 64, 82000)
    # Bc = 321, Tc = ⌈16384/321⌉ = 52 (321·51 = 16,371 < 16,384)
    assert p["tc"] == 52
    # kv 2·2·16384·64 = 4,194,304; q 52·16384·64·2 = 109,051,904; o 2 × q = 218,103,808;
    # stats 52·4·16384·4 = 13,631,488; total 344,981,504
    assert p["total"] == 344_981_504


@pytest.mark.parametrize(
    "args, kwargs, expected",
    [
        # Tr = 4096/128 = 32: 2·(2·4096·128 + 2·4096·128·32) + 4·4096
        #   = 2·(1,048,576 + 33,554,432) + 16,384 = 69,206,016 + 16,384
        pytest.param((4096, 128, 128), {}, 69_222_400, id="n4096-d128-bm128"),
        # cached K/V: Tr = 1: 2·(1,048,576 + 1,048,576) + 16,384 = 4,194,304 + 16,384
        pytest.param((4096, 128, 128), {"cached_kv": True}, 4_210_688, id="n4096-d128-cached"),
        # Tr = ⌈1000/128⌉ = 8: 2·(2·1000·64 + 2·1000·64·8) + 4·1000 = 2·(128,000 + 1,024,000) + 4,000
        pytest.param((1000, 64, 128), {}, 2_308_000, id="n1000-ragged"),
        # batch·heads = 6 × 69,222,400
        pytest.param((4096, 128, 128), {"batch": 2, "heads": 3}, 415_334_400, id="batch2-heads3"),
    ],
)
def test_fa2_forward_bytes(args, kwargs, expected):
    assert models.fa2_forward_bytes(*args, **kwargs) == expected


# --- causal tiling -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "t, expected",
    [
        pytest.param(1, 1.0, id="one-tile"),
        # 3 of 4 tiles (2 diagonal + 1 below)
        pytest.param(2, 0.75, id="two"),
        # 32·33/2 = 528 of 1024 tiles = 33/64
        pytest.param(32, 33 / 64, id="thirty-two"),
        # 128·129/2 = 8,256 of 16,384 tiles = 0.50390625
        pytest.param(128, 0.50390625, id="one-hundred-twenty-eight"),
    ],
)
def test_causal_block_fraction(t, expected):
    assert models.causal_block_fraction(t) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("t", [pytest.param(0, id="zero"), pytest.param(-3, id="negative")])
def test_causal_block_fraction_rejects_no_tiles(t):
    with pytest.raises(ValueError):
        models.causal_block_fraction(t)


# --- FLOPs ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "causal, recompute, expected",
    [
        # forward 4·1024²·64 = 268,435,456; recomputing: × 2.5
        pytest.param(False, True, 671_088_640, id="recompute-2.5x"),
        # stored P: × 2
        pytest.param(False, False, 536_870_912, id="stored-p-2x"),
        # causal forward 134,217,728; × 2.5
        pytest.param(True, True, 335_544_320, id="causal-recompute"),
        # causal: × 2
        pytest.param(True, False, 268_435_456, id="causal-stored-p"),
    ],
)
def test_backward_flops(causal, recompute, expected):
    assert models.backward_flops(1, 1, 1024, 64, causal=causal, recompute=recompute) == expected


def test_backward_flops_default_recomputes():
    assert models.backward_flops(1, 1, 1024, 64) == 671_088_640


def test_recompute_extra_flops_shares():
    r = models.recompute_extra_flops(1, 1, 4096, 64)
    # one N×N×d product: 2·4096²·64 = 2·16,777,216·64
    assert r["extra_flops"] == 2_147_483_648
    # 2N²d over the recomputing backward (5 products, 10N²d) = 2/10
    assert r["share_of_backward"] == pytest.approx(0.2, rel=1e-12)
    # 2N²d over forward (4N²d) + backward without recomputation (8N²d) = 2/12 = 1/6 ≈ 16.7%
    assert r["increase_over_training_step"] == pytest.approx(1 / 6, rel=1e-12)
    assert round(100 * r["increase_over_training_step"], 1) == 16.7
    # 2N²d over forward (4N²d) + recomputing backward (10N²d) = 2/14 ≈ 14.3%
    assert r["share_of_training_step"] == pytest.approx(2 / 14, rel=1e-12)
    assert round(100 * r["share_of_training_step"], 1) == 14.3


def test_recompute_extra_flops_causal_halves_the_extra_but_not_the_shares():
    r = models.recompute_extra_flops(2, 4, 4096, 64, causal=True)
    # 2_147_483_648 × (2·4) batch·heads / 2 causal
    assert r["extra_flops"] == 8_589_934_592
    assert r["increase_over_training_step"] == pytest.approx(1 / 6, rel=1e-12)
    assert r["share_of_training_step"] == pytest.approx(1 / 7, rel=1e-12)


def test_attention_flops_is_reexported():
    # 4·1024²·64
    assert models.attention_flops(1, 1, 1024, 1024, 64) == 268_435_456


# --- roofline ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flops, bytes_moved, expected",
    [
        pytest.param(100.0, 4.0, 25.0, id="simple"),
        # 4·4096²·128 = 8,589,934,592 FLOP over 138,412,032 B = 2,097,152 / 33,792 = 2048/33
        pytest.param(8_589_934_592, 138_412_032, 2048 / 33, id="standard-n4096-d128"),
    ],
)
def test_arithmetic_intensity(flops, bytes_moved, expected):
    assert models.arithmetic_intensity(flops, bytes_moved) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "peak, bw, expected",
    [
        # 312 / 2.039 = 153.0162…
        pytest.param(312, 2.039, 153.0162, id="a100"),
        # 989.4 / 4.8 = 206.125
        pytest.param(989.4, 4.8, 206.125, id="h200"),
    ],
)
def test_ridge_point(peak, bw, expected):
    assert models.ridge_point(peak, bw) == pytest.approx(expected, abs=1e-4)


def test_ridge_point_a100_rounds_to_153():
    assert round(models.ridge_point(312, 2.039), 1) == 153.0


@pytest.mark.parametrize(
    "intensity, ridge, expected",
    [
        pytest.param(50.0, 100.0, 0.5, id="memory-bound"),
        pytest.param(100.0, 100.0, 1.0, id="at-ridge"),
        pytest.param(200.0, 100.0, 1.0, id="capped-at-one"),
        pytest.param(0.0, 153.0, 0.0, id="zero"),
        # 64 FLOP/B (d/2 at d=128) under the A100 knee 153: 64/153
        pytest.param(64.0, 153.0, 0.41830065, id="standard-limit-a100"),
    ],
)
def test_attainable_fraction(intensity, ridge, expected):
    assert models.attainable_fraction(intensity, ridge) == pytest.approx(expected, abs=1e-8)


def test_formula_attention_bytes_hand_computed():
    # S1 §1.2's 6N² + 8Nd at N=4096, d=128: 100,663,296 + 4,194,304 bytes
    assert models.formula_attention_bytes(4096, 128, 6) == 104_857_600
    # with c = 8 it is the per-kernel count of standard_attention_bytes
    assert models.formula_attention_bytes(4096, 128, 8) == models.standard_attention_total_bytes(4096, 128)
    # fp32 elements, B=2, H=3: twice the fp16 bytes, six times one head
    assert models.formula_attention_bytes(64, 16, 6, batch=2, heads=3, elem_bytes=4) == 2 * 6 * (
        6 * 64 * 64 + 8 * 64 * 16
    )


def test_decode_batch_bytes_by_hand():
    """Two requests of 100 and 0 keys, 8 query heads on 2 K/V heads, 1 new token, d = 4, fp16, pages of 16."""
    qo = 2 * 2 * 8 * 1 * 4 * 2  # Q read and O written for both requests
    kv = 2 * 2 * 4 * 2 * 100  # K and V of 100 keys, once per K/V head
    table = 4 * 7  # ceil(100 / 16) block-table entries
    assert models.decode_batch_bytes([100, 0], 8, 2, 1, 4, 2, page_size=16) == qo + kv + table
    assert models.decode_batch_bytes([100, 0], 8, 2, 1, 4, 2) == qo + kv  # contiguous: no table
    one = models.decode_batch_bytes([4096], 16, 16, 1, 128)
    assert one == models.attention_io_bytes(1, 16, 16, 1, 4096, 128)


def test_decode_gather_and_flops_by_hand():
    assert models.decode_gather_bytes([10, 30], 2, 8, 2) == 2 * 2 * 8 * 2 * (40 + 2 * 30)
    assert models.decode_gather_bytes([10, 30], 2, 8, 2, length=64) == 2 * 2 * 8 * 2 * (40 + 2 * 64)
    assert models.decode_batch_flops([100, 28], 8, 2, 64) == 4 * 8 * 2 * 64 * 128
    assert models.decode_batch_flops([4096], 16, 1, 128) == models.attention_flops(1, 16, 1, 4096, 128)
