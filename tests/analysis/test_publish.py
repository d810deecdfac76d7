"""Publishing a GPU's results as the reference set: byte-for-byte copies, a manifest of SHA-256 sums, and
refusals for tables that name another GPU type or, unless allowed and recorded, several commits."""

from __future__ import annotations

import hashlib
import json
import math

import pytest

from analysis import publish, registry

ATTENTION, OPS = registry.table("attention"), registry.table("ops")

SHA_A, SHA_B = "a" * 40, "b" * 40


def _row(sha: str, gpu: str = "h200", **over) -> dict:
    r = {c: math.nan for c in ATTENTION.columns}
    r.update(
        experiment="fa2-setting",
        family="attention",
        op="attention",
        impl="ours-fa2",
        dtype="float16",
        mode="fwd",
        batch=1,
        heads=1,
        heads_kv=1,
        seqlen_q=128,
        seqlen_k=128,
        head_dim=64,
        causal=False,
        inputs="normal",
        status="ok",
        message="",
        timed=True,
        ms_median=0.1,
        ms_p20=0.09,
        ms_p80=0.11,
        gpu=gpu,
        gpu_name="NVIDIA H200",
        git_sha=sha,
        timestamp="2026-01-01T00:00:00Z",
        kernel_config="",
    )
    r.update(over)
    return r


def _results(tmp_path, rows):
    res = tmp_path / "results"
    (res / "h200" / "attention").mkdir(parents=True)
    ATTENTION.write_rows(rows, res / "h200" / "attention.csv")
    ATTENTION.write_rows(rows[:1], res / "h200" / "attention" / "shard.csv")
    env = {
        "gpu": "h200",
        "gpu_name": "NVIDIA H200",
        "torch": "2.11.0",
        "triton": "3.6.0",
        "git_sha": rows[0]["git_sha"],
    }
    (res / "h200" / "environment.json").write_text(json.dumps(env))
    (res / "logs" / "h200" / "attention" / "shard").mkdir(parents=True)
    (res / "logs" / "h200" / "attention" / "shard.log").write_text("ran\n")
    (res / "logs" / "h200" / "attention" / "shard" / "side.txt").write_text("a job's side file\n")
    (res / "report" / "h200" / "attention").mkdir(parents=True)
    (res / "report" / "h200" / "attention" / "figure.png").write_bytes(b"png")
    (res / "h200" / "summary.md").write_text("derived\n")
    return res


def test_publish_copies_and_writes_a_checkable_manifest(tmp_path):
    res = _results(tmp_path, [_row(SHA_A), _row(SHA_A, seqlen_q=256, seqlen_k=256)])
    out = publish.publish("h200", res, tmp_path / "ref", command="snakemake --cores all")
    manifest = json.loads((out / "MANIFEST.json").read_text())
    assert manifest["git_sha"] == SHA_A and manifest["rows"] == 2 and manifest["command"]
    assert "rows_per_commit" not in manifest
    assert manifest["measured_code_checked"] is False  # an environment from before the record: not checked
    for name, digest in manifest["files"].items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
    assert (out / "attention.csv").read_bytes() == (res / "h200" / "attention.csv").read_bytes()
    assert (out / "jobs" / "attention" / "shard.csv").is_file()
    assert (out / "logs" / "attention" / "shard.log").is_file()
    assert (out / "logs" / "attention" / "shard" / "side.txt").is_file()
    assert (out / "figures" / "attention" / "figure.png").is_file()
    assert not (out / "summary.md").exists() and "summary.md" not in manifest["files"]  # derived, not published
    assert manifest["tables"] == {"attention": {"rows": 2, "statuses": {"ok": 2}, "rows_per_commit": {SHA_A: 2}}}


def test_publish_refuses_a_run_whose_code_is_not_its_commits(tmp_path, monkeypatch):
    """environment.json records the measured code as the run found it; publishing compares it with the
    commit's (a commit pinned through the environment that is not the code that ran, or uncommitted edits)."""
    res = _results(tmp_path, [_row(SHA_A)])
    env_json = res / "h200" / "environment.json"
    committed = {"kernels/attention/fa3.py": "1" * 40, "kernels/attention/fp8.py": "2" * 40}
    asked = []
    monkeypatch.setattr(publish, "measured_code_at", lambda sha, repo=None: asked.append(sha) or dict(committed))
    env = json.loads(env_json.read_text())
    env_json.write_text(json.dumps({**env, "measured_code": {**committed, "kernels/attention/fa3.py": "3" * 40}}))
    with pytest.raises(ValueError, match=r"not commit aaaaaaaaaaaa's \(kernels/attention/fa3.py differ\)"):
        publish.publish("h200", res, tmp_path / "ref")
    assert asked == [SHA_A] and not (tmp_path / "ref").exists()  # refused before anything was written
    env_json.write_text(json.dumps({**env, "git_sha": SHA_A + "-dirty", "measured_code": committed}))
    out = publish.publish("h200", res, tmp_path / "ref")  # dirty elsewhere: the measured code is the commit's
    assert json.loads((out / "MANIFEST.json").read_text())["measured_code_checked"] is True


def test_publish_refuses_other_gpu_types(tmp_path):
    res = _results(tmp_path, [_row(SHA_A), _row(SHA_A, gpu="a100-sxm4-80gb")])
    with pytest.raises(ValueError, match="GPU types"):
        publish.publish("h200", res, tmp_path / "ref")


def test_publish_refuses_ops_rows_of_other_gpu_types(tmp_path):
    res = _results(tmp_path, [_row(SHA_A)])
    OPS.write_rows([_ops_row(SHA_A), _ops_row(SHA_A, gpu="a100-sxm4-80gb")], res / "h200" / "ops.csv")
    with pytest.raises(ValueError, match="ops.csv holds rows of GPU types"):
        publish.publish("h200", res, tmp_path / "ref")


def test_mixed_commits_need_allow_mixed_and_are_recorded(tmp_path, monkeypatch):
    res = _results(tmp_path, [_row(SHA_A), _row(SHA_A, seqlen_q=256), _row(SHA_B, seqlen_q=512)])
    with pytest.raises(ValueError, match="several commits"):
        publish.publish("h200", res, tmp_path / "ref")
    seen = []

    def fake_diff(shas, repo=None):
        seen.append(shas)
        return {f"{shas[0][:12]}..{shas[1][:12]}": ["kernels/attention/decode.py"]}

    monkeypatch.setattr(publish, "measured_code_diff", fake_diff)
    out = publish.publish("h200", res, tmp_path / "ref", allow_mixed=True)
    manifest = json.loads((out / "MANIFEST.json").read_text())
    assert manifest["git_sha"] == SHA_A  # the commit of most rows
    assert manifest["rows_per_commit"] == {SHA_A: 2, SHA_B: 1}
    assert manifest["measured_code_changes"] == {"aaaaaaaaaaaa..bbbbbbbbbbbb": ["kernels/attention/decode.py"]}
    assert seen == [[SHA_A, SHA_B]]


def test_measured_code_diff_asks_git_about_the_measured_code_only(monkeypatch):
    calls = []

    class Done:
        stdout = "kernels/attention/decode.py\n"

    monkeypatch.setattr(publish.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or Done())
    assert publish.measured_code_diff([SHA_A, SHA_B]) == {"aaaaaaaaaaaa..bbbbbbbbbbbb": ["kernels/attention/decode.py"]}
    assert calls[0][:5] == ["git", "diff", "--name-only", SHA_A, SHA_B]
    assert calls[0][6:] == publish.MEASURED_CODE


def _ops_row(sha: str, **over) -> dict:
    r = {c: math.nan for c in OPS.columns}
    r.update(
        experiment="moe",
        family="moe",
        op="grouped-gemm",
        impl="ours-grouped",
        dtype="bfloat16",
        model="qwen",
        stage="total",
        status="ok",
        message="",
        timed=True,
        ms_median=0.1,
        ms_p20=0.09,
        ms_p80=0.11,
        gpu="h200",
        git_sha=sha,
        kernel_config="",
    )
    r.update(over)
    return r


def test_ops_rows_are_counted_per_commit_and_their_commits_are_mixed_in(tmp_path, monkeypatch):
    """ops.csv is copied, its rows and commits go into the manifest, and a commit of the ops rows alone
    makes the results mixed: refused unless allowed, then its measured-code changes are recorded."""
    res = _results(tmp_path, [_row(SHA_A)])
    OPS.write_rows(
        [_ops_row(SHA_B), _ops_row(SHA_B, impl="torch-grouped-mm", status="unsupported", message="not available")],
        res / "h200" / "ops.csv",
    )
    with pytest.raises(ValueError, match="several commits"):
        publish.publish("h200", res, tmp_path / "ref")
    assert not (tmp_path / "ref" / "h200").exists()  # refused before anything was written
    monkeypatch.setattr(publish, "measured_code_diff", lambda shas, repo=None: {"a..b": ["kernels/moe/ffn.py"]})
    out = publish.publish("h200", res, tmp_path / "ref", allow_mixed=True)
    manifest = json.loads((out / "MANIFEST.json").read_text())
    assert manifest["tables"]["ops"] == {
        "rows": 2,
        "statuses": {"ok": 1, "unsupported": 1},
        "rows_per_commit": {SHA_B: 2},
    }
    assert manifest["git_sha"] == SHA_B and manifest["rows_per_commit"] == {SHA_B: 2, SHA_A: 1}
    assert manifest["measured_code_changes"] == {"a..b": ["kernels/moe/ffn.py"]}
    assert (out / "ops.csv").read_bytes() == (res / "h200" / "ops.csv").read_bytes()
