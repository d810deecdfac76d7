"""Lazy against eager rescaling in the FA-2 forward (the ablation): the same attention either way.

Lazy (the default, FA-2) divides the unnormalised accumulator by ℓ once at the end; eager divides the
running output by ℓ after every K/V tile and un-normalises it before the next, as FA-1 does. Both are
judged against float64 under the tolerance policy, on odd shapes, causal or not, fp16 and fp32; the
logsumexp is the same arithmetic in both and must agree to float32 rounding.
"""

from __future__ import annotations

import pytest
import torch
from attention_checks import assert_matches_reference, random_tensors

from kernels.attention import fa2
from kernels.attention.fa2 import FA2Config

F16, F32, BF16 = torch.float16, torch.float32, torch.bfloat16

CASES = [
    pytest.param((1, 2, 97, 97, 59, False, F16), id="n97-d59-f16"),
    pytest.param((1, 2, 97, 97, 64, True, F32), id="n97-d64-causal-f32"),
    pytest.param((2, 1, 64, 64, 32, True, F16), id="n64-even-tiles-causal-f16"),
    pytest.param((1, 1, 33, 130, 80, True, F32), id="nq33-nk130-d80-causal-f32"),
    pytest.param((1, 2, 70, 33, 16, True, F16), id="nq70-nk33-causal-f16"),  # 37 rows see no key
    pytest.param((1, 1, 45, 83, 111, False, F32), id="nq45-nk83-d111-f32"),
    pytest.param((1, 2, 130, 130, 128, True, BF16), id="n130-d128-causal-bf16", marks=pytest.mark.gpu),
]


def _inputs(shape, device, seed=0):
    b, h, nq, nk, d, _, dtype = shape
    return random_tensors([(b, h, nq, d), (b, h, nk, d), (b, h, nk, d)], dtype, device, seed)


@pytest.mark.parametrize("shape", CASES)
def test_eager_and_lazy_both_match_float64(shape, device):
    causal = shape[5]
    q, k, v = _inputs(shape, device)
    lazy, lse_lazy = fa2.forward(q, k, v, causal=causal)
    eager, lse_eager = fa2.forward(q, k, v, causal=causal, rescale="eager")
    assert_matches_reference(f"lazy {shape}", lazy, q, k, v, causal)
    assert_matches_reference(f"eager {shape}", eager, q, k, v, causal)
    # the same arithmetic for ℓ and m in both; compiled kernels may still contract or schedule the two
    # variants differently, so agreement is to float32 rounding, not bit for bit
    torch.testing.assert_close(lse_eager, lse_lazy, atol=1e-5, rtol=1e-6)
    blind = max(0, shape[2] - shape[3]) if causal else 0
    assert torch.count_nonzero(eager[:, :, :blind]) == 0, "rows that see no key must be exactly 0"


@pytest.mark.parametrize("config", [FA2Config(16, 16, 4, 1), FA2Config(32, 16, 4, 1), FA2Config(16, 64, 4, 1)], ids=str)
def test_eager_under_pinned_tiles(config, device, monkeypatch):
    monkeypatch.delenv(fa2.CONFIG_ENV, raising=False)
    q, k, v = _inputs((1, 1, 83, 45, 24, True, F32), device, seed=1)
    out, _ = fa2.forward(q, k, v, causal=True, config=config, rescale="eager")
    assert fa2.last_config() == config
    assert_matches_reference(f"eager {config}", out, q, k, v, True)


def test_eager_is_a_different_computation(device):
    """The flag reaches the kernel: over many tiles the two orders round differently in fp32."""
    q, k, v = _inputs((1, 1, 130, 130, 64, False, F32), device, seed=2)
    lazy, _ = fa2.forward(q, k, v)
    eager, _ = fa2.forward(q, k, v, rescale="eager")
    assert not torch.equal(lazy, eager)
    torch.testing.assert_close(eager, lazy, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rescale", ["Lazy", "", "fa1", None], ids=["Lazy", "empty", "fa1", "None"])
def test_bad_rescale_raises(rescale, device):
    q, k, v = _inputs((1, 1, 17, 17, 16, False, F16), device)
    with pytest.raises(ValueError, match="rescale must be one of"):
        fa2.forward(q, k, v, rescale=rescale)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_tuner_keeps_lazy_and_eager_apart(causal, monkeypatch):
    """Each mode tunes and caches its own choice (the mode is in the tuner's key and in _CHOSEN's)."""
    monkeypatch.delenv(fa2.CONFIG_ENV, raising=False)
    q, k, v = _inputs((2, 3, 257, 257, 128, causal, BF16), "cuda")
    lazy, _ = fa2.forward(q, k, v, causal=causal)
    eager, _ = fa2.forward(q, k, v, causal=causal, rescale="eager")
    # _CHOSEN's key: (configs, device, dtype, seqlen_q, seqlen_k, head_dim, causal, eager, varlen)
    keys = [key for key in fa2._CHOSEN if key[3:7] == (257, 257, 128, causal) and not key[8]]
    assert {key[7] for key in keys} == {False, True}
    assert_matches_reference("lazy (tuned)", lazy, q, k, v, causal)
    assert_matches_reference("eager (tuned)", eager, q, k, v, causal)
