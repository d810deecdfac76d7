"""The workflow's configuration: its schema composed from the families' sections, one line per problem, the
defaults of the schema as the config file's, the checks across fields when the shards are planned, and
planning without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from analysis import configuration, registry

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "workflow" / "config.yaml"


def _config(**sections) -> dict:
    cfg = yaml.safe_load(CONFIG.read_text())
    for key, value in sections.items():
        cfg[key] = value
    return cfg


SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"


def test_an_unknown_key_is_one_line():
    """Snakemake's validate printed 2,279 lines of schema for an unknown top-level key."""
    with pytest.raises(configuration.ConfigError) as info:
        configuration.validate_config(_config(results_dri="x"), SCHEMA)
    message = str(info.value)
    assert "\n" not in message and len(message) < 300
    unexpected = "Additional properties are not allowed ('results_dri' was unexpected)"
    assert message == f"Error validating config: config: {unexpected}"


def test_nested_problems_name_their_key():
    cfg = _config()
    cfg["attention"]["decode"]["query_lens"] = [17]
    cfg["w4a16"]["group_sizes"] = [48]
    with pytest.raises(configuration.ConfigError) as info:
        configuration.validate_config(cfg, SCHEMA)
    assert "config.attention.decode.query_lens.0: 17 is greater than the maximum of 16" in str(info.value)
    assert "config.w4a16.group_sizes.0" in str(info.value)


def test_seqlens_and_seqlen_k_of_different_lengths_fail_when_planned():
    """They passed validation and then failed 16 interpreter jobs at run time."""
    cfg = _config()
    cfg["attention"]["interpreter_check"] = {"seqlens": [1, 97], "seqlen_k": [1, 97, 70]}
    message = (
        r"config.attention.interpreter_check \(shard check_float16_d16_full\): seqlen_k must list one key "
        r"length per entry of seqlens: 3 key lengths \[1, 97, 70\] for 2 query lengths"
    )
    with pytest.raises(configuration.ConfigError, match=message):
        configuration.validate_config(cfg, SCHEMA)


@pytest.mark.parametrize(
    "section, change, message",
    [
        ("fa2_setting", {"hidden": 2000}, r"attention.fa2_setting .*hidden 2000 is not a multiple of head_dim 128"),
        ("block_sweep", {"configs": ["BLOCK_M=24,BLOCK_N=64,num_warps=4,num_stages=2"]}, "BLOCK_M must be a power"),
        ("decode", {"heads_kv": [3]}, r"attention.decode .*heads_kv 3 must divide heads 16"),
    ],
)
def test_cross_field_rules_fail_when_planned(section, change, message):
    cfg = _config()
    cfg["attention"][section].update(change)
    with pytest.raises(configuration.ConfigError, match=message):
        configuration.validate_config(cfg, SCHEMA)


def test_the_shipped_configs_pass():
    default = configuration.load_config([CONFIG])
    assert default["reference_dir"] == "reports/reference"
    full = configuration.load_config([CONFIG, ROOT / "workflow" / "config-full.yaml"])

    def shards(config):
        return {s for f in registry.FAMILIES.values() if f.table == "attention" for s in f.shards(config)}

    assert shards(default) < shards(full), "the full grid holds every default shard and more"


def test_reference_dir_may_be_null():
    cfg = _config(reference_dir=None)
    assert configuration.validate_config(cfg, SCHEMA)["reference_dir"] is None


def test_every_family_has_a_config_section_with_defaults():
    """Every key of every family's section has a default in the schema, and those defaults are the file's."""
    empty: dict = {}
    configuration.fill_defaults(empty, configuration.schema())
    default = configuration.load_config([CONFIG])
    for name in registry.FAMILIES:
        assert empty[name] == default[name], name


def test_planning_the_grid_imports_no_torch():
    """The workflow builds every family's shards at every start: that must not pay for importing torch or Triton."""
    code = (
        "import sys\nfrom analysis import configuration, registry\n"
        "config = configuration.load_config(['workflow/config.yaml'])\n"
        "assert all(f.shards(config) or f.checks(config) or True for f in registry.FAMILIES.values())\n"
        "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr
