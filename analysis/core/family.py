"""The ``Family`` record: one kernel family as the pipeline sees it, and the files its folder brings.

A family lives in ``analysis/families/<name>/`` (its kernels, where it has its own, in ``kernels/<name>/``)
and is listed once in ``analysis/registry.py``. ``<name>`` is also its config section, its results subfolder
(``results/<gpu>/<name>/<shard>.csv``) and the ``family`` value of the rows it writes. Its folder holds the
same parts in every family, each a module of its own or, in a small family, a name of the package itself
(``PARTS``: the package's ``__init__.py`` may define ``EXPERIMENTS``, ``run``, ``FIGURES``, ``EVALUATORS``...):

- ``plan`` (no torch: the workflow imports it to plan jobs): ``EXPERIMENTS``; optionally ``IMPLS``, the
  implementation names its rows may carry (a claim's subject names one); ``shards(config)``, shard name →
  the fields of one job's spec (the whole config is passed; the family reads its section); ``spec(fields)``,
  the spec of a shard, whose ``points()`` counts its rows; the cost estimate ``estimate_seconds(fields)``,
  ``compile_keys(fields)`` and ``COMPILE_S``; optionally ``checks(config)``, correctness checks run on the
  CPU in Triton's interpreter.
- ``run``: ``run(spec, env, device, log_line, files) -> rows`` measures one shard (``files``: a folder for
  the job's side files, kept beside its log).
- ``figures``: ``FIGURES``, name → ``Figure`` (optionally ``COMPARISON``, figures over every GPU's table);
  ``captions/<name>.rst`` the caption of each.
- ``claims``: ``EVALUATORS``, name → the evaluator of the registry's claims that name it
  (``analysis.audit``); optionally claims of the family's own sources (``claims.yaml``, the registry's
  format, ``workflow/schemas/claims.schema.yaml``; ``topics`` may add report topics of its own).
- ``columns.yaml``: the columns its rows carry, in order, and the definitions of those the shared
  ``workflow/schemas/result.schema.yaml`` does not have (``analysis.core.tables``).
- ``config.schema.yaml``: the JSON schema of its config section (``analysis.configuration`` composes the
  workflow's schema from them; its defaults fill a section the config leaves out).
- optionally ``report`` (``shape(row)``: a point's shape in words, for the report's failure and check
  tables; ``summary_tables(tables)``: tables the report shows per GPU) and ``summary`` (``lines(tables)``:
  the measured figures of ``reports/reference/<gpu>/summary.md``).

A small family may keep its three YAML documents in one ``family.yaml`` instead, under the keys ``columns``,
``config`` and ``claims`` (``YAML_PARTS``).

Modules other than ``plan.py`` are imported only when used, so planning the workflow never imports torch. A
family's modules import no other family's: what several families use lives below them all, in
``analysis/families/_shared/`` (a package, not a family: the registry never lists it).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import yaml

from analysis.core.paths import ROOT

SCOPES = ("gpu", "machine")  # measured on each GPU type; or computed once, GPU-independent, on this machine
# each part of a family: the name that says a module (or the package itself) is that part
PARTS = {
    "plan": "EXPERIMENTS",
    "run": "run",
    "figures": "FIGURES",
    "claims": "EVALUATORS",
    "report": "shape",
    "summary": "lines",
}
ONE_FILE = "family.yaml"  # a small family's YAML documents in one file, by key
YAML_PARTS = {"columns.yaml": "columns", "config.schema.yaml": "config", "claims.yaml": "claims"}


@dataclasses.dataclass(frozen=True)
class Figure:
    """One figure of a family: ``draw(df, out_png)`` writes the PNG and returns the table behind it (or raises
    ``analysis.core.plotting.NoDataError``); ``section`` is the report section it appears under."""

    draw: Callable
    section: str | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class Family:
    """A kernel family: its package (``analysis.families.<name>``; its ``__init__`` passes ``__name__``) and
    what the pipeline needs to know about it beside its files.

    ``table``: the result table its rows are collected into (default: its name; families whose rows share a
    layout share one). ``sections``: (id, title) of the report sections its figures appear under, in order.
    ``scope``: ``gpu`` (measured on each GPU type) or ``machine`` (GPU-independent, computed once).
    ``minutes``: the wall-clock limit of one of its jobs on a cluster. ``compares``: its ``figures.py`` also
    has ``COMPARISON``, figures drawn over every GPU type's table (the workflow plans them without importing
    the figures).
    """

    name: str
    package: str
    title: str
    table: str = ""
    sections: tuple[tuple[str, str], ...] = ()
    scope: str = "gpu"
    minutes: int = 60
    compares: bool = False

    def __post_init__(self):
        if not self.table:
            object.__setattr__(self, "table", self.name)
        if self.scope not in SCOPES:
            raise ValueError(f"family {self.name}: scope must be one of {SCOPES}, got {self.scope!r}")

    # --- where its files are ------------------------------------------------------------------------------
    @property
    def folder(self) -> Path:
        return Path(importlib.util.find_spec(self.package).origin).resolve().parent

    @property
    def plan(self) -> ModuleType:
        plan = self.module("plan")
        if plan is None:
            raise ValueError(f"family {self.name}: no plan (a plan.py, or EXPERIMENTS in {self.package})")
        return plan

    @property
    def captions(self) -> Path:
        return self.folder / "captions"

    def caption(self, figure: str) -> str:
        """The caption file of one of its figures, relative to the repository root."""
        return str((self.captions / f"{figure}.rst").relative_to(ROOT))

    def has(self, part: str) -> bool:
        """Whether it has ``part`` (a key of ``PARTS``), without importing a module of its own for it."""
        return (self.folder / f"{part}.py").is_file() or hasattr(self._package(), PARTS[part])

    def module(self, part: str) -> ModuleType | None:
        """The module of one of its parts (``PARTS``: ``plan``, ``run``, ``figures``, ...): its own module, or the
        package when the package defines the part itself; None without it."""
        if (self.folder / f"{part}.py").is_file():
            return importlib.import_module(f"{self.package}.{part}")
        package = self._package()
        return package if hasattr(package, PARTS[part]) else None

    def _package(self) -> ModuleType:
        return importlib.import_module(self.package)

    def yaml(self, name: str) -> dict:
        """One of its YAML documents (``YAML_PARTS``): its own file, or its key of ``family.yaml``; {} without it."""
        one = self.folder / ONE_FILE
        if one.is_file() and not (self.folder / name).is_file():
            return _yaml(one).get(YAML_PARTS[name]) or {}
        return _yaml(self.folder / name)

    # --- what it brings -----------------------------------------------------------------------------------
    @property
    def experiments(self) -> tuple[str, ...]:
        return tuple(self.plan.EXPERIMENTS)

    def columns(self) -> dict:
        return self.yaml("columns.yaml")

    def config_schema(self) -> dict:
        return self.yaml("config.schema.yaml")

    def claims_document(self) -> tuple[Path, dict] | None:
        """Its own claims (``claims.yaml``, or the ``claims`` of ``family.yaml``) and the file they are in."""
        data = self.yaml("claims.yaml")
        if not data:
            return None
        own = self.folder / "claims.yaml"
        return (own if own.is_file() else self.folder / ONE_FILE), data

    def run(self) -> Callable:
        return self.module("run").run

    def figures(self) -> dict[str, Figure]:
        module = self.module("figures")
        return dict(module.FIGURES) if module else {}

    def comparison(self) -> dict[str, Figure]:
        module = self.module("figures")
        return dict(getattr(module, "COMPARISON", {})) if module else {}

    def evaluators(self) -> dict[str, Callable]:
        module = self.module("claims")
        return dict(module.EVALUATORS) if module else {}

    # --- its part of a config -----------------------------------------------------------------------------
    def section(self, config: dict) -> dict:
        return config.get(self.name) or {}

    def enabled(self, config: dict) -> bool:
        """Whether the config runs it at all (its section's ``enabled``; ``auto`` counts as on)."""
        return self.section(config).get("enabled", True) is not False

    def shards(self, config: dict) -> dict[str, dict]:
        """Shard name → spec fields of every job of this family the config makes (none when it is off)."""
        return self.plan.shards(config) if self.enabled(config) else {}

    def checks(self, config: dict) -> dict[str, dict]:
        """Shard name → spec fields of its CPU interpreter checks (none without them or when it is off)."""
        checks = getattr(self.plan, "checks", None)
        return checks(config) if checks and self.enabled(config) else {}


@functools.cache
def _yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else {}
