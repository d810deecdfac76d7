"""Configuration errors name the valid forms: a value that fits none of a key's alternatives (anyOf/oneOf)
is told each of them in a few words, for every such key of the workflow's and the families' schemas; one
that has the form of one alternative is told what is wrong inside it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from snakemake_helpers import snakemake

from analysis import configuration

ROOT = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((ROOT / "workflow" / "config.yaml").read_text())
SCHEMA = configuration.schema()
SLUG = "^[a-z0-9][a-z0-9-]*$"


def errors(**changes) -> list[str]:
    """The schema's lines for the shipped config with ``changes`` (dotted keys, digits for list items)."""
    config = copy.deepcopy(CONFIG)
    for dotted, value in changes.items():
        put(config, [int(p) if p.isdigit() else p for p in dotted.split("__")], value)
    return configuration.schema_errors(config, SCHEMA)


def put(config: dict, path: list, value) -> None:
    """Set ``value`` at ``path`` in ``config``, making the mappings and one-item lists on the way."""
    node = config
    for step, following in zip(path, path[1:], strict=False):
        empty = [] if isinstance(following, int) else {}
        if isinstance(step, int):
            if not node:
                node.append(empty)
            node = node[step]
        else:
            if not isinstance(node.get(step), (dict, list)):
                node[step] = empty
            node = node[step]
    if isinstance(path[-1], int):
        node[:] = [value]
    else:
        node[path[-1]] = value


def test_gpus_names_its_forms():
    """The newcomer's `--config gpus=nonexistent`: "is not valid under any of the given schemas" before."""
    (line,) = errors(gpus="nonexistent")
    assert line.startswith(f"config.gpus: 'nonexistent' is none of: \"auto\"; a list of strings matching {SLUG} (")
    assert "GPU types to measure" in line  # the key's description, its first sentence


def test_a_value_of_one_alternatives_form_is_told_what_is_wrong_inside_it():
    assert errors(gpus=["h200", "H100"]) == [f"config.gpus.1: 'H100' does not match '{SLUG}'"]


def test_every_allowed_value_is_listed_when_few_and_the_first_of_each_kind_when_many():
    (line,) = errors(attention__fa2_setting__grids__0__impls=["ours-fa4"])
    dense = ["ours-fa2", "ours-fa1", "naive", "sdpa-math", "sdpa-efficient", "sdpa-flash", "sdpa-cudnn"]
    listed = ", ".join(json.dumps(v) for v in [*dense, "ours-fa3", "ours-fa3-bwd", "upstream-fa"])
    assert line == f"config.attention.fa2_setting.grids.0.impls.0: 'ours-fa4' is not one of {listed}"
    (line,) = errors(fp8__speed__impls=["ours-fp8-blok"])
    assert line.startswith("config.fp8.speed.impls.0: 'ours-fp8-blok' is not one of \"ours-fp8-none\", ")
    assert " and 35 more like them; " in line  # the 41 FP8 variants, then every other kind in full
    assert all(json.dumps(v) in line for v in [*dense, "fp8-mm", "copy-qkv"])


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("attention__decode__warmup_ms", -1, "-1 is none of: null; a number >= 0 (This experiment's warm-up"),
        ("attention__fa2_setting__rep_ms", 0, "0 is none of: null; a number > 0 ("),
        ("traffic__enabled", "yes", "'yes' is none of: true or false; \"auto\" ("),
        ("traffic__fa2_config", "BLOCK_M=64", "'BLOCK_M=64' is none of: null; a string matching ^BLOCK_M=[0-9]+,"),
        ("attention__block_sweep__configs", 3, "3 is none of: null; a list of strings matching ^BLOCK_M="),
    ],
)
def test_numbers_switches_and_patterns_name_their_forms(key, value, expected):
    (line,) = errors(**{key: value})
    assert line.startswith(f"config.{key.replace('__', '.')}: {expected}"), line


def alternative_keys(sub: dict, path: list, forms) -> list[tuple[list, dict]]:
    """(path, subschema) of every key whose schema is an anyOf or oneOf, by properties and list items."""
    sub = forms.resolve(sub)
    found = [(path, sub)] if sub.get("anyOf") or sub.get("oneOf") else []
    for name, prop in sub.get("properties", {}).items():
        found += alternative_keys(prop, [*path, name], forms)
    if isinstance(sub.get("items"), dict):
        found += alternative_keys(sub["items"], [*path, 0], forms)
    return found


WORDS = {"null": "null", "boolean": "true or false", "number": "a number", "integer": "an integer"}
WORDS |= {"string": "a string", "array": "a list", "object": "a mapping"}


def test_every_key_with_alternatives_names_each_of_them():
    forms = configuration._Forms(SCHEMA["$defs"])
    keys = alternative_keys(SCHEMA, [], forms)
    assert len(keys) >= 10 and ["gpus"] in [path for path, _ in keys]
    for path, sub in keys:
        config = copy.deepcopy(CONFIG)
        put(config, path, {"no-such-form": 1})  # a mapping, which no alternative here accepts
        lines = configuration.schema_errors(config, SCHEMA)
        where = "config." + ".".join(map(str, path))
        assert len(lines) == 1 and lines[0].startswith(f"{where}: {{'no-such-form': 1}} is "), (path, lines)
        assert "valid under" not in lines[0]  # jsonschema's own words, which name no form
        for alternative in sub.get("anyOf") or sub.get("oneOf"):
            groups = forms.values(alternative)
            if groups is not None:
                assert all(json.dumps(group[0]) in lines[0] for group in groups), (path, lines[0])
            else:
                kinds = forms.resolve(alternative)["type"]
                for kind in [kinds] if isinstance(kinds, str) else kinds:
                    assert WORDS[kind] in lines[0], (path, kind, lines[0])


def test_snakemake_prints_the_forms(tmp_path):
    r = snakemake("-n", "--cores", "1", "--config", "gpus=nonexistent", f"results_dir={tmp_path}")
    assert r.returncode != 0
    assert f"config.gpus: 'nonexistent' is none of: \"auto\"; a list of strings matching {SLUG}" in r.stdout + r.stderr
