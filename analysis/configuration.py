"""The workflow's configuration: checked against its schema with short errors, then across fields.

``validate_config(config, schema)`` is what the Snakefile calls before anything else:

1. The schema (``workflow/schemas/config.schema.yaml``), with every problem in one line naming its key
   (``config.attention.fa2_setting: additional properties are not allowed ('gird' was unexpected)``):
   Snakemake's own ``validate`` prints the whole schema with each error, thousands of lines for an unknown
   top-level key.
2. The schema's defaults filled in (Snakemake's ``validate``, which now finds nothing to complain about).
3. The checks that tie fields together and that a schema cannot express, made now rather than in a job:
   every attention shard and interpreter check is built and every point's shape worked out
   (``analysis.experiments.grid``: seqlens and seqlen_k of the same length, hidden a multiple of head_dim,
   heads_kv dividing heads, FA-2 tiles that FA2Config accepts, …), and every operator shard
   (``analysis.experiments.ops_grid``: K a multiple of the group size, top_k within the experts, …).

Any problem raises ``ConfigError``, whose message starts "Error validating config" and names the key.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from snakemake.exceptions import WorkflowError

MAX_LISTED = 5


class ConfigError(WorkflowError, ValueError):
    """The configuration breaks its schema or a cross-field rule; the message names the key (a Snakemake
    ``WorkflowError``, so that Snakemake prints it as it prints its own)."""


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


def cross_field_errors(config: dict) -> list[str]:
    """What the shards of ``config`` (defaults filled) refuse, one line each."""
    from analysis.experiments import grid, ops_grid

    problems = []
    for build in (lambda: grid.attention_shards(config["attention"]),
                  lambda: grid.interpreter_shards(config["attention"]),
                  lambda: ops_grid.ops_shards(config)):  # fmt: skip
        try:
            build()
        except (TypeError, ValueError, KeyError) as exc:
            problems.append(f"config.{exc}" if str(exc).startswith("attention.") else f"config: {exc}")
    return problems


def validate_config(config: dict, schema_path: str | Path) -> dict:
    """Check ``config`` (steps 1-3 of the module docstring), filling the schema's defaults in place."""
    from snakemake.utils import validate

    schema = yaml.safe_load(Path(schema_path).read_text(encoding="utf-8"))
    problems = schema_errors(config, schema)
    if problems:
        raise ConfigError(_message(problems))
    validate(config, str(schema_path))  # the defaults; the schema itself is already satisfied
    problems = cross_field_errors(config)
    if problems:
        raise ConfigError(_message(problems))
    return config


def _message(problems: list[str]) -> str:
    more = f" (and {len(problems) - MAX_LISTED} more)" if len(problems) > MAX_LISTED else ""
    return "Error validating config: " + "; ".join(problems[:MAX_LISTED]) + more
