"""The official kernels beside ours (``analysis.families._shared.peers``): FlashAttention's own (``upstream-fa``) in
the attention experiments. Without them installed (this machine) their rows say ``absent``, never a crash or a gap;
the measuring path they take (their [B, N, H, d] layout, copied before timing; the gates) runs on the CPU with a
stand-in for the kernel; the GPU-marked tests run the real one where it is installed."""

from __future__ import annotations

import math

import pytest
import torch
from figure_helpers import ATTENTION

from analysis import budget, configuration, registry
from analysis.families._shared import attention_plan, peers
from analysis.families.attention import plan
from analysis.families.attention.run import run as run_shard
from analysis.report import provenance
from kernels.attention import reference


def _spec(**kw) -> plan.Spec:
    fields = dict(
        experiment="fa2-setting",
        dtype="float16",
        head_dim=16,
        causal=True,
        seqlens=[40],
        impls=["ours-fa2", "upstream-fa"],
        tokens=80,
        hidden=32,
        check_rows=16,
    )
    fields.update(kw)
    return plan.Spec(**fields)


@pytest.fixture
def not_installed(monkeypatch):
    """Every peer fails to import, whatever this machine has installed."""

    def refuse(name, *args, **kwargs):
        raise ModuleNotFoundError(f"No module named {name.split('.')[0]!r}")

    peers.absent.cache_clear()
    monkeypatch.setattr(peers, "_import", refuse)
    yield
    peers.absent.cache_clear()


@pytest.fixture
def stand_in(monkeypatch):
    """``upstream-fa`` installed, its kernel replaced by three-step attention that insists on [B, N, H, d] inputs
    (what the measuring code must hand it) and returns FlashAttention's (out, lse) pair."""
    seen = []

    def fake(q, k, v, causal):
        assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
        seen.append((tuple(q.shape), q.requires_grad))
        out = reference.naive_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal)
        return out.transpose(1, 2)

    monkeypatch.setattr(peers, "absent", lambda impl: "")
    monkeypatch.setattr(peers, "upstream_fa", fake)
    return seen


# --- not installed: absent rows -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["fwd", "bwd"])
def test_a_peer_that_is_not_installed_is_an_absent_row(env, fake_timing, not_installed, mode):
    rows = run_shard(_spec(mode=mode, seqlens=[40, 64]), env, device="cpu", log_line=lambda s: None)
    df = ATTENTION.frame(rows)  # the status is in the table's vocabulary
    peer = df[df["impl"] == "upstream-fa"]
    assert len(peer) == 2 and (peer["status"] == "absent").all()
    assert peer["message"].str.contains(r"not installed here \(pip install '\.\[peers\]'\)").all()
    assert peer["message"].str.contains("No module named 'flash_attn'").all()
    assert peer["ms_median"].isna().all() and peer["max_abs_err"].isna().all()  # nothing ran
    assert (df.loc[df["impl"] == "ours-fa2", "status"] == "ok").all()  # the shard's other rows are measured
    assert fake_timing == [(25, 100)] * 2  # ours only: the absent rows were never timed


def test_absent_says_why_and_caches_nothing_for_other_implementations(not_installed):
    assert peers.absent("ours-fa2") == "" and peers.absent("sdpa-cudnn") == ""
    why = peers.absent("cudnn-fp8")
    assert why.startswith("cuDNN's FP8 attention (cuDNN frontend, sdpa_fp8) is not installed here")
    assert len(why) <= 300


def test_versions_read_the_installed_packages_without_importing_them(monkeypatch):
    installed = {"flash-attn-4": "4.0.0b40", "nvidia-cutlass-dsl": "4.8.1"}

    def version(name):
        if name not in installed:
            raise peers.metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(peers.metadata, "version", version)
    found = peers.versions()
    assert set(found) == set(peers.PEERS)
    assert found["upstream-fa"]["flash-attn-4"] == "4.0.0b40" and found["upstream-fa"]["quack-kernels"] is None
    assert peers.version_text(found["upstream-fa"]) == "flash-attn-4 4.0.0b40, nvidia-cutlass-dsl 4.8.1"
    assert peers.version_text(found["cudnn-fp8"]) == "not installed"
    assert peers.kernel_config("upstream-fa") == (
        "flash_attn.cute.flash_attn_func (flash-attn-4 4.0.0b40, nvidia-cutlass-dsl 4.8.1)"
    )


def test_the_environment_record_names_the_peers_versions(tmp_path):
    import json

    from analysis import pipeline

    env = pipeline.record_environment("cpu", tmp_path / "environment.json")
    written = json.loads((tmp_path / "environment.json").read_text())
    assert written["peers"] == env["peers"] == peers.versions()
    assert set(written["peers"]) == {"upstream-fa", "cudnn-fp8"}


def test_the_report_says_which_peers_ran():
    def rows(statuses, impl="upstream-fa"):
        return ATTENTION.frame(
            [{**_base_row(), "impl": impl, "status": s, "message": "" if s == "ok" else "why"} for s in statuses]
        )

    env = {"peers": {"upstream-fa": {"flash-attn-4": "4.0.0b40"}, "cudnn-fp8": {"nvidia-cudnn-frontend": None}}}
    text = provenance.peers_text([rows(["ok", "ok", "error"]), rows(["absent"] * 3, "cudnn-fp8")], env)
    assert text == "upstream-fa (flash-attn-4 4.0.0b40): 2 of 3 rows finished; cudnn-fp8 not installed (3 rows absent)"
    # a result set measured before the peers existed has no row of them: nothing to say
    assert provenance.peers_text([rows(["ok"], "ours-fa2")], {}) == ""
    # rows without the versions (an environment.json written before they were recorded)
    assert provenance.peers_text([rows(["ok"])], {}) == "upstream-fa (versions not recorded): 1 of 1 row finished"


def _base_row() -> dict:
    row = dict.fromkeys(ATTENTION.columns, math.nan)
    row.update(
        experiment="fa2-setting",
        family="attention",
        op="attention",
        dtype="float16",
        mode="fwd",
        batch=1,
        heads=2,
        heads_kv=2,
        seqlen_q=64,
        seqlen_k=64,
        head_dim=16,
        causal=False,
        inputs="normal",
        timed=False,
        kernel_config="",
        timestamp="2026-01-01T00:00:00Z",
    )
    return row


# --- the measuring path, with a stand-in for the kernel --------------------------------------------------------


@pytest.mark.parametrize("mode", ["fwd", "bwd", "fwd+bwd"])
def test_the_peer_gets_its_own_layout_and_is_gated_like_ours(env, fake_timing, stand_in, mode):
    spec = _spec(mode=mode, seqlens=[40], heads_kv=1, hidden=64, impls=["upstream-fa"])  # 4 query heads on 1 K/V
    rows = run_shard(spec, env, device="cpu", log_line=lambda s: None)
    (row,) = ATTENTION.frame(rows).to_dict("records")
    assert row["status"] == "ok", row["message"]
    assert row["max_abs_err"] <= row["err_bound"] and row["ms_median"] > 0
    b, h, n, _ = spec.shape(0)
    d = spec.head_dim
    # its [B, N, H, d] inputs, made before timing; with gradients in the gradient modes
    assert stand_in[0] == ((b, n, h, d), mode != "fwd")
    assert row["kernel_config"].startswith("flash_attn.cute.flash_attn_func (")


def test_a_wrong_peer_output_is_a_mismatch_never_timed(env, fake_timing, stand_in, monkeypatch):
    # read in the wrong layout: the heads and the sequence swapped back the wrong way
    monkeypatch.setattr(peers, "upstream_fa", lambda q, k, v, causal: torch.zeros_like(q) + q.mean())
    (row,) = run_shard(_spec(impls=["upstream-fa"]), env, device="cpu", log_line=lambda s: None)
    assert row["status"] == "mismatch" and "upstream-fa output" in row["message"]
    assert fake_timing == []


@pytest.mark.parametrize(
    "dtype, d, device, error, match",
    [
        pytest.param(torch.float32, 64, "cpu", TypeError, "float16 or bfloat16", id="float32"),
        pytest.param(torch.float16, 12, "cpu", ValueError, "multiples of 8", id="head-dim"),
        pytest.param(torch.float16, 264, "cpu", ValueError, "head dims 8-256", id="head-dim-256"),
        pytest.param(torch.float16, 64, "cpu", ValueError, "CUDA GPUs", id="cpu"),
    ],
)
def test_upstream_refuses_what_it_does_not_run_before_calling_it(dtype, d, device, error, match):
    q = torch.zeros((1, 8, 2, d), dtype=dtype, device=device)
    with pytest.raises(error, match=match):
        peers.upstream_fa(q, q, q, False)


# --- planning: names, the Llama heads entry, the cost ---------------------------------------------------------


def test_the_default_grid_has_upstream_rows_and_the_llama_heads_entry():
    config = configuration.load_config(["workflow/config.yaml"])
    shards = registry.family("attention").shards(config)
    fa2 = [f for f in shards.values() if f["experiment"] == "fa2-setting" and "upstream-fa" in f["impls"]]
    assert {f["mode"] for f in fa2} == {"fwd", "bwd"} and {f["dtype"] for f in fa2} == {"float16", "bfloat16"}
    llama = {name: f for name, f in shards.items() if f["experiment"] == "llama3-70b-heads"}
    assert sorted(llama) == [
        "llama3-70b-heads_bfloat16_d128_causal",
        "llama3-70b-heads_bfloat16_d128_causal_bwd",
        "llama3-70b-heads_bfloat16_d128_full",
        "llama3-70b-heads_bfloat16_d128_full_bwd",
    ]
    for f in llama.values():
        spec = plan.spec(f)
        assert spec.shape(0) == (1, 64, 8192, 8192) and spec.kv_heads(64) == 8
        assert {"ours-fa2", "sdpa-cudnn", "upstream-fa"} <= set(f["impls"])
        assert ("ours-fa3" in f["impls"]) == (f["mode"] == "fwd")  # our FA-3 is a forward kernel


def test_upstream_runs_only_where_it_is_planned():
    with pytest.raises(ValueError, match=r"\['upstream-fa'\] do not belong to experiment 'gain-surface'"):
        _spec(experiment="gain-surface", heads=2)
    assert "upstream-fa" in plan.IMPLS and "upstream-fa" in attention_plan.CALLABLE_IMPLS


def test_the_cost_counts_upstreams_compiles_once_per_kernel():
    fwd = dict(_spec(impls=["upstream-fa"], seqlens=[1024, 4096]).__dict__)
    keys = plan.compile_keys(fwd)
    assert keys == {("cute", "upstream-fa", "float16", 16, True, 1)}  # one kernel for both N
    bwd = plan.compile_keys({**fwd, "mode": "bwd"})
    assert ("cute-bwd", "upstream-fa", "float16", 16, True, 1) in bwd
    grouped = plan.compile_keys({**fwd, "hidden": 64, "heads_kv": 1, "experiment": "fa2-setting"})
    assert {k[-1] for k in grouped if k[0] == "cute"} == {4}  # 4 query heads per K/V head: its own kernel
    assert attention_plan.COMPILE_S["cute"] > 0 and attention_plan.COMPILE_S["cute-bwd"] > 0


def test_the_budget_quotes_the_peers_cost():
    config = configuration.load_config(["workflow/config.yaml"])
    table = budget.budget(registry.family("attention"), config)
    assert table["llama3-70b-heads"]["points"] == 16 and table["llama3-70b-heads"]["compile"] > 0


# --- on the GPU, where the peer is installed --------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fwd", "bwd"])
def test_upstream_on_the_gpu_is_gated_then_timed(env, mode):
    pytest.importorskip("flash_attn.cute", reason="flash-attn-4 is not installed (pip install '.[peers]')")
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("upstream-fa's backward and its Hopper kernels need sm_90")
    spec = plan.Spec(
        experiment="llama3-70b-heads",
        dtype="bfloat16",
        head_dim=128,
        causal=True,
        seqlens=[1024],
        impls=["ours-fa2", "upstream-fa"],
        mode=mode,
        batch=1,
        heads=8,
        heads_kv=2,
        warmup_ms=5,
        rep_ms=20,
    )
    df = ATTENTION.frame(run_shard(spec, env, device="cuda", log_line=lambda s: None))
    peer = df[df["impl"] == "upstream-fa"].iloc[0]
    assert peer["status"] == "ok", peer["message"]
    assert peer["max_abs_err"] <= peer["err_bound"] and peer["tflops"] > 0
    assert peer["ms_p20"] <= peer["ms_median"] <= peer["ms_p80"]
    assert "flash-attn-4" in peer["kernel_config"]
