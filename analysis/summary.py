"""A result set's measured summary, generated from its tables: the numbers the documentation quotes.

Each family's performance targets (``targets`` of its ``claims.yaml``) are judged by the audit's engine on a
GPU's tables, each a line with what was measured, the value, the target and whether it is met (the verdict:
holds → yes, partly, fails → no; "borderline" where the timings' band reaches another verdict: p20–p80,
widened to the repeat rounds' medians where the rows have them, ``analysis.audit.band``); a
family with a ``summary.py`` adds lines without a target (``analysis.core.summaries.Line``). ``markdown``
writes them as ``summary.md`` of the result set (``reports/reference/<gpu>/summary.md`` for a shipped set,
``results/<gpu>/summary.md`` for one measured now; rule ``summary``), and ``readme_block`` the README's table of
the lines that have a target, between the markers ``<!-- measured: <folder> -->`` and ``<!-- /measured -->``
(rule ``readme``). A test keeps both equal to what the tables give, so no measured number is typed into the prose.

``summary.md`` is derived from the set's tables, so it is not one of the published files its
``MANIFEST.json`` lists (``analysis.core.shipped``): it is regenerated, never published or hashed.

    python -m analysis.summary reports/reference/h200            # print the summary of a result set
    python -m analysis.summary --readme README.md                # rewrite the README's measured tables
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pandas as pd

from analysis import audit, registry
from analysis.audit import Context, Results
from analysis.core import outputs, validate
from analysis.core.family import Family
from analysis.core.paths import ROOT
from analysis.core.summaries import Line

_BLOCK = re.compile(r"(<!-- measured: (?P<folder>\S+) -->\n)(?P<body>.*?)(<!-- /measured -->)", re.S)


def _paths(folder: Path) -> dict[str, str]:
    """Each table's file, as the targets' evidence names it (relative to the repository where it is inside)."""
    return {name: _shown(folder / f"{name}.csv") for name in registry.tables()}


def read_tables(folder: str | Path) -> dict[str, pd.DataFrame]:
    """Every result table a set's folder holds, read with its schema."""
    folder = Path(folder)
    return {
        name: t.read_rows([folder / f"{name}.csv"])
        for name, t in registry.tables().items()
        if (folder / f"{name}.csv").is_file()
    }


MET = {"holds": "yes", "partly": "partly", "fails": "no"}  # a target's verdict as the summary's "met?"


def targets(tables: dict[str, pd.DataFrame], gpu: str = "gpu", paths: dict[str, str] | None = None) -> pd.DataFrame:
    """Every family's performance targets (``analysis.registry.targets``) judged by the audit's engine on
    ``tables`` (one GPU type's, ``gpu``), with their borderline bands: the audit's verdict rows, and
    ``family``."""
    ctx = Context(
        {name: Results({gpu: df}, {gpu: (paths or {}).get(name, f"{name}.csv")}) for name, df in tables.items()}
    )
    judged = [
        audit.audit(list(claims), ctx, registry.evaluators()).assign(family=family)
        for family, claims in registry.targets().items()
    ]
    return pd.concat(judged, ignore_index=True) if judged else pd.DataFrame(columns=[*audit.COLUMNS, "family"])


def lines(
    tables: dict[str, pd.DataFrame], gpu: str = "gpu", paths: dict[str, str] | None = None
) -> list[tuple[Family, Line]]:
    """(family, line) of every family, in registry order: its targets that could be judged (the verdict as
    "met?", with "borderline" where the timings' band reaches another verdict), then its ``summary.py`` lines."""
    judged = targets(tables, gpu, paths)
    out = []
    for fam in registry.FAMILIES.values():
        own = registry.targets()[fam.name].by_id() if fam.name in registry.targets() else {}
        for r in judged[(judged["family"] == fam.name) & (judged["verdict"] != "untestable")].itertuples():
            met = MET.get(r.verdict, r.verdict) + (" (borderline)" if r.borderline else "")
            out.append((fam, Line(r.statement, r.observed, own[r.claim_id].wording, met)))
        module = fam.module("summary")
        if module is not None:
            out += [(fam, line) for line in module.lines(tables, own)]
    return out


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|") or "—"


def _table(rows: list[tuple[Family, Line]], family: bool = False) -> list[str]:
    head = (["family"] if family else []) + ["measured", "value", "target", "met?"]
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for fam, line in rows:
        cells = ([fam.name] if family else []) + [line.what, line.measured, line.target, line.met]
        out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return out


def _provenance(folder: Path) -> str:
    env = validate.read_environment(folder / "environment.json")
    manifest = folder / "MANIFEST.json"
    commits = ""
    if manifest.is_file():
        per = json.loads(manifest.read_text(encoding="utf-8")).get("rows_per_commit") or {}
        commits = f"; rows from {len(per)} commits (MANIFEST.json lists them)" if len(per) > 1 else ""
    return (
        f"{env.get('gpu_name', env['gpu'])}, driver {env.get('driver', '?')}, CUDA {env.get('cuda', '?')}, "
        f"torch {env['torch']}, Triton {env['triton']}, commit {env['git_sha'][:12]}{commits}"
    )


def _shown(folder: Path) -> str:
    """The folder as the command that regenerates its summary names it: relative to the repository."""
    try:
        return str(folder.resolve().relative_to(ROOT))
    except ValueError:
        return str(folder)


def markdown(folder: str | Path) -> str:
    """``summary.md`` of the result set in ``folder``."""
    folder = Path(folder)
    found = lines(read_tables(folder), folder.name, _paths(folder))
    out = [
        f"# Measured on {folder.name}",
        "",
        f"Generated from the tables of this folder by `python -m analysis.summary {_shown(folder)}` (the workflow's "
        "rule `summary`); do not edit. Every value is computed from the rows, each ratio between rows of the same "
        "run and shape; the report shows every point.",
        "",
        f"Environment: {_provenance(folder)}.",
        "",
    ]
    for fam in dict.fromkeys(f for f, _ in found):
        out += [f"## {fam.title}", "", *_table([(f, line) for f, line in found if f is fam]), ""]
    return "\n".join(out)


def readme_block(folder: str | Path) -> str:
    """The README's table of a result set: its lines that have a target."""
    folder = Path(folder)
    rows = [(f, line) for f, line in lines(read_tables(folder), folder.name, _paths(folder)) if line.target]
    return "\n".join(_table(rows, family=True)) + "\n"


def measured_blocks(text: str) -> list[str]:
    """The result-set folders whose measured tables ``text`` (the README) holds, in order."""
    return [m.group("folder") for m in _BLOCK.finditer(text)]


def readme(text: str, root: str | Path = ".") -> str:
    """``text`` (the README) with every measured block regenerated from the folder it names."""
    return _BLOCK.sub(lambda m: m.group(1) + readme_block(Path(root) / m.group("folder")) + m.group(4), text)


def write(folder: str | Path, out_md: str | Path) -> Path:
    return outputs.write_text(out_md, markdown(folder))


def main(args: list[str]) -> None:
    if args[:1] == ["--readme"]:
        path = Path(args[1])
        outputs.write_text(path, readme(path.read_text(encoding="utf-8"), path.parent))
        return
    print(markdown(args[0]))


if __name__ == "__main__":
    main(sys.argv[1:])
