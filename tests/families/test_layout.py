"""The families' folders stand alone: each imports only its own modules, what they share below them
(``analysis/families/_shared``) and the rest of ``analysis``; ``_shared`` imports no family and is no family."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from analysis import registry

FAMILIES = Path(__file__).resolve().parents[2] / "analysis" / "families"
PREFIX = "analysis.families."


def _folders() -> list[str]:
    return sorted(p.name for p in FAMILIES.iterdir() if (p / "__init__.py").is_file())


def _imported(path: Path) -> set[str]:
    """Every module ``path`` imports (at the top or inside a function), as dotted names."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{alias.name}" for alias in node.names}
    return out


def _families_imported(path: Path) -> set[str]:
    """The folders under ``analysis/families`` whose modules ``path`` imports."""
    names = {m.removeprefix(PREFIX).split(".")[0] for m in _imported(path) if m.startswith(PREFIX)}
    return names & set(_folders())


def test_every_folder_but_shared_is_a_registered_family():
    assert [f for f in _folders() if not f.startswith("_")] == sorted(registry.FAMILIES)
    assert "_shared" in _folders() and "_shared" not in registry.FAMILIES


@pytest.mark.parametrize("folder", _folders())
def test_a_folder_imports_no_other_family(folder):
    allowed = {folder, "_shared"} if folder != "_shared" else {"_shared"}
    found = {
        str(p.relative_to(FAMILIES)): sorted(_families_imported(p) - allowed)
        for p in sorted((FAMILIES / folder).rglob("*.py"))
    }
    assert not {p: names for p, names in found.items() if names}


def test_the_import_check_sees_a_sibling_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from analysis.families.attention.measure import implementation\n")
    assert _families_imported(module) == {"attention"}
    module.write_text("from analysis.families import fp8, _shared\n")
    assert _families_imported(module) == {"fp8", "_shared"}


def test_the_checks_table_comes_from_the_families_with_checks(monkeypatch):
    assert registry.checks_table() == "attention"  # the attention family's interpreter checks
    monkeypatch.setattr(registry.family("w4a16").plan, "checks", lambda config: {}, raising=False)
    with pytest.raises(ValueError, match=r"several tables \['attention', 'ops'\]"):
        registry.checks_table()
