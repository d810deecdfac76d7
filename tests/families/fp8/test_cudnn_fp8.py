"""cuDNN's FP8 attention beside ours (``cudnn-fp8``, ``analysis.families._shared.peers``) in ``fp8-speed``: an
``absent`` row without the cuDNN frontend (this machine); its gate on the CPU with a stand-in for the graph (the
e4m3 output dequantised, bounded by the replica of P's and the output's e4m3 rounding); the real graph on a GPU
where it is installed (GPU-marked)."""

from __future__ import annotations

import math

import pytest
import torch
from figure_helpers import ATTENTION

from analysis.families._shared import peers
from analysis.families.fp8 import run as fp8
from analysis.families.fp8.plan import Fp8Spec as Spec
from kernels.attention import reference


def _spec(**kw) -> Spec:
    fields = dict(
        experiment="fp8-speed",
        dtype="float16",
        head_dim=32,
        causal=True,
        seqlens=[64],
        tokens=128,
        hidden=64,
        impls=["ours-fp8-tensor", "cudnn-fp8"],
        check_rows=16,
    )
    fields.update(kw)
    return Spec(**fields)


class StandIn:
    """What cuDNN's graph computes, in float64 on the CPU: attention of the dequantised inputs with P · 256 cast to
    e4m3, the output times ``out_scale`` cast to e4m3 (``scaled=False``: a wrong graph that forgets that scale)."""

    scaled = True

    def __init__(self, q8, k8, v8, qs, ks, vs, causal):
        self.out_scale = peers.output_scale(float(vs))
        self.inputs = [x8.double() * float(s) for x8, s in ((q8, qs), (k8, ks), (v8, vs))]
        self.causal = causal

    def __call__(self):
        q, k, v = self.inputs
        rows = torch.arange(q.shape[2])
        o = reference.p_rounded_attention_rows(q, k, v, rows, self.causal, p_scale=peers.P_SCALE)
        return (o * (self.out_scale if self.scaled else 1.0)).to(torch.float8_e4m3fn)


@pytest.fixture
def installed(monkeypatch):
    monkeypatch.setattr(peers, "absent", lambda impl: "")
    monkeypatch.setattr(peers, "CudnnFP8", StandIn)


def test_without_the_frontend_its_rows_are_absent(env, monkeypatch):
    def refuse(name):
        raise ModuleNotFoundError(f"No module named {name!r}")

    peers.absent.cache_clear()
    monkeypatch.setattr(peers, "_import", refuse)
    try:
        df = ATTENTION.frame(fp8.run(_spec(seqlens=[64, 128], tokens=256), env, device="cpu", log_line=lambda s: None))
    finally:
        peers.absent.cache_clear()
    peer = df[df["impl"] == "cudnn-fp8"]
    assert len(peer) == 2 and (peer["status"] == "absent").all()
    assert peer["message"].str.contains("No module named 'cudnn'").all()
    assert (df.loc[df["impl"] == "ours-fp8-tensor", "status"] == "ok").all()


def test_its_e4m3_output_is_gated_like_our_fp8_rows(env, installed):
    df = ATTENTION.frame(fp8.run(_spec(), env, device="cpu", log_line=lambda s: None))
    row = df[df["impl"] == "cudnn-fp8"].iloc[0]
    assert row["status"] == "ok", row["message"]
    # the error is the e4m3 output's, which the replica has too: within the bound, and of the replica's size
    assert 0 < row["max_abs_err"] <= row["err_bound"] and row["max_abs_err"] <= 1.5 * row["ref_err"]
    assert "e4m3 output" in row["message"] and "quantised per tensor before timing" in row["message"]
    assert "P scale 256" in row["kernel_config"] and "e4m3 output ×" in row["kernel_config"]
    # FP8's accuracy is far from bf16's: the output rounding dominates ours' (a bf16 output)
    ours = df[df["impl"] == "ours-fp8-tensor"].iloc[0]
    assert row["rms_err"] > ours["rms_err"]


def test_an_output_read_at_the_wrong_scale_is_a_mismatch(env, installed, monkeypatch):
    monkeypatch.setattr(StandIn, "scaled", False)
    row = [r for r in fp8.run(_spec(), env, device="cpu", log_line=lambda s: None) if r["impl"] == "cudnn-fp8"][0]
    assert row["status"] == "mismatch" and "cudnn-fp8 output" in row["message"]
    assert math.isnan(row["ms_median"])


@pytest.mark.parametrize("amax", [0.3, 4.7, 5.0, 448.0, 3000.0])
def test_the_output_scale_keeps_the_output_inside_e4m3(amax):
    scale = peers.output_scale(amax / 448)
    assert math.log2(scale) == int(math.log2(scale))  # a power of two: dequantising is exact
    assert amax * scale <= 448 < 2 * amax * scale  # |O| ≤ max|V| fits, and no larger power of two would


@pytest.mark.gpu
def test_cudnn_fp8_on_the_gpu_is_gated_then_timed(env):
    pytest.importorskip("cudnn", reason="the cuDNN frontend is not installed (pip install '.[peers]')")
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("cuDNN's FP8 attention with an e4m3 output is checked on Hopper")
    spec = _spec(dtype="bfloat16", head_dim=128, seqlens=[1024], tokens=2048, hidden=2048, warmup_ms=5, rep_ms=20)
    df = ATTENTION.frame(fp8.run(spec, env, device="cuda", log_line=lambda s: None))
    row = df[df["impl"] == "cudnn-fp8"].iloc[0]
    assert row["status"] == "ok", row["message"]
    assert row["max_abs_err"] <= row["err_bound"] and row["tflops"] > 0
    assert "nvidia-cudnn-frontend" in row["kernel_config"]
