"""FlashAttention-2 forward (``kernels.attention.fa2``), its references and the tolerance policy.

Every output is judged by ``kernels.tolerance``: max-abs error against the float64
``reference_attention`` at most 2× that of same-precision PyTorch (``naive_attention``) plus a floor.
Without a GPU the kernels run in Triton's interpreter (``tests/conftest.py`` sets ``TRITON_INTERPRET``),
so shapes stay small: seqlen ≤ 130, batch·heads ≤ 4.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from attention_checks import PoisonedTorch, assert_matches_reference

from kernels import tolerance
from kernels.attention import fa2, reference
from kernels.attention.fa2 import FA2Config

HAS_CUDA = torch.cuda.is_available()
cpu_only = pytest.mark.skipif(HAS_CUDA, reason="checks the CPU/interpreter path; a CUDA GPU is present")

# The logsumexp is fp32 arithmetic on exactly-representable fp16/fp32 products; measured errors in the
# interpreter are below 1e-6 for |lse| ≈ 6, so this bound is loose for rounding and tight for any bug.
LSE_ATOL = 3e-5
LSE_RTOL = 1e-5


@dataclasses.dataclass(frozen=True)
class Case:
    batch: int
    heads: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    causal: bool
    dtype: torch.dtype


def _case(id_, b, h, nq, nk, d, causal, dtype, marks=()):
    return pytest.param(Case(b, h, nq, nk, d, causal, dtype), id=id_, marks=marks)


F16, F32, BF16 = torch.float16, torch.float32, torch.bfloat16

CASES = [
    _case("n1-d64-f16", 1, 1, 1, 1, 64, False, F16),
    _case("n1-d64-causal-f32", 1, 1, 1, 1, 64, True, F32),
    _case("n17-d16-causal-f16", 1, 2, 17, 17, 16, True, F16),
    _case("n17-d32-b2h2-f32", 2, 2, 17, 17, 32, False, F32),
    _case("n97-d32-b2h2-causal-f16", 2, 2, 97, 97, 32, True, F16),
    _case("n130-d64-h2-causal-f16", 1, 2, 130, 130, 64, True, F16),
    _case("n130-d64-b2-f32", 2, 1, 130, 130, 64, False, F32),
    _case("nq97-nk33-d59-causal-f16", 1, 2, 97, 33, 59, True, F16),  # rows 0..63 see no key
    _case("nq97-nk33-d80-causal-f32", 2, 1, 97, 33, 80, True, F32),
    _case("nq33-nk97-d80-causal-f16", 1, 2, 33, 97, 80, True, F16),
    _case("nq33-nk97-d96-causal-f32", 1, 1, 33, 97, 96, True, F32),
    _case("nq97-nk33-d96-f16", 1, 2, 97, 33, 96, False, F16),
    _case("nq33-nk97-d59-f32", 2, 2, 33, 97, 59, False, F32),
    _case("nq1-nk130-d64-causal-f32", 1, 1, 1, 130, 64, True, F32),  # the single row sees every key
    _case("nq130-nk1-d32-causal-f16", 1, 1, 130, 1, 32, True, F16),  # only the last row sees a key
    _case("n65-d111-b2-causal-f16", 2, 1, 65, 65, 111, True, F16),
    _case("n65-d111-f32", 1, 1, 65, 65, 111, False, F32),
    _case("n97-d128-h2-f16", 1, 2, 97, 97, 128, False, F16),
    _case("n130-d128-causal-f32", 1, 1, 130, 130, 128, True, F32),
    _case("n33-d256-h2-causal-f16", 1, 2, 33, 33, 256, True, F16),
    _case("nq33-nk17-d256-causal-f32", 1, 1, 33, 17, 256, True, F32),
    _case("n97-d64-causal-bf16", 1, 2, 97, 97, 64, True, BF16, marks=pytest.mark.gpu),
    _case("nq97-nk33-d128-causal-bf16", 2, 2, 97, 33, 128, True, BF16, marks=pytest.mark.gpu),
    _case("nq33-nk97-d59-bf16", 1, 1, 33, 97, 59, False, BF16, marks=pytest.mark.gpu),
]


def _inputs(case: Case, device: str, seed: int = 0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    shapes = [
        (case.batch, case.heads, case.seqlen_q, case.head_dim),
        (case.batch, case.heads, case.seqlen_k, case.head_dim),
        (case.batch, case.heads, case.seqlen_k, case.head_dim),
    ]
    return tuple(torch.randn(s, generator=gen).to(device=device, dtype=case.dtype) for s in shapes)


def _lse_reference(q, k, causal, sm_scale=None):
    nq, d, nk = q.shape[2], q.shape[3], k.shape[2]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    scores = (q.double() @ k.double().transpose(-1, -2)) * scale
    if causal:
        hidden = reference.causal_mask(torch.arange(nq, device=q.device), nq, nk)
        scores = scores.masked_fill(hidden, float("-inf"))
    return torch.logsumexp(scores, dim=-1)


def _assert_lse(lse, q, k, causal, sm_scale=None):
    expected = _lse_reference(q, k, causal, sm_scale)
    assert lse.dtype == torch.float32
    assert lse.shape == expected.shape
    assert torch.equal(torch.isneginf(lse), torch.isneginf(expected)), "rows with no visible key: lse must be -inf"
    assert not torch.isnan(lse).any() and not torch.isposinf(lse).any()
    seen = torch.isfinite(expected)
    torch.testing.assert_close(lse.double()[seen], expected[seen], atol=LSE_ATOL, rtol=LSE_RTOL)


def _blind_rows(causal: bool, seqlen_q: int, seqlen_k: int) -> int:
    """Leading query rows that see no key (bottom-right causal alignment)."""
    return max(0, seqlen_q - seqlen_k) if causal else 0


# ---------------------------------------------------------------------------------------------------
# Correctness over odd shapes
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_forward_matches_float64_reference(case: Case, device):
    q, k, v = _inputs(case, device)
    out, lse = fa2.forward(q, k, v, causal=case.causal)

    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    assert out.is_contiguous()
    assert torch.isfinite(out).all()
    assert_matches_reference(f"fa2 out {case}", out, q, k, v, case.causal)
    _assert_lse(lse, q, k, case.causal)

    blind = _blind_rows(case.causal, case.seqlen_q, case.seqlen_k)
    if blind:
        assert torch.count_nonzero(out[:, :, :blind]) == 0, "rows that see no key must be exactly 0"
        assert torch.count_nonzero(out[:, :, blind:]) > 0


@pytest.mark.parametrize(
    "case",
    [
        _case("nq97-nk33-d59-causal-f16", 1, 2, 97, 33, 59, True, F16),
        _case("n130-d64-f32", 1, 2, 130, 130, 64, False, F32),
    ],
)
def test_attention_wrapper_equals_forward(case: Case, device):
    q, k, v = _inputs(case, device, seed=1)
    out, _ = fa2.forward(q, k, v, causal=case.causal)
    assert torch.equal(fa2.attention(q, k, v, causal=case.causal), out)


# ---------------------------------------------------------------------------------------------------
# Strided inputs
# ---------------------------------------------------------------------------------------------------


def _strided_views(kind: str, b, h, nq, nk, d, dtype, device):
    gen = torch.Generator(device="cpu").manual_seed(2)

    def make(n):
        if kind == "bnhd-transposed":  # [B, N, H, d] -> [B, H, N, d]
            return torch.randn((b, n, h, d), generator=gen).to(device=device, dtype=dtype).transpose(1, 2)
        if kind == "head-dim-slice":  # columns 5..5+d of a wider tensor: row stride 128, offset 5
            return torch.randn((b, h, n, 128), generator=gen).to(device=device, dtype=dtype)[..., 5 : 5 + d]
        if kind == "head-dim-strided":  # [B, H, d, N] -> [B, H, N, d]: head_dim stride is N, not 1
            return torch.randn((b, h, d, n), generator=gen).to(device=device, dtype=dtype).transpose(2, 3)
        raise AssertionError(kind)

    return make(nq), make(nk), make(nk)


@pytest.mark.parametrize(
    "kind, dtype, causal",
    [
        pytest.param("bnhd-transposed", F16, True, id="bnhd-transposed-causal-f16"),
        pytest.param("bnhd-transposed", F32, False, id="bnhd-transposed-f32"),
        pytest.param("head-dim-slice", F16, True, id="head-dim-slice-causal-f16"),
        pytest.param("head-dim-strided", F32, True, id="head-dim-strided-causal-f32"),
    ],
)
def test_non_contiguous_inputs(kind, dtype, causal, device):
    q, k, v = _strided_views(kind, 2, 2, 97, 33, 59, dtype, device)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    out, lse = fa2.forward(q, k, v, causal=causal)
    assert_matches_reference(f"fa2 out ({kind})", out, q, k, v, causal)
    # same arithmetic whatever the strides: bitwise equal to the run on contiguous copies
    out_c, lse_c = fa2.forward(q.contiguous(), k.contiguous(), v.contiguous(), causal=causal)
    assert torch.equal(out, out_c)
    assert torch.equal(lse, lse_c)


# ---------------------------------------------------------------------------------------------------
# Configurations: pinned, parsed, from the environment
# ---------------------------------------------------------------------------------------------------

PINNED = [
    pytest.param(FA2Config(16, 16, 4, 1), id="m16-n16"),
    pytest.param(FA2Config(32, 16, 4, 1), id="m32-n16"),
    pytest.param(FA2Config(16, 32, 4, 1), id="m16-n32"),
    pytest.param(FA2Config(64, 16, 4, 1), id="m64-n16"),
    pytest.param(FA2Config(16, 64, 4, 1), id="m16-n64"),
]


@pytest.mark.parametrize("config", PINNED)
@pytest.mark.parametrize(
    "case",
    [
        _case("nq97-nk33-d59-causal-f16", 1, 2, 97, 33, 59, True, F16),
        _case("nq33-nk97-d80-causal-f32", 2, 1, 33, 97, 80, True, F32),
        _case("nq70-nk130-d32-causal-f16", 1, 1, 70, 130, 32, True, F16),
        _case("n45-d64-f16", 1, 1, 45, 45, 64, False, F16),
    ],
)
def test_pinned_config(case: Case, config: FA2Config, device, monkeypatch):
    monkeypatch.delenv(fa2.CONFIG_ENV, raising=False)
    q, k, v = _inputs(case, device, seed=3)
    out, lse = fa2.forward(q, k, v, causal=case.causal, config=config)
    assert fa2.last_config() == config
    assert_matches_reference(f"fa2 out with {config}", out, q, k, v, case.causal)
    _assert_lse(lse, q, k, case.causal)
    blind = _blind_rows(case.causal, case.seqlen_q, case.seqlen_k)
    assert torch.count_nonzero(out[:, :, :blind]) == 0


def test_default_config_reported(device, monkeypatch):
    monkeypatch.delenv(fa2.CONFIG_ENV, raising=False)
    q, k, v = _inputs(Case(1, 1, 40, 40, 32, True, F16), device)
    fa2.forward(q, k, v, causal=True, config=FA2Config(16, 16, 4, 1))
    fa2.forward(q, k, v, causal=True)
    assert fa2.last_config() in fa2.default_configs()


@pytest.mark.parametrize(
    "config",
    [
        pytest.param(FA2Config(128, 64, 8, 3), id="gpu-like"),
        pytest.param(FA2Config(16, 32, 4, 1), id="small"),
        pytest.param(FA2Config(64, 128, 4, 2), id="wide-n"),
    ],
)
def test_config_parse_round_trips(config):
    text = str(config)
    assert text == (
        f"BLOCK_M={config.block_m},BLOCK_N={config.block_n},num_warps={config.num_warps},num_stages={config.num_stages}"
    )
    assert FA2Config.parse(text) == config


def test_config_parse_ignores_order_and_spaces():
    text = " num_stages=2, num_warps=4 ,BLOCK_N=32,BLOCK_M=64 "
    assert FA2Config.parse(text) == FA2Config(64, 32, 4, 2)


@pytest.mark.parametrize(
    "text, match",
    [
        pytest.param("", "cannot parse FA-2 config", id="empty"),
        pytest.param("garbage", "cannot parse FA-2 config", id="word"),
        pytest.param("BLOCK_M=16;BLOCK_N=16;num_warps=4;num_stages=1", "cannot parse", id="semicolons"),
        pytest.param("BLOCK_M=16,BLOCK_N=sixteen,num_warps=4,num_stages=1", "cannot parse", id="word-value"),
        pytest.param("BLOCK_M=-16,BLOCK_N=16,num_warps=4,num_stages=1", "cannot parse", id="negative"),
        pytest.param("BLOCK_M=16,BLOCK_N=16,num_warps=4,num_stages=", "cannot parse", id="no-value"),
        pytest.param("BLOCK_M=16,BLOCK_K=16,num_warps=4,num_stages=1", "cannot parse", id="unknown-field"),
        pytest.param("block_m=16,block_n=16,num_warps=4,num_stages=1", "cannot parse", id="wrong-case"),
        pytest.param("BLOCK_M=16,BLOCK_N=16,num_warps=4", "must set all of", id="missing-field"),
    ],
)
def test_config_parse_rejects_garbage(text, match):
    with pytest.raises(ValueError, match=match):
        FA2Config.parse(text)


def test_env_var_pins_config(device, monkeypatch):
    pinned = FA2Config(16, 32, 4, 1)
    monkeypatch.setenv(fa2.CONFIG_ENV, str(pinned))
    case = Case(1, 2, 97, 33, 59, True, F16)
    q, k, v = _inputs(case, device, seed=4)
    out, _ = fa2.forward(q, k, v, causal=True)
    assert fa2.last_config() == pinned
    assert_matches_reference("fa2 out (env-pinned)", out, q, k, v, True)

    explicit = FA2Config(32, 16, 4, 1)  # an explicit config wins over the environment
    fa2.forward(q, k, v, causal=True, config=explicit)
    assert fa2.last_config() == explicit


def test_env_var_garbage_is_refused(device, monkeypatch):
    monkeypatch.setenv(fa2.CONFIG_ENV, "BLOCK_M=sixteen")
    q, k, v = _inputs(Case(1, 1, 17, 17, 16, False, F16), device)
    with pytest.raises(ValueError, match="cannot parse FA-2 config"):
        fa2.forward(q, k, v)


# ---------------------------------------------------------------------------------------------------
# sm_scale
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sm_scale, case",
    [
        pytest.param(0.05, Case(1, 2, 97, 33, 59, True, F16), id="small-scale-causal-f16"),
        pytest.param(0.5, Case(1, 1, 33, 97, 64, False, F32), id="large-scale-f32"),
        pytest.param(1.0, Case(2, 1, 65, 65, 32, True, F32), id="unit-scale-causal-f32"),
    ],
)
def test_custom_sm_scale(sm_scale, case: Case, device):
    q, k, v = _inputs(case, device, seed=5)
    out, lse = fa2.forward(q, k, v, causal=case.causal, sm_scale=sm_scale)
    assert_matches_reference(f"fa2 out sm_scale={sm_scale}", out, q, k, v, case.causal, sm_scale)
    _assert_lse(lse, q, k, case.causal, sm_scale)
    # the scale is really used: the default-scale output is a different attention
    default, _ = fa2.forward(q, k, v, causal=case.causal)
    assert (out.float() - default.float()).abs().max() > 1e-2


@pytest.mark.parametrize(
    "sm_scale",
    [
        pytest.param(0.0, id="zero"),
        pytest.param(-0.125, id="negative"),
        pytest.param(float("nan"), id="nan"),
        pytest.param(float("inf"), id="inf"),
    ],
)
def test_bad_sm_scale_raises(sm_scale, device):
    q, k, v = _inputs(Case(1, 1, 17, 17, 16, False, F16), device)
    with pytest.raises(ValueError, match="sm_scale must be a positive finite number"):
        fa2.forward(q, k, v, sm_scale=sm_scale)


# ---------------------------------------------------------------------------------------------------
# Zero-sized inputs
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "q_shape, kv_shape",
    [
        pytest.param((0, 2, 17, 32), (0, 2, 33, 32), id="batch0"),
        pytest.param((1, 0, 17, 32), (1, 0, 33, 32), id="heads0"),
        pytest.param((2, 1, 0, 32), (2, 1, 33, 32), id="seqlen-q0"),
    ],
)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_empty_query_gives_empty_output(q_shape, kv_shape, causal, device):
    q = torch.ones(q_shape, device=device, dtype=F16)
    k = torch.ones(kv_shape, device=device, dtype=F16)
    out, lse = fa2.forward(q, k, k.clone(), causal=causal)
    assert out.shape == q_shape and out.dtype == F16 and out.device == q.device
    assert lse.shape == q_shape[:3] and lse.dtype == torch.float32
    assert fa2.attention(q, k, k.clone(), causal=causal).shape == q_shape


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [F16, F32], ids=["f16", "f32"])
def test_no_keys_gives_zeros(causal, dtype, device):
    q = torch.ones((2, 2, 17, 32), device=device, dtype=dtype)
    k = torch.ones((2, 2, 0, 32), device=device, dtype=dtype)
    out, lse = fa2.forward(q, k, k.clone(), causal=causal)
    assert out.shape == q.shape and out.dtype == dtype
    assert torch.count_nonzero(out) == 0
    assert torch.isneginf(lse).all() and lse.shape == (2, 2, 17)
    assert torch.equal(fa2.attention(q, k, k.clone(), causal=causal), out)


# ---------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------


def _t(shape, dtype=F16, device="cpu"):
    return torch.zeros(shape, dtype=dtype, device=device)


BAD_INPUTS = [
    pytest.param(
        lambda d: (_t((1, 1, 8, 16), torch.float64, d),) * 3, TypeError, r"dtype torch\.float64", id="float64"
    ),
    pytest.param(lambda d: (_t((1, 1, 8, 16), torch.int32, d),) * 3, TypeError, "supported: float16", id="int32"),
    pytest.param(
        lambda d: (_t((1, 1, 8, 16), F16, d), _t((1, 1, 8, 16), F32, d), _t((1, 1, 8, 16), F16, d)),
        TypeError,
        "must share a dtype",
        id="mixed-dtypes",
    ),
    pytest.param(
        lambda d: ([[0.0]], _t((1, 1, 8, 16), F16, d), _t((1, 1, 8, 16), F16, d)),
        TypeError,
        "q must be a torch.Tensor",
        id="not-a-tensor",
    ),
    pytest.param(
        lambda d: (_t((1, 8, 16), F16, d),) * 3, ValueError, r"\[batch, heads, seq, head_dim\]", id="3d-tensor"
    ),
    pytest.param(
        lambda d: (_t((1, 1, 8, 16), F16, d), _t((1, 1, 8, 16), F16, d), _t((1, 1, 9, 16), F16, d)),
        ValueError,
        "k and v must have the same shape",
        id="kv-shape-mismatch",
    ),
    pytest.param(
        lambda d: (_t((2, 1, 8, 16), F16, d), _t((1, 1, 8, 16), F16, d), _t((1, 1, 8, 16), F16, d)),
        ValueError,
        "does not match q",
        id="batch-mismatch",
    ),
    pytest.param(
        lambda d: (_t((1, 4, 8, 16), F16, d), _t((1, 3, 8, 16), F16, d), _t((1, 3, 8, 16), F16, d)),
        ValueError,
        "must divide q's 4",
        id="kv-heads-not-dividing",
    ),
    pytest.param(
        lambda d: (_t((1, 1, 8, 16), F16, d), _t((1, 1, 8, 32), F16, d), _t((1, 1, 8, 32), F16, d)),
        ValueError,
        "does not match q",
        id="head-dim-mismatch",
    ),
    pytest.param(
        lambda d: (_t((1, 1, 8, 257), F16, d),) * 3, ValueError, "head_dim 257 is not supported", id="head-dim-257"
    ),
    pytest.param(lambda d: (_t((1, 1, 8, 0), F16, d),) * 3, ValueError, "head_dim 0 is not supported", id="head-dim-0"),
    pytest.param(
        lambda d: (_t((1, 1, 8, 16), F16, d), _t((1, 1, 8, 16), F16, "meta"), _t((1, 1, 8, 16), F16, d)),
        ValueError,
        "must share one device",
        id="mixed-devices",
    ),
    pytest.param(
        lambda d: (_t((1, 1, 8, 16), F16, "meta"),) * 3, ValueError, "unsupported device meta", id="meta-device"
    ),
]


@pytest.mark.parametrize("make, error, match", BAD_INPUTS)
def test_bad_input_raises(make, error, match, device):
    q, k, v = make(device)
    with pytest.raises(error, match=match):
        fa2.forward(q, k, v)
    with pytest.raises(error, match=match):
        fa2.attention(q, k, v)


@cpu_only
def test_bfloat16_refused_in_interpreter():
    q = _t((1, 1, 8, 16), BF16)
    with pytest.raises(TypeError, match="bfloat16 is not supported in Triton's interpreter"):
        fa2.forward(q, q, q)


@pytest.mark.gpu
def test_cpu_tensors_refused_without_interpreter():
    q = _t((1, 1, 8, 16), F16, "cpu")
    with pytest.raises(ValueError, match="CPU tensors need Triton's interpreter"):
        fa2.forward(q, q, q)


@pytest.mark.parametrize("which", [0, 1, 2], ids=["q", "k", "v"])
def test_no_grad_path_matches_the_graph_path(which, device):
    """Under no_grad the forward launches without autograd; with grad it goes through the Function."""
    q, k, v = _inputs(Case(1, 1, 17, 17, 16, False, F32), device)
    tensors = [q, k, v]
    tensors[which] = tensors[which].clone().requires_grad_(True)
    with torch.no_grad():
        plain = fa2.attention(*tensors)
    graph = fa2.attention(*tensors)
    assert graph.requires_grad and not plain.requires_grad
    assert torch.equal(plain, graph.detach())
    assert_matches_reference("fa2 out under no_grad", plain, q, k, v, False)


# ---------------------------------------------------------------------------------------------------
# Every output element is written, and depends on v
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        _case("nq97-nk33-d59-causal-f16", 1, 2, 97, 33, 59, True, F16),  # masked tails and blind rows
        _case("n64-d64-f32", 2, 2, 64, 64, 64, False, F32),  # even tiles: the unmasked store
        _case("nq33-nk97-d111-causal-f16", 1, 1, 33, 97, 111, True, F16),
    ],
)
def test_every_output_written(case: Case, device, monkeypatch):
    q, k, v = _inputs(case, device, seed=6)
    monkeypatch.setattr(fa2, "torch", PoisonedTorch())
    out, lse = fa2.forward(q, k, v, causal=case.causal)
    monkeypatch.undo()
    assert not torch.isnan(out).any(), "output elements left unwritten (still NaN)"
    assert not torch.isnan(lse).any(), "logsumexp entries left unwritten (still NaN)"
    assert torch.isfinite(out).all()
    assert_matches_reference("fa2 out (poisoned buffers)", out, q, k, v, case.causal)


@pytest.mark.parametrize(
    "case",
    [
        _case("n33-d64-f16", 1, 2, 33, 33, 64, False, F16),
        _case("nq33-nk97-d59-causal-f32", 2, 1, 33, 97, 59, True, F32),
    ],
)
def test_output_depends_on_v(case: Case, device):
    q, k, v = _inputs(case, device, seed=7)
    out, _ = fa2.forward(q, k, v, causal=case.causal)
    # softmax rows sum to 1, so adding 1 to every value adds 1 to every output element
    out_shifted, _ = fa2.forward(q, k, v + 1, causal=case.causal)
    assert torch.isfinite(out).all() and torch.isfinite(out_shifted).all()
    assert (out_shifted != out).all()
    torch.testing.assert_close(
        out_shifted.float() - out.float(), torch.ones_like(out, dtype=torch.float32), atol=4e-3, rtol=0
    )


# ---------------------------------------------------------------------------------------------------
# The reference module
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        _case("nq97-nk33-d59-causal", 2, 2, 97, 33, 59, True, F32),
        _case("nq33-nk97-d64", 1, 2, 33, 97, 64, False, F32),
    ],
)
def test_naive_close_to_float64_in_float32(case: Case):
    q, k, v = _inputs(case, "cpu", seed=8)
    naive = reference.naive_attention(q, k, v, case.causal)
    ref = reference.reference_attention(q, k, v, case.causal)
    assert naive.dtype == F32 and ref.dtype == torch.float64
    torch.testing.assert_close(naive.double(), ref, atol=1e-5, rtol=1e-5)
    blind = _blind_rows(case.causal, case.seqlen_q, case.seqlen_k)
    assert torch.count_nonzero(ref[:, :, :blind]) == 0 and torch.count_nonzero(naive[:, :, :blind]) == 0


def test_causal_mask_bottom_right():
    hidden = reference.causal_mask(torch.arange(2), seqlen_q=2, seqlen_k=4)
    assert hidden.tolist() == [[False, False, False, True], [False, False, False, False]]
    hidden = reference.causal_mask(torch.arange(3), seqlen_q=3, seqlen_k=2)
    assert hidden.tolist() == [[True, True], [False, True], [False, False]]


@pytest.mark.parametrize("dtype", [F16, F32], ids=["f16", "f32"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_naive_rows_equal_naive_rows_exactly(dtype, causal):
    q, k, v = _inputs(Case(2, 2, 97, 33, 59, causal, dtype), "cpu", seed=9)
    rows = torch.tensor([0, 5, 63, 64, 65, 96])
    full = reference.naive_attention(q, k, v, causal)
    assert torch.equal(reference.naive_attention_rows(q, k, v, rows, causal), full.index_select(2, rows))
    # float64 makes no bitwise promise (BLAS may block a smaller product differently): rounding only
    ref_full = reference.reference_attention(q, k, v, causal)
    ref_rows = reference.reference_attention(q, k, v, causal, rows=rows)
    torch.testing.assert_close(ref_rows, ref_full.index_select(2, rows), atol=1e-13, rtol=0)


@pytest.mark.filterwarnings("ignore:Lower right causal bias will produce NaNs:UserWarning")  # checked below
@pytest.mark.parametrize("nq, nk", [(33, 97), (97, 33)], ids=["nq33-nk97", "nq97-nk33"])
def test_sdpa_math_lower_right_causal(nq, nk):
    q, k, v = _inputs(Case(1, 2, nq, nk, 32, True, F32), "cpu", seed=10)
    try:
        out = reference.sdpa_attention(q, k, v, causal=True, backend="math")
    except RuntimeError as exc:  # pragma: no cover - depends on the PyTorch build
        pytest.skip(f"SDPA math backend cannot run a lower-right causal bias on CPU here: {exc}")
    assert not torch.isnan(out).any()
    assert_matches_reference(f"sdpa-math Nq={nq} Nk={nk}", out, q, k, v, True)


def test_sdpa_unknown_backend():
    q = torch.zeros((1, 1, 4, 8))
    with pytest.raises(ValueError, match="unknown SDPA backend 'fastest'"):
        reference.sdpa_attention(q, q, q, backend="fastest")


# ---------------------------------------------------------------------------------------------------
# The tolerance module
# ---------------------------------------------------------------------------------------------------


def test_check_nan_output_fails():
    ref = torch.zeros(4, dtype=torch.float64)
    out = torch.tensor([0.0, float("nan"), 0.0, 0.0])
    result = tolerance.check("o", out, ref, torch.zeros(4), F32)
    assert not result.ok
    assert math.isnan(result.max_abs)


def test_check_inf_output_fails():
    ref = torch.zeros(4, dtype=torch.float64)
    out = torch.tensor([0.0, float("inf"), 0.0, 0.0], dtype=F16)
    assert not tolerance.check("o", out, ref, torch.zeros(4, dtype=F16), F16).ok


@pytest.mark.parametrize("dtype", [F16, F32, BF16], ids=["f16", "f32", "bf16"])
def test_bound_is_twice_pytorch_error_plus_floor(dtype):
    ref = torch.zeros(4, dtype=torch.float64)
    same_precision = torch.tensor([0.0, -0.25, 0.125, 0.0], dtype=dtype)  # PyTorch max-abs error 0.25
    floor = tolerance.FLOOR[dtype]
    at_bound = torch.tensor([0.5, 0.0, 0.0, 0.0], dtype=torch.float64)  # 2 × 0.25, under the bound
    result = tolerance.check("o", at_bound.to(dtype), ref, same_precision, dtype)
    assert result.ref_err == 0.25
    assert result.bound == pytest.approx(2 * 0.25 + floor, rel=1e-12)
    assert result.ok
    over = torch.tensor([0.5 + 4 * floor, 0.0, 0.0, 0.0], dtype=torch.float64)  # past 2×0.25 + floor
    assert not tolerance.check("o", over, ref, same_precision, dtype).ok


def test_error_stats_max_abs_and_rms():
    ref = torch.zeros(4, dtype=torch.float64)
    out = torch.tensor([3.0, -4.0, 0.0, 0.0])
    assert tolerance.error_stats(out, ref) == (4.0, pytest.approx(2.5))


def test_nan_in_pytorch_error_falls_back_to_floor():
    ref = torch.zeros(2, dtype=torch.float64)
    result = tolerance.check("o", torch.zeros(2), ref, torch.tensor([float("nan"), 0.0]), F32)
    assert result.ref_err == 0.0 and result.bound == tolerance.FLOOR[F32]


def test_check_unknown_dtype():
    z = torch.zeros(2, dtype=torch.float64)
    with pytest.raises(ValueError, match="no tolerance floor"):
        tolerance.check("o", z, z, z, torch.float64)


def test_assert_close_message_names_tensor():
    ref = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(AssertionError, match=r"^attn-out-7: max-abs error 1\.000e\+00.*bound") as info:
        tolerance.assert_close("attn-out-7", torch.tensor([0.0, 1.0, 0.0]), ref, torch.zeros(3), F32)
    assert "RMS" in str(info.value)
    passed = tolerance.assert_close("fine", torch.zeros(3), ref, torch.zeros(3), F32)
    assert passed.ok and passed.max_abs == 0.0


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_autotuned_path_on_gpu(causal, monkeypatch):
    """The tuner picks one of the default configs; later calls of the shape launch it directly."""
    monkeypatch.delenv(fa2.CONFIG_ENV, raising=False)
    case = Case(2, 3, 257, 257, 128, causal, BF16)
    q, k, v = _inputs(case, "cuda")
    first, _ = fa2.forward(q, k, v, causal=causal)  # tunes
    chosen = fa2.last_config()
    assert chosen in fa2.default_configs()
    second, _ = fa2.forward(q, k, v, causal=causal)  # direct launch of the chosen config
    assert fa2.last_config() == chosen
    assert torch.equal(first, second)
    assert_matches_reference("fa2 out (autotuned)", second, q, k, v, causal)


@pytest.mark.parametrize("n", [1, 64, 65, 300])
def test_online_softmax_reference_is_exact_with_rescaling(n):
    gen = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(s, 32, generator=gen, dtype=torch.float64) for s in (7, n, n))
    exact = reference.reference_attention(q[None, None], k[None, None], v[None, None])[0, 0]
    torch.testing.assert_close(reference.online_softmax_attention(q, k, v, block=64), exact, rtol=1e-12, atol=1e-12)


def test_online_softmax_reference_without_rescaling_is_wrong_from_the_second_block():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, 32, generator=gen, dtype=torch.float64) for s in (16, 128, 128))

    def exact(keys):
        return reference.reference_attention(q[None, None], k[None, None, :keys], v[None, None, :keys])[0, 0]

    one_block = reference.online_softmax_attention(q, k[:64], v[:64], block=64, rescale=False)
    torch.testing.assert_close(one_block, exact(64))
    two_blocks = reference.online_softmax_attention(q, k, v, block=64, rescale=False)
    assert (two_blocks - exact(128)).abs().max() > 1e-2
