"""The ``Family`` record: one kernel family as the pipeline sees it, and the files its folder brings.

A family lives in ``analysis/families/<name>/`` (its kernels, where it has its own, in ``kernels/<name>/``)
and is listed once in ``analysis/registry.py``. ``<name>`` is also its config section, its results subfolder
(``results/<gpu>/<name>/<shard>.csv``) and the ``family`` value of the rows it writes. Its folder holds the
same files in every family:

- ``plan.py`` (no torch: the workflow imports it to plan jobs): ``EXPERIMENTS``; ``shards(config)``, shard name →
  the fields of one job's spec (the whole config is passed; the family reads its section); ``spec(fields)``,
  the spec of a shard, whose ``points()`` counts its rows; the cost estimate ``estimate_seconds(fields)``,
  ``compile_keys(fields)`` and ``COMPILE_S``; optionally ``checks(config)``, correctness checks run on the
  CPU in Triton's interpreter.
- ``run.py``: ``run(spec, env, device, log_line, files) -> rows`` measures one shard (``files``: a folder for
  the job's side files, kept beside its log).
- ``figures.py``: ``FIGURES``, name → ``Figure`` (optionally ``COMPARISON``, figures over every GPU's table);
  ``captions/<name>.rst`` the caption of each.
- ``claims.py``: ``EVALUATORS``, name → the evaluator of the registry's claims that name it
  (``analysis.audit``); optionally ``claims.yaml``, claims of the family's own sources (the registry's
  format; ``topics`` may add report topics of its own, ``analysis.claims_view``).
- ``columns.yaml``: the columns its rows carry, in order, and the definitions of those the shared
  ``workflow/schemas/result.schema.yaml`` does not have (``analysis.core.tables``).
- ``config.schema.yaml``: the JSON schema of its config section (``analysis.configuration`` composes the
  workflow's schema from them).
- optionally ``report.py`` (``shape(row)``: a point's shape in words, for the report's failure and check
  tables; ``summary_tables(tables)``: tables the report shows per GPU) and ``summary.py`` (``lines(tables)``:
  the measured figures of ``reports/reference/<gpu>/summary.md``).

Modules other than ``plan.py`` are imported only when used, so planning the workflow never imports torch. A
family's modules import no other family's: what several families use lives below them all, in
``analysis/families/_shared/`` (a package, not a family: the registry never lists it).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import yaml

from analysis.core.paths import ROOT

SCOPES = ("gpu", "machine")  # measured on each GPU type; or computed once, GPU-independent, on this machine


@dataclasses.dataclass(frozen=True)
class Figure:
    """One figure of a family: ``draw(df, out_png)`` writes the PNG and returns the table behind it (or raises
    ``analysis.core.plotting.NoDataError``); ``section`` is the report section it appears under."""

    draw: Callable
    section: str | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class Family:
    """A kernel family: its plan module and what the pipeline needs to know about it beside its files.

    ``table``: the result table its rows are collected into (default: its name; families whose rows share a
    layout share one). ``sections``: (id, title) of the report sections its figures appear under, in order.
    ``scope``: ``gpu`` (measured on each GPU type) or ``machine`` (GPU-independent, computed once).
    ``minutes``: the wall-clock limit of one of its jobs on a cluster. ``compares``: its ``figures.py`` also
    has ``COMPARISON``, figures drawn over every GPU type's table (the workflow plans them without importing
    the figures).
    """

    name: str
    plan: ModuleType
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
    def package(self) -> str:
        return self.plan.__name__.rpartition(".")[0]

    @property
    def folder(self) -> Path:
        return Path(self.plan.__file__).resolve().parent

    @property
    def captions(self) -> Path:
        return self.folder / "captions"

    def caption(self, figure: str) -> str:
        """The caption file of one of its figures, relative to the repository root."""
        return str((self.captions / f"{figure}.rst").relative_to(ROOT))

    def has(self, module: str) -> bool:
        return (self.folder / f"{module}.py").is_file()

    def module(self, name: str) -> ModuleType | None:
        """One of its modules (``run``, ``figures``, ``claims``, ``report``, ``summary``), or None without it."""
        return importlib.import_module(f"{self.package}.{name}") if self.has(name) else None

    def yaml(self, name: str) -> dict:
        return _yaml(self.folder / name)

    # --- what it brings -----------------------------------------------------------------------------------
    @property
    def experiments(self) -> tuple[str, ...]:
        return tuple(self.plan.EXPERIMENTS)

    def columns(self) -> dict:
        return self.yaml("columns.yaml")

    def config_schema(self) -> dict:
        return self.yaml("config.schema.yaml")

    def claims_file(self) -> Path | None:
        path = self.folder / "claims.yaml"
        return path if path.is_file() else None

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
