"""The decode-serving experiment: its plan (points, shards, the bound on a point's tokens, costs) and its run
at tiny sizes through Triton's interpreter, with the harness's GPU parts faked (tests/fake_harness.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from fake_harness import MS

from analysis import registry
from analysis.configuration import load_config
from analysis.core.models import decode_batch_bytes, decode_gather_bytes
from analysis.families.attention import plan
from analysis.families.attention.run import run as run_shard
from analysis.families.attention.serving_plan import SERVING_IMPLS, ServingSpec, context_lengths

ATTENTION = registry.table("attention")
CONFIG = Path(__file__).resolve().parents[3] / "workflow"


def _spec(**kw) -> ServingSpec:
    fields = dict(
        dtype="float16",
        head_dim=16,
        heads=8,
        heads_kv=2,
        page_size=8,
        seqlen_q=2,
        batches=[1, 3],
        contexts=[20, 40],
        impls=list(SERVING_IMPLS),
        max_tokens=100,
    )
    fields.update(kw)
    return ServingSpec(**fields)


def test_points_stay_within_max_tokens_and_lengths_are_mixed_and_reproducible():
    s = _spec()
    assert s.grid() == [(1, 20), (1, 40), (3, 20)]  # 3 × 40 = 120 tokens is over the bound
    assert s.points() == 3 * len(SERVING_IMPLS)
    lens = s.lengths(2)
    assert lens[0] == 20 and all(10 <= n <= 20 for n in lens) and lens == s.lengths(2)
    many = context_lengths(64, 8192, 0.5, 0)
    assert many[0] == 8192 and min(many) >= 4096 and len(set(many)) > 32
    assert context_lengths(4, 100, 0.0, 0) == [100] * 4
    assert s.shape(1) == (1, 8, 2, 40)


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"impls": ["ours-fa2"]}, r"do not belong to 'decode-serving'"),
        ({"heads_kv": 3}, "heads_kv 3 must divide heads 8"),
        ({"seqlen_q": 17}, "1 to 16 new tokens"),
        ({"max_tokens": 10}, "no point of batches"),
        ({"layout": "bshd"}, "layout 'bshd'"),
        ({"spread": 1.0}, r"spread 1.0 \(in \[0, 1\)\)"),
    ],
)
def test_bad_specs_are_refused(overrides, match):
    with pytest.raises(ValueError, match=match):
        _spec(**overrides)


def test_the_default_and_full_configs_plan_serving_shards():
    config = load_config([CONFIG / "config.yaml"])
    shards = {n: f for n, f in plan.shards(config).items() if f["experiment"] == "decode-serving"}
    assert list(shards) == ["decode-serving_float16_d128_causal_h64_hkv8_p64_q1"]
    s = plan.spec(shards["decode-serving_float16_d128_causal_h64_hkv8_p64_q1"])
    assert isinstance(s, ServingSpec) and s.grid() == [(1, 8192), (1, 32768), (64, 8192), (64, 32768)]
    full = load_config([CONFIG / "config.yaml", CONFIG / "config-full.yaml"])
    fulls = [f for f in plan.shards(full).values() if f["experiment"] == "decode-serving"]
    assert len(fulls) == 12
    big = plan.spec(fulls[0])
    assert all(b * c <= big.max_tokens for b, c in big.grid()) and (256, 131072) not in big.grid()
    assert plan.estimate_seconds(fulls[0]) > plan.estimate_seconds(shards[next(iter(shards))])
    assert {k[1] for k in plan.compile_keys(fulls[0])} == {"ours-paged", "ours-paged-unpacked", "ours-decode"}


def test_a_bad_serving_section_names_itself():
    config = load_config([CONFIG / "config.yaml"])
    config["attention"]["decode_serving"]["heads"] = [[64, 7]]
    with pytest.raises(
        ValueError, match=r"attention.decode_serving \(shard decode-serving_float16_d128_causal_h64_hkv7"
    ):
        plan.shards(config)


def test_run_measures_every_implementation_on_the_cpu(env, fake_timing):
    s = _spec()
    lines: list[str] = []
    rows = run_shard(s, env, device="cpu", log_line=lines.append)
    df = ATTENTION.frame(rows)  # every row fits the attention table's schema
    assert len(df) == s.points() and len(lines) == s.points()
    assert set(df["experiment"]) == {"decode-serving"} and set(df["page_size"]) == {8}
    status = df.groupby("impl")["status"].agg(set).to_dict()
    for impl in ("ours-paged", "ours-paged-unpacked", "ours-decode", "gather-kv", "copy-kv"):
        assert status[impl] == {"ok"}, df[df["impl"] == impl]["message"].tolist()
    assert status["upstream-fa-paged"] == {"unsupported"}  # no upstream FlashAttention on this machine
    assert df[df["impl"] == "upstream-fa-paged"]["message"].str.contains("no upstream FlashAttention").all()
    assert {"ok", "unsupported"} >= status["sdpa-efficient-gathered"]  # PyTorch's CPU backends may refuse it
    for i, (b, c) in enumerate(s.grid()):
        lens = s.lengths(i)
        point = df[(df["batch"] == b) & (df["seqlen_k"] == c)]
        paged = point[point["impl"] == "ours-paged"].iloc[0]
        assert paged["tokens"] == sum(lens)
        model = decode_batch_bytes(lens, 8, 2, 2, 16, 2, page_size=8)
        assert paged["model_bytes"] == model and math.isclose(paged["gbps"], model / (MS * 1e-3) / 1e9)
        assert paged["max_abs_err"] <= paged["err_bound"] and paged["kernel_config"].startswith("num_splits=")
        gather = point[point["impl"] == "gather-kv"].iloc[0]
        assert gather["model_bytes"] == decode_gather_bytes(lens, 2, 16, 2)
    assert all(w == 10 and r == 50 for w, r in fake_timing)  # the experiment's own timing


def test_a_wrong_kernel_is_a_mismatch_row_never_timed(env, fake_timing, monkeypatch):
    from analysis.families.attention import serving

    real = serving.decode.paged_forward

    def off_by_one(q, k, v, table, lens, *args, **kw):
        return real(q, k, v, table, lens - 1, *args, **kw)  # drops every request's last key

    monkeypatch.setattr(serving.decode, "paged_forward", off_by_one)
    rows = run_shard(_spec(batches=[3], contexts=[20], impls=["ours-paged"]), env, device="cpu", log_line=print)
    assert [r["status"] for r in rows] == ["mismatch"] and math.isnan(rows[0]["ms_median"])
    assert "ours-paged output" in rows[0]["message"] and not fake_timing


def test_the_gathered_copy_is_every_request_s_keys_then_zeros():
    from analysis.families.attention.serving import Batch

    s = _spec(batches=[3], contexts=[20])
    lens = s.lengths(0)
    p = Batch(s, lens, torch.float16, "cpu", torch.Generator().manual_seed(0))
    for r, n in enumerate(lens):
        pages = p.table[r].tolist()
        keys = torch.cat([p.k[pages[j // 8], j % 8] for j in range(n)]).reshape(n, 2, 16).transpose(0, 1)
        assert torch.equal(p.kg[r, :, :n], keys) and torch.count_nonzero(p.kg[r, :, n:]) == 0
    assert sorted(set(p.table[p.table > 0].tolist())) == list(range(1, sum(-(-n // 8) for n in lens)))


def test_the_figure_draws_shares_of_the_copy_bandwidth(env, fake_timing, tmp_path):
    from analysis.families.attention.figures import FIGURES

    rows = run_shard(_spec(impls=["ours-paged", "ours-decode", "copy-kv"]), env, device="cpu", log_line=print)
    rows[1] = {**rows[1], "status": "oom", "message": "CUDA out of memory", "ms_median": math.nan, "gbps": math.nan}
    ATTENTION.write_rows(rows, tmp_path / "a.csv")
    df = ATTENTION.read_rows([tmp_path / "a.csv"])  # typed as the figures read it
    out = tmp_path / "decode_serving.png"
    frame = FIGURES["decode_serving"].draw(df, out)
    assert out.stat().st_size > 0
    ok = frame[frame["status"] == "ok"]
    assert set(ok["impl"]) == {"ours-paged", "ours-decode"}  # copy-kv is the reference, not a line
    assert (ok["share"] == ok["gbps"] / ok["copy_gbps"]).all()
    assert list(frame[frame["status"] == "oom"]["impl"]) == ["ours-decode"]


def _serving_rows(env, shares: dict[str, float], host_ms: float = 0.05) -> list[dict]:
    """Timed rows of a 64/8 grid (B 1 and 64, contexts 8K and 32K, pages 16 and 64) whose GB/s are
    ``shares[impl]`` of copy-kv's, every decoding impl moving the same bytes (so time ∝ 1 / share)."""
    from analysis.core.provenance import row_provenance
    from analysis.families._shared.attention_measure import base_row, make_row

    prov, rows = row_provenance(env), []
    for page in (16, 64):
        s = ServingSpec("float16", 128, 64, 8, page, 1, [1, 64], [8192, 32768], list(SERVING_IMPLS))
        for i, (b, c) in enumerate(s.grid()):
            base = base_row(s, prov, True, "attention", batch=b, heads=64, heads_kv=8, seqlen_q=1, seqlen_k=c)
            base.update(tokens=sum(s.lengths(i)), page_size=page)
            for impl, share in shares.items():
                gbps = 4000.0 * share
                ms = 1e9 / (gbps * 1e6)  # 1 GB of work
                host = host_ms if impl == "ours-paged" else 0.01
                rows.append(make_row(base, impl, "ok", "", ms_median=ms, ms_p20=ms, ms_p80=ms, gbps=gbps, host_ms=host))
    return rows


def test_the_serving_targets_are_judged_from_the_rows(env):
    from analysis import summary

    shares = {"copy-kv": 1.0, "ours-paged": 0.9, "ours-paged-unpacked": 0.6, "ours-decode": 0.92}
    judged = summary.targets({"attention": ATTENTION.frame(_serving_rows(env, shares))}).set_index("claim_id")
    verdict = judged["verdict"].to_dict()
    assert verdict["paged-decode-bandwidth"] == "holds" and judged.loc["paged-decode-bandwidth", "observed"] == "90%"
    assert verdict["paged-decode-bandwidth-b1"] == "holds"
    assert verdict["paged-vs-contiguous"] == "holds"  # 0.92 / 0.90 of the time: ours is 0.98× as fast
    assert verdict["packed-vs-unpacked"] == "holds" and verdict["packed-gqa-bandwidth"] == "holds"
    assert verdict["decode-host-cost"] == "holds" and verdict["paged-vs-upstream"] == "untestable"
    slow = {**shares, "ours-paged": 0.5}
    judged = summary.targets({"attention": ATTENTION.frame(_serving_rows(env, slow, host_ms=0.3))}).set_index(
        "claim_id"
    )
    assert (
        judged.loc[["paged-decode-bandwidth", "paged-vs-contiguous", "decode-host-cost"], "verdict"].eq("fails").all()
    )
    assert judged.loc["packed-vs-unpacked", "verdict"] == "fails"  # 0.5 of copy-kv against the unpacked 0.6
