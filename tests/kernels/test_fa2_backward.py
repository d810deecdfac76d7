"""FlashAttention-2 backward: gradients of q, k, v against float64, under the tolerance policy.

The rule (kernels/tolerance.py): each gradient's max-abs error against float64 autograd is at most
twice that of plain PyTorch autograd at the same precision, plus a per-dtype floor. Odd shapes,
seqlen_q ≠ seqlen_k both ways (with the bottom-right causal mask: rows that see no key get zero
gradients), non-power-of-two head dims; fp16/fp32 in the interpreter, bf16 on a GPU.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from attention_checks import PoisonedTorch, assert_gradients_match, output_and_grads, random_tensors
from gpu_limits import HOPPER_SMEM_PER_BLOCK

from kernels.attention import fa2, fa2_config
from kernels.attention.fa2 import FA2Config

F16, F32, BF16 = torch.float16, torch.float32, torch.bfloat16


@dataclasses.dataclass(frozen=True)
class Case:
    batch: int
    heads: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    causal: bool
    dtype: torch.dtype


def _case(id_, *fields, marks=()):
    return pytest.param(Case(*fields), id=id_, marks=marks)


CASES = [
    _case("n17-d16-f32", 1, 2, 17, 17, 16, False, F32),
    _case("n47-d32-causal-f32", 1, 2, 47, 47, 32, True, F32),
    _case("nq33-nk70-d59-causal-f16", 2, 1, 33, 70, 59, True, F16),
    _case("nq70-nk33-d16-causal-f32", 1, 1, 70, 33, 16, True, F32),  # 37 rows see no key
    _case("n97-d64-f16", 1, 2, 97, 97, 64, False, F16),
    _case("n65-d80-causal-f16", 1, 1, 65, 65, 80, True, F16),
    _case("n33-d111-f32", 1, 1, 33, 33, 111, False, F32),
    _case("n1-d16-f16", 1, 1, 1, 1, 16, False, F16),
    _case("n130-d128-causal-bf16", 2, 2, 130, 130, 128, True, BF16, marks=pytest.mark.gpu),
    _case("nq97-nk200-d96-bf16", 1, 4, 97, 200, 96, False, BF16, marks=pytest.mark.gpu),
    _case("n257-d256-causal-f16", 1, 2, 257, 257, 256, True, F16, marks=pytest.mark.gpu),
]


def _inputs(case: Case, device: str, seed: int = 0):
    shapes = [(case.batch, case.heads, n, case.head_dim) for n in (case.seqlen_q, case.seqlen_k, case.seqlen_k)]
    return random_tensors([*shapes, shapes[0]], case.dtype, device, seed)  # q, k, v, do


def _grads(fn, q, k, v, do):
    return output_and_grads(fn, q, k, v, do)[1:]


@pytest.mark.parametrize("case", CASES)
def test_gradients_match_float64(case: Case, device):
    q, k, v, do = _inputs(case, device)
    assert_gradients_match(str(case), lambda *t: fa2.attention(*t, causal=case.causal), q, k, v, do, case.causal)


def test_rows_that_see_no_key_get_zero_gradient(device):
    case = Case(1, 1, 20, 8, 16, True, F32)  # bottom-right alignment: rows 0..11 see nothing
    q, k, v, do = _inputs(case, device)
    dq, _, _ = _grads(lambda *t: fa2.attention(*t, causal=True), q, k, v, do)
    assert torch.count_nonzero(dq[:, :, :12]) == 0
    assert torch.count_nonzero(dq[:, :, 12:]) > 0


def test_backward_is_deterministic(device):
    case = Case(2, 2, 65, 65, 32, True, F16)
    q, k, v, do = _inputs(case, device)
    first = _grads(lambda *t: fa2.attention(*t, causal=True), q, k, v, do)
    second = _grads(lambda *t: fa2.attention(*t, causal=True), q, k, v, do)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


def test_custom_scale_and_strided_inputs(device):
    case = Case(1, 2, 33, 33, 32, False, F32)
    q, k, v, do = _inputs(case, device)
    # [B, N, H, d] memory viewed as [B, H, N, d]: the kernels take any strides
    q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    assert not q.is_contiguous()
    assert_gradients_match(
        "strided, sm_scale=0.3", lambda *t: fa2.attention(*t, sm_scale=0.3), q, k, v, do, sm_scale=0.3
    )


def test_backward_refuses_a_mis_shaped_grad(device):
    case = Case(1, 1, 17, 17, 16, False, F32)
    q, k, v, do = _inputs(case, device)
    out, lse = fa2.forward(q, k, v)
    with pytest.raises(ValueError, match="grad_out has shape"):
        fa2.backward(do[:, :, :5], q, k, v, out, lse)


def test_backward_refuses_mis_shaped_out_and_lse(device):
    case = Case(1, 2, 17, 17, 16, False, F32)
    q, k, v, do = _inputs(case, device)
    out, lse = fa2.forward(q, k, v)
    with pytest.raises(ValueError, match="out has shape"):
        fa2.backward(do, q, k, v, out[:, :1], lse)
    with pytest.raises(ValueError, match="lse has shape"):
        fa2.backward(do, q, k, v, out, lse.transpose(1, 2))


def test_broadcast_upstream_gradient(device):
    """``out.sum().backward()`` hands the kernels a dO with stride 0 everywhere (an expanded scalar)."""
    case = Case(1, 2, 37, 37, 32, True, F32)
    q, k, v, _ = _inputs(case, device)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    fa2.attention(*leaves, causal=True).sum().backward()
    ones = torch.ones_like(q)
    ours = [x.grad for x in leaves]
    expected = assert_gradients_match("dO = ones", lambda *t: fa2.attention(*t, causal=True), q, k, v, ones, True)
    for a, b in zip(ours, expected[1:], strict=True):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------------
# Tiles: the unmasked fast loops and the masked ones must meet exactly, for any BLOCK_M × BLOCK_N
# ---------------------------------------------------------------------------------------------------

BWD_PINS = [
    pytest.param(
        "dkdv=BLOCK_M=32,BLOCK_N=16,num_warps=4,num_stages=1;dq=BLOCK_M=16,BLOCK_N=32,num_warps=4,num_stages=1",
        id="dkdv-m32n16-dq-m16n32",
    ),
    pytest.param(
        "dkdv=BLOCK_M=16,BLOCK_N=32,num_warps=4,num_stages=1;dq=BLOCK_M=32,BLOCK_N=16,num_warps=4,num_stages=1",
        id="dkdv-m16n32-dq-m32n16",
    ),
]

TILE_CASES = [
    # every tile full: only the fast loops and the diagonal
    pytest.param(Case(1, 1, 64, 64, 16, True, F16), id="n64-causal-f16"),
    pytest.param(Case(1, 1, 64, 64, 32, False, F32), id="n64-f32"),
    # partial last tiles on both sides, the diagonal shifted both ways (bottom-right alignment)
    pytest.param(Case(1, 1, 45, 83, 24, True, F32), id="nq45-nk83-d24-causal-f32"),
    pytest.param(Case(1, 1, 83, 45, 16, True, F16), id="nq83-nk45-causal-f16"),
    pytest.param(Case(1, 1, 50, 71, 16, False, F16), id="nq50-nk71-f16"),
    # diagonal offsets Nk - Nq of ±1 and ≡ -2, 1 (mod 16): where a tile boundary sits one row off the
    # first row that sees a key block, or off the first row that sees all of it
    pytest.param(Case(1, 1, 50, 64, 16, True, F32), id="nq50-nk64-causal-f32"),
    pytest.param(Case(1, 1, 47, 64, 16, True, F32), id="nq47-nk64-causal-f32"),
    pytest.param(Case(1, 1, 64, 49, 16, True, F32), id="nq64-nk49-causal-f32"),
    pytest.param(Case(1, 1, 33, 34, 16, True, F16), id="nq33-nk34-causal-f16"),
    pytest.param(Case(1, 1, 34, 33, 16, True, F16), id="nq34-nk33-causal-f16"),
]


@pytest.mark.parametrize("pin", BWD_PINS)
@pytest.mark.parametrize("case", TILE_CASES)
def test_pinned_tiles_match_float64(case: Case, pin, device, monkeypatch):
    monkeypatch.setenv(fa2.BWD_CONFIG_ENV, pin)
    q, k, v, do = _inputs(case, device, seed=11)
    assert_gradients_match(f"{case} {pin}", lambda *t: fa2.attention(*t, causal=case.causal), q, k, v, do, case.causal)
    assert str(fa2.last_bwd_config()) == pin


@pytest.mark.parametrize(
    "case, kv_heads",
    [
        pytest.param(Case(1, 2, 45, 20, 24, True, F16), 2, id="nq45-nk20-causal-blind-rows"),
        pytest.param(Case(2, 4, 32, 48, 16, False, F32), 1, id="mqa-even-tiles"),
        pytest.param(Case(1, 2, 20, 45, 16, True, F32), 2, id="nq20-nk45-causal"),
    ],
)
def test_every_gradient_written(case: Case, kv_heads, device, monkeypatch):
    """dq/dk/dv and Δ come from torch.empty: every element must be written by a kernel."""
    q, _, _, do = _inputs(case, device, seed=12)
    k, v = random_tensors([(case.batch, kv_heads, case.seqlen_k, case.head_dim)] * 2, case.dtype, device, 13)
    out, lse = fa2.forward(q, k, v, causal=case.causal)
    clean = fa2.backward(do, q, k, v, out, lse, causal=case.causal)
    monkeypatch.setattr(fa2, "torch", PoisonedTorch())
    poisoned = fa2.backward(do, q, k, v, out, lse, causal=case.causal)
    monkeypatch.undo()
    for name, a, b in zip(("dq", "dk", "dv"), poisoned, clean, strict=True):
        assert not torch.isnan(a).any(), f"{name}: elements left unwritten (still NaN)"
        assert torch.equal(a, b), name


# ---------------------------------------------------------------------------------------------------
# Backward configurations: defaults, fit check, pinning
# ---------------------------------------------------------------------------------------------------

C = FA2Config


@pytest.mark.parametrize(
    "head_dim, causal, dkdv, dq",
    [
        pytest.param(64, False, C(64, 64, 4, 3), C(128, 64, 8, 2), id="d64"),
        pytest.param(64, True, C(64, 64, 4, 3), C(64, 64, 4, 3), id="d64-causal"),
        pytest.param(32, False, C(64, 64, 4, 3), C(128, 64, 8, 2), id="d32-as-d64"),
        pytest.param(128, False, C(64, 64, 4, 2), C(128, 128, 8, 2), id="d128"),
        pytest.param(96, True, C(64, 64, 4, 2), C(128, 128, 8, 2), id="d96-causal-as-d128"),
        pytest.param(256, False, C(64, 64, 8, 2), C(64, 64, 4, 2), id="d256"),
    ],
)
def test_h200_defaults_are_the_sweep_winners(head_dim, causal, dkdv, dq):
    assert fa2.gpu_bwd_configs(head_dim, causal, smem_limit=HOPPER_SMEM_PER_BLOCK) == (dkdv, dq)


@pytest.mark.parametrize("smem_limit", [166912, 101376, 65536], ids=["163KiB", "99KiB", "64KiB"])
@pytest.mark.parametrize("elem_bytes", [2, 4], ids=["f16", "f32"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_smaller_gpus_fall_back_to_tiles_that_fit(head_dim, elem_bytes, smem_limit):
    block_d = max(64, head_dim)
    for causal in (False, True):
        chosen = fa2.gpu_bwd_configs(head_dim, causal, elem_bytes=elem_bytes, smem_limit=smem_limit)
        swept = fa2.gpu_bwd_configs(head_dim, causal, smem_limit=1 << 30)
        for which, cfg, best in zip(("dkdv", "dq"), chosen, swept, strict=True):
            fits = fa2_config.bwd_fits(which, cfg, block_d, elem_bytes, smem_limit)
            assert fits or cfg == C(16, 16, 4, 1), f"{which} {cfg} does not fit {smem_limit} bytes"
            if fa2_config.bwd_fits(which, best, block_d, elem_bytes, smem_limit):
                assert cfg == best  # the sweep's winner whenever it fits


def test_fp32_at_d128_falls_back_on_h200():
    chosen = fa2.gpu_bwd_configs(128, False, elem_bytes=4, smem_limit=HOPPER_SMEM_PER_BLOCK)
    assert chosen.dkdv == C(64, 64, 4, 2) and chosen.dq == C(64, 64, 4, 2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the interpreter's default; a CUDA GPU is present")
def test_interpreter_default_is_small():
    assert fa2.default_bwd_configs(128, True) == (C(16, 16, 4, 1), C(16, 16, 4, 1))


@pytest.mark.gpu
def test_gpu_default_is_the_fitting_sweep_winner():
    props = torch.cuda.get_device_properties(0)
    chosen = fa2.default_bwd_configs(128, False, "cuda", torch.bfloat16)
    assert chosen == fa2.gpu_bwd_configs(128, False, smem_limit=fa2_config.shared_mem_limit(torch.device("cuda", 0)))
    if props.major == 9:  # Hopper: the H200 sweep's winners fit
        assert chosen == (C(64, 64, 4, 2), C(128, 128, 8, 2))


@pytest.mark.parametrize("head_dim", [0, 257])
def test_bwd_configs_refuse_bad_head_dim(head_dim):
    with pytest.raises(ValueError, match=f"head_dim {head_dim} is not supported"):
        fa2.gpu_bwd_configs(head_dim, False, smem_limit=HOPPER_SMEM_PER_BLOCK)


def test_bwd_config_round_trips():
    cfg = fa2.FA2BwdConfig(C(64, 64, 4, 2), C(128, 128, 8, 2))
    text = str(cfg)
    assert text == (
        "dkdv=BLOCK_M=64,BLOCK_N=64,num_warps=4,num_stages=2;dq=BLOCK_M=128,BLOCK_N=128,num_warps=8,num_stages=2"
    )
    assert fa2.FA2BwdConfig.parse(text) == cfg
    spaced = " dq=BLOCK_M=16,BLOCK_N=32,num_warps=4,num_stages=1 ; dkdv=" + str(C(32, 16, 4, 1))
    assert fa2.FA2BwdConfig.parse(spaced) == (C(32, 16, 4, 1), C(16, 32, 4, 1))
    dkdv, dq = cfg  # a pair
    assert (dkdv, dq) == (cfg.dkdv, cfg.dq)


@pytest.mark.parametrize(
    "text, match",
    [
        pytest.param("", "cannot parse FA-2 backward config", id="empty"),
        pytest.param(str(C(64, 64, 4, 2)), "cannot parse FA-2 backward config", id="forward-form"),
        pytest.param("dkdv=" + str(C(64, 64, 4, 2)), "must set both passes", id="one-pass"),
        pytest.param("dkdv=" + str(C(64, 64, 4, 2)) + ";dkdv=" + str(C(64, 64, 4, 2)), "cannot parse", id="twice"),
        pytest.param("dk=" + str(C(64, 64, 4, 2)) + ";dq=" + str(C(64, 64, 4, 2)), "cannot parse", id="bad-name"),
        pytest.param("dkdv=BLOCK_M=64;dq=" + str(C(64, 64, 4, 2)), "must set all of", id="bad-config"),
    ],
)
def test_bwd_config_parse_rejects_garbage(text, match):
    with pytest.raises(ValueError, match=match):
        fa2.FA2BwdConfig.parse(text)


def test_explicit_pass_config_beats_the_environment(device, monkeypatch):
    pinned = fa2.FA2BwdConfig(C(16, 32, 4, 1), C(32, 16, 4, 1))
    monkeypatch.setenv(fa2.BWD_CONFIG_ENV, str(pinned))
    q, k, v, do = _inputs(Case(1, 1, 33, 33, 16, True, F32), device)
    out, lse = fa2.forward(q, k, v, causal=True)
    ref = fa2.backward(do, q, k, v, out, lse, True)
    assert fa2.last_bwd_config() == pinned
    explicit = C(16, 16, 4, 1)
    grads = fa2.backward(do, q, k, v, out, lse, True, dkdv_config=explicit)
    assert fa2.last_bwd_config() == (explicit, pinned.dq)
    for a, b in zip(grads, ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_bwd_env_garbage_is_refused(device, monkeypatch):
    monkeypatch.setenv(fa2.BWD_CONFIG_ENV, "dkdv=fast")
    q, k, v, do = _inputs(Case(1, 1, 17, 17, 16, False, F32), device)
    out, lse = fa2.forward(q, k, v)
    with pytest.raises(ValueError, match="cannot parse FA-2 config"):
        fa2.backward(do, q, k, v, out, lse)
