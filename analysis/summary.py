"""A result set's measured summary, generated from its tables: the numbers the documentation quotes.

Every family with a ``summary.py`` picks its lines from a GPU's tables (``analysis.core.summaries.Line``:
what, the value measured, the target, whether it is met); ``markdown`` writes them as ``summary.md`` of the
result set (``reports/reference/<gpu>/summary.md`` for a shipped set, ``results/<gpu>/summary.md`` for one
measured now; rule ``summary``), and ``readme_block`` the README's table of the lines that have a target,
between the markers ``<!-- measured: <folder> -->`` and ``<!-- /measured -->`` (rule ``readme``). A test
keeps both equal to what the tables give, so no measured number is typed into the prose.

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

from analysis import registry
from analysis.core import outputs, validate
from analysis.core.family import Family
from analysis.core.paths import ROOT
from analysis.core.summaries import Line

_BLOCK = re.compile(r"(<!-- measured: (?P<folder>\S+) -->\n)(?P<body>.*?)(<!-- /measured -->)", re.S)


def read_tables(folder: str | Path) -> dict[str, pd.DataFrame]:
    """Every result table a set's folder holds, read with its schema."""
    folder = Path(folder)
    return {
        name: t.read_rows([folder / f"{name}.csv"])
        for name, t in registry.tables().items()
        if (folder / f"{name}.csv").is_file()
    }


def lines(tables: dict[str, pd.DataFrame]) -> list[tuple[Family, Line]]:
    """(family, line) of every family that summarises its tables, in registry order."""
    out = []
    for fam in registry.FAMILIES.values():
        module = fam.module("summary")
        if module is not None:
            out += [(fam, line) for line in module.lines(tables)]
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
    found = lines(read_tables(folder))
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
    rows = [(f, line) for f, line in lines(read_tables(folder)) if line.target]
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
