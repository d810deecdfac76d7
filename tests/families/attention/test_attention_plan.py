"""The attention family's plan: its shards from the config (grids, the reuse of the traffic configs, the
experiments switched off, timing per experiment or section-wide) and the schema of its config section."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from analysis import configuration, registry
from analysis.families.attention import plan

CONFIG = Path(__file__).resolve().parents[3] / "workflow" / "config.yaml"
DEFAULT = configuration.load_config([CONFIG])


def _config(**sections) -> dict:
    """The default config with the attention experiments' sections updated."""
    config = copy.deepcopy(DEFAULT)
    for key, value in sections.items():
        config["attention"][key] = {**config["attention"][key], **value}
    return config


def test_overlapping_grids_are_refused():
    fa2 = DEFAULT["attention"]["fa2_setting"]
    twice = fa2["grids"] + [fa2["grids"][0]]
    with pytest.raises(ValueError, match="makes shard 'fa2-setting_float16_d128_full' twice"):
        plan.shards(_config(fa2_setting={"grids": twice}))


def test_block_sweep_reuses_the_traffic_configs_unless_given():
    shards = plan.shards(DEFAULT)
    assert shards["block-sweep_float16_d128_full"]["configs"] == DEFAULT["traffic"]["block_sweep"]["configs"]
    own = ["BLOCK_M=64,BLOCK_N=64,num_warps=4,num_stages=3"]
    assert plan.shards(_config(block_sweep={"configs": own}))["block-sweep_float16_d128_full"]["configs"] == own


def test_disabled_experiments_make_no_shards():
    off = {
        k: {"enabled": False}
        for k in (
            "fa1_setting",
            "gain_surface",
            "block_sweep",
            "rescale_ablation",
            "decode",
            "decode_serving",
            "varlen",
            "memory",
            "fa2_setting",
            "fa3_ablation",
            "llama3_70b_heads",
        )
    }
    assert plan.shards(_config(**off)) == {}
    config = copy.deepcopy(DEFAULT)
    config["attention"]["enabled"] = False  # the whole family off
    assert registry.family("attention").shards(config) == {} and registry.family("attention").checks(config) == {}


def test_timing_per_experiment_or_attention_wide():
    shards = plan.shards(_config(gain_surface={"warmup_ms": None, "rep_ms": 7}))
    gain = shards["gain-surface_float16_d64_full"]
    assert (gain["warmup_ms"], gain["rep_ms"]) == (25, 7)
    assert shards["fa2-setting_float16_d128_full"]["rep_ms"] == 100
    assert shards["decode_float16_d128_full_hkv2_q1"]["rep_ms"] == 50


@pytest.mark.parametrize(
    "section, bad",
    [
        pytest.param("fa1_setting", {"modes": ["forward"]}, id="mode"),
        pytest.param("decode", {"query_lens": [17]}, id="decode-query-len"),
        pytest.param("block_sweep", {"configs": ["BLOCK_M=64"]}, id="sweep-config"),
        pytest.param("varlen", {"impls": ["ours-fa2"]}, id="varlen-impl"),
        pytest.param("gain_surface", {"warmup_ms": -1}, id="timing"),
        pytest.param("memory", {"backward_n": [1]}, id="unknown-key"),
    ],
)
def test_schema_rejects_bad_values(tmp_path, section, bad):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"attention": {section: bad}}))
    with pytest.raises(configuration.ConfigError):
        configuration.load_config([CONFIG, path])
