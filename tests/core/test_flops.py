"""The FLOP model (``analysis.core.flops``) against values computed by hand."""

from __future__ import annotations

import pytest

from analysis.core.flops import BACKWARD_FACTOR, MODES, attention_flops, tflops

# 4 · B · H · Nq · Nk · d for B = H = 1, N = 1024, d = 64
FWD_1024_64 = 4 * 1024 * 1024 * 64


def test_forward_by_hand():
    assert FWD_1024_64 == 268_435_456
    assert attention_flops(1, 1, 1024, 1024, 64) == 268_435_456


def test_causal_is_half():
    assert attention_flops(1, 1, 1024, 1024, 64, causal=True) == 134_217_728


@pytest.mark.parametrize(
    "mode, expected",
    [
        pytest.param("fwd", 268_435_456, id="fwd"),
        pytest.param("bwd", 671_088_640, id="bwd-2.5x"),
        pytest.param("fwd+bwd", 939_524_096, id="fwd+bwd-3.5x"),
    ],
)
def test_modes(mode, expected):
    assert attention_flops(1, 1, 1024, 1024, 64, mode=mode) == expected


def test_mode_table():
    assert BACKWARD_FACTOR == 2.5
    assert MODES == {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}


def test_causal_backward_combines():
    assert attention_flops(1, 1, 1024, 1024, 64, causal=True, mode="fwd+bwd") == 134_217_728 * 3.5


@pytest.mark.parametrize(
    "args, expected",
    [
        # 4 · 2 · 3 · 100 · 300 · 80
        pytest.param((2, 3, 100, 300, 80), 57_600_000, id="nq100-nk300"),
        # swapping Nq and Nk does the same work
        pytest.param((2, 3, 300, 100, 80), 57_600_000, id="nq300-nk100"),
        # the FA-2 paper's setting at N = 4096, d = 128: B = 4, H = 16
        pytest.param((4, 16, 4096, 4096, 128), 549_755_813_888, id="fa2-setting-n4096"),
        pytest.param((3, 5, 1, 7, 1), 420, id="tiny"),
    ],
)
def test_batch_heads_and_unequal_lengths(args, expected):
    assert attention_flops(*args) == expected
    assert attention_flops(*args, causal=True) == expected / 2


@pytest.mark.parametrize(
    "args",
    [
        pytest.param((0, 16, 1024, 1024, 64), id="batch0"),
        pytest.param((1, 16, 0, 1024, 64), id="seqlen-q0"),
        pytest.param((1, 16, 1024, 0, 64), id="seqlen-k0"),
    ],
)
def test_empty_problem_has_no_flops(args):
    assert attention_flops(*args) == 0


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param("backward", id="backward"),
        pytest.param("FWD", id="upper-case"),
        pytest.param("", id="empty"),
        pytest.param("fwd+bwd+fwd", id="fwd+bwd+fwd"),
    ],
)
def test_unknown_mode(mode):
    with pytest.raises(ValueError, match="mode must be one of"):
        attention_flops(1, 1, 16, 16, 16, mode=mode)


def test_tflops():
    assert tflops(1e12, 1000.0) == 1.0
    assert tflops(1e12, 1.0) == pytest.approx(1000.0)
    # the N = 1024, d = 64 forward in 0.01 ms is 26.8435456 TFLOP/s
    assert tflops(attention_flops(1, 1, 1024, 1024, 64), 0.01) == pytest.approx(26.8435456, rel=1e-12)
