# Command-line config values with their YAML types, before the config is validated. Snakemake parses a
# top-level `--config key=32` as a number but every value inside a list or mapping as a string
# (`--config "attention={warmup_ms: 50}"` gave '50'), which the schema then refuses. Only what --config
# set is re-read; the config files' values are typed already.
import re

import yaml


def _typed(value):
    """A command-line string as YAML reads it when that gives a number, boolean or null; else unchanged."""
    if isinstance(value, list):
        return [_typed(v) for v in value]
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    # ("" is how a quoted empty string arrives, `gres: ''`: it stays one)
    if not isinstance(value, str) or value == "":
        return value
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        return value
    if parsed is None or isinstance(parsed, (bool, int, float)):
        return parsed
    if re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+", value):
        return float(value)  # 1e-3: a number, though YAML 1.1 reads it as a string
    return value


def _retype(target, given):
    for key, value in given.items():
        if key not in target:
            continue
        if isinstance(value, dict) and isinstance(target[key], dict):
            _retype(target[key], value)
        else:
            target[key] = _typed(target[key])


_retype(config, dict(getattr(workflow.config_settings, "config", None) or {}))
