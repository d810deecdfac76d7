"""The workflow's configuration: its schema composed from the families', checked with short errors, then
checked across fields.

The schema is ``workflow/schemas/config.schema.yaml`` (the top-level keys and the definitions sections share)
with one section per registered family, its ``analysis/families/<family>/config.schema.yaml`` (``schema()``).
``validate_config(config)`` is what the Snakefile calls before anything else:

1. The schema, with every problem in one line naming its key (``config.attention.fa2_setting: additional
   properties are not allowed ('gird' was unexpected)``): Snakemake's own ``validate`` prints the whole
   schema with each error, thousands of lines for an unknown top-level key. A value that fits none of a
   key's alternatives (``anyOf``/``oneOf``) is told what they are (``config.gpus: 'h100x' is none of:
   "auto"; a list of strings matching ^[a-z0-9][a-z0-9-]*$``); one that has the form of exactly one of
   them is told what is wrong inside it (``config.gpus.0: 'H200' does not match ...``).
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
import json
from pathlib import Path

import yaml
from snakemake.exceptions import WorkflowError

from analysis import registry
from analysis.core.paths import SCHEMAS

SCHEMA = SCHEMAS / "config.schema.yaml"
MAX_LISTED = 5
MAX_VALUES = 16  # an error lists every allowed value up to this many, else
FIRST_VALUES = 6  # the first few of each list


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


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _literal(value) -> str:
    return json.dumps(value)


def _about(text: str) -> str:
    """The first sentence of a description, at most about 200 characters (cut at a word)."""
    text = " ".join(text.split())
    end = text.find(". ")
    text = text if end < 0 else text[: end + 1]
    return text if len(text) <= 200 else text[:200].rsplit(" ", 1)[0] + " ..."


class _Forms:
    """Brief English for the values a subschema accepts, its ``$ref``s resolved in the schema's ``$defs``."""

    PLURAL = {"string": "strings", "integer": "integers", "number": "numbers", "boolean": "true/false values"}

    def __init__(self, defs: dict):
        self.defs = defs

    def resolve(self, sub: dict) -> dict:
        ref = sub.get("$ref", "")
        if not ref.startswith("#/$defs/"):
            return sub
        rest = {k: v for k, v in sub.items() if k != "$ref"}
        return {**self.resolve(self.defs[ref.removeprefix("#/$defs/")]), **rest}

    def values(self, sub: dict) -> list[list] | None:
        """The values ``sub`` lists, one list per alternative (its enum or const, or those of every one of
        its alternatives), else None."""
        sub = self.resolve(sub)
        if "const" in sub:
            return [[sub["const"]]]
        if "enum" in sub:
            return [list(sub["enum"])]
        alternatives = sub.get("anyOf") or sub.get("oneOf")
        if alternatives:
            listed = [self.values(a) for a in alternatives]
            if all(groups is not None for groups in listed):
                return [group for groups in listed for group in groups]
        return None

    @staticmethod
    def listing(groups: list[list]) -> str:
        """The values, every one of them when there are few, else the first few of each group."""
        if sum(map(len, groups)) <= MAX_VALUES:
            return ", ".join(_literal(v) for group in groups for v in group)
        parts = []
        for group in groups:
            if len(group) <= FIRST_VALUES + 2:  # "and 1 more" would say no less than the value itself
                parts.append(", ".join(_literal(v) for v in group))
                continue
            shown = ", ".join(_literal(v) for v in group[:FIRST_VALUES])
            parts.append(f"{shown} and {len(group) - FIRST_VALUES} more like them")
        return "; ".join(parts)

    def bounds(self, sub: dict) -> str:
        words = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}
        return "".join(f" {op} {sub[key]}" for key, op in words.items() if key in sub)

    def describe(self, sub: dict) -> str:
        """``sub``'s accepted values in a few words: its values, else its type (with its bounds or pattern)."""
        sub = self.resolve(sub)
        groups = self.values(sub)
        if groups is not None:
            values = [v for group in groups for v in group]
            return _literal(values[0]) if len(values) == 1 else "one of " + self.listing(groups)
        alternatives = sub.get("anyOf") or sub.get("oneOf")
        if alternatives:
            return " or ".join(self.describe(a) for a in alternatives)
        kinds = sub.get("type", [])
        kinds = [kinds] if isinstance(kinds, str) else kinds
        return " or ".join(self.kind(k, sub) for k in kinds) or "any value"

    def kind(self, kind: str, sub: dict) -> str:
        if kind == "null":
            return "null"
        if kind == "boolean":
            return "true or false"
        if kind == "array":
            items = self.resolve(sub.get("items", {}))
            return "a list" + (f" of {self.plural(items)}" if items else "")
        if kind == "object":
            return "a mapping"
        article = "an" if kind == "integer" else "a"
        pattern = f" matching {sub['pattern']}" if "pattern" in sub else ""
        return f"{article} {kind}{self.bounds(sub)}{pattern}"

    def plural(self, items: dict) -> str:
        groups = self.values(items)
        if groups is not None:
            return "values from " + self.listing(groups)
        kind = items.get("type")
        if isinstance(kind, str) and kind in self.PLURAL:
            pattern = f" matching {items['pattern']}" if "pattern" in items else ""
            return f"{self.PLURAL[kind]}{self.bounds(items)}{pattern}"
        return f"items each {self.describe(items)}"


def _alternatives(error, forms: _Forms) -> list[str]:
    """The lines for a value that no alternative of an ``anyOf``/``oneOf`` accepts: when exactly one
    alternative accepts its form and only something inside it is wrong, those problems (at their own
    keys); otherwise what the alternatives accept, in a few words, and the key's description."""
    branches: dict[int, list] = {}
    for sub in error.context:
        branches.setdefault(sub.relative_schema_path[0], []).append(sub)
    inside = [errs for errs in branches.values() if all(e.relative_path for e in errs)]
    if len(inside) == 1:
        return [line for sub in inside[0] for line in _lines(sub, forms)]
    groups = forms.values({error.validator: error.validator_value})
    if groups is not None:
        expected = "is not one of " + forms.listing(groups)
    else:
        expected = "is none of: " + "; ".join(forms.describe(a) for a in error.validator_value)
    about = error.schema.get("description")
    about = f" ({_about(about)})" if about else ""
    return [f"{_where(error)}: {_cut(repr(error.instance), 80)} {expected}{about}"]


def _lines(error, forms: _Forms) -> list[str]:
    if error.validator in ("anyOf", "oneOf") and error.context:
        return _alternatives(error, forms)
    return [f"{_where(error)}: {_cut(error.message, 300)}"]


def schema_errors(config: dict, schema: dict) -> list[str]:
    """One line per problem of ``config`` against ``schema`` (JSON Schema 2020-12), in key order."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    forms = _Forms(schema.get("$defs", {}))
    errors = sorted(validator.iter_errors(config), key=lambda e: [str(p) for p in e.absolute_path])
    return [line for e in errors for line in _lines(e, forms)]


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
