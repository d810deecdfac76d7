"""The workflow's configuration: its schema composed from the families', checked with short errors, then
checked across fields.

The schema is ``workflow/schemas/config.schema.yaml`` (the top-level keys and the definitions sections share)
with one section per registered family, its ``analysis/families/<family>/config.schema.yaml`` (``schema()``).
``validate_config(config)`` is what the Snakefile calls before anything else:

1. The schema, with every problem in one line naming its key (``config.attention.fa2_setting: additional
   properties are not allowed ('gird' was unexpected)``): Snakemake's own ``validate`` prints the whole
   schema with each error, thousands of lines for an unknown top-level key.
2. The schema's defaults filled in, nested ones included (as Snakemake's ``validate`` does).
3. The checks that tie fields together and that a schema cannot express, made now rather than in a job:
   every family's shards and checks are built (its plan's ``shards`` and ``checks``), every point's shape
   worked out (seqlens and seqlen_k of the same length, hidden a multiple of head_dim, FA-2 tiles that
   FA2Config accepts, K a multiple of the group size, top_k within the experts, …).

Any problem raises ``ConfigError``, whose message starts "Error validating config" and names the key.
``load_config(paths)`` builds a config from files as Snakemake does and validates it (for the tools and tests).
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml
from snakemake.exceptions import WorkflowError

from analysis import registry
from analysis.core.paths import SCHEMAS

SCHEMA = SCHEMAS / "config.schema.yaml"
MAX_LISTED = 5


class ConfigError(WorkflowError, ValueError):
    """The configuration breaks its schema or a cross-field rule; the message names the key (a Snakemake
    ``WorkflowError``, so that Snakemake prints it as it prints its own)."""


def schema(path: str | Path = SCHEMA) -> dict:
    """The workflow's JSON schema: the file at ``path`` with every family's section (and its definitions)."""
    out = copy.deepcopy(yaml.safe_load(Path(path).read_text(encoding="utf-8")))
    defs = out.setdefault("$defs", {})
    for fam in registry.FAMILIES.values():
        section = copy.deepcopy(fam.config_schema())
        for name, definition in section.pop("$defs", {}).items():
            if name in defs and defs[name] != definition:
                raise ValueError(f"family {fam.name}: config definition {name!r} is defined elsewhere too")
            defs[name] = definition
        if fam.name in out["properties"]:
            raise ValueError(f"family {fam.name}: its config section clashes with a top-level key")
        out["properties"][fam.name] = section
    return out


def _where(error) -> str:
    path = ".".join(str(p) for p in error.absolute_path)
    return f"config.{path}" if path else "config"


def _short(error) -> str:
    message = error.message
    return message if len(message) <= 300 else message[:297] + "..."


def schema_errors(config: dict, schema: dict) -> list[str]:
    """One line per problem of ``config`` against ``schema`` (JSON Schema 2020-12), in key order."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: [str(p) for p in e.absolute_path])
    return [f"{_where(e)}: {_short(e)}" for e in errors]


def fill_defaults(config: dict, schema: dict) -> dict:
    """Set every key the schema gives a default and ``config`` lacks, nested ones included, in place."""
    import jsonschema
    from jsonschema import validators

    properties = jsonschema.Draft202012Validator.VALIDATORS["properties"]

    def set_defaults(validator, props, instance, subschema):
        for name, sub in props.items():
            if isinstance(instance, dict) and "default" in sub:
                instance.setdefault(name, copy.deepcopy(sub["default"]))
        yield from properties(validator, props, instance, subschema)

    filling = validators.extend(jsonschema.Draft202012Validator, {"properties": set_defaults})
    for _ in filling(schema).iter_errors(config):  # the schema is satisfied already: this only fills
        pass
    return config


def cross_field_errors(config: dict) -> list[str]:
    """What the shards and checks of every family of ``config`` (defaults filled) refuse, one line each."""
    problems = []
    sections = tuple(f"{name}." for name in registry.FAMILIES)
    for fam in registry.FAMILIES.values():
        for build in (fam.shards, fam.checks):
            try:
                build(config)
            except (TypeError, ValueError, KeyError) as exc:
                problems.append(f"config.{exc}" if str(exc).startswith(sections) else f"config: {exc}")
    return problems


def validate_config(config: dict, schema_path: str | Path = SCHEMA) -> dict:
    """Check ``config`` (steps 1-3 of the module docstring), filling the schema's defaults in place."""
    composed = schema(schema_path)
    problems = schema_errors(config, composed)
    if problems:
        raise ConfigError(_message(problems))
    fill_defaults(config, composed)
    problems = cross_field_errors(config)
    if problems:
        raise ConfigError(_message(problems))
    return config


def _message(problems: list[str]) -> str:
    more = f" (and {len(problems) - MAX_LISTED} more)" if len(problems) > MAX_LISTED else ""
    return "Error validating config: " + "; ".join(problems[:MAX_LISTED]) + more


def load_config(paths) -> dict:
    """The workflow config as Snakemake builds it from config files: later files update earlier ones
    (nested mappings merged, anything else replaced), then checked and completed as the Snakefile does."""
    config: dict = {}

    def merge(into: dict, new: dict) -> None:
        for key, value in new.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = value

    for p in paths:
        merge(config, yaml.safe_load(Path(p).read_text(encoding="utf-8")))
    return validate_config(config)
