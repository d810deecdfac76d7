"""The shipped result sets (``reports/reference/<gpu>/``): which there are, and whether each is complete.

``analysis.publish`` writes every result set with a ``MANIFEST.json`` listing the SHA-256 of each file.
The workflow renders the report from these sets where it does not measure, so a damaged set must stop it,
not quietly change what the report says (a truncated ``ops.csv`` flipped two verdicts; a missing folder
dropped a whole GPU section and made 29 claims untestable). ``verified_gpus(root)`` therefore checks, when
the workflow is planned:

- that ``root`` (the config's ``reference_dir``) is a folder holding at least one result set; a user who
  wants a report without shipped results says so with ``reference_dir: null`` (the report then carries a
  banner saying no shipped results are included);
- per result set: a readable ``MANIFEST.json`` whose ``gpu`` is the folder's name, which lists at least the
  attention table and the environment, and every file it lists present with its SHA-256.

Any problem raises ``ShippedSetError`` naming the set and the file.

What a set's manifest lists is what was measured and published; files derived from those (``DERIVED``: the
set's ``summary.md``, regenerated from its tables by ``analysis.summary``) are never listed, so that they can
be regenerated when their generator changes without altering the set. A manifest that lists one is refused.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

MANIFEST = "MANIFEST.json"
REQUIRED = ("environment.json",)  # and at least one result table (a .csv at the top of the set)
DERIVED = ("summary.md",)


class ShippedSetError(ValueError):
    """A shipped result set is missing, incomplete or altered; the message names the set and the file."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def verify(folder: str | Path) -> dict:
    """Check one result set against its manifest; returns the manifest."""
    folder = Path(folder)
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise ShippedSetError(f"shipped result set {folder}: no {MANIFEST} (publish sets with analysis.publish)")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ShippedSetError(f"{manifest_path}: not a valid manifest ({exc})") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        raise ShippedSetError(f"{manifest_path}: no 'files' listing the set's files and their SHA-256")
    if manifest.get("gpu") != folder.name:
        raise ShippedSetError(f"{manifest_path}: gpu is {manifest.get('gpu')!r}, but the folder is {folder.name!r}")
    missing = [name for name in REQUIRED if name not in files]
    if not any("/" not in name and name.endswith(".csv") for name in files):
        missing.append("a result table (<table>.csv)")
    if missing:
        raise ShippedSetError(
            f"{manifest_path}: the set lacks {missing} (a result set needs {list(REQUIRED)} and a result table)"
        )
    derived = [name for name in DERIVED if name in files]
    if derived:
        raise ShippedSetError(
            f"{manifest_path}: lists {derived}, which are derived from the set's tables and "
            "regenerated, never published"
        )
    for name, digest in sorted(files.items()):
        path = folder / name
        if not path.is_file():
            raise ShippedSetError(f"shipped result set {folder}: {name} is listed in {MANIFEST} but missing")
        if _sha256(path) != digest:
            raise ShippedSetError(
                f"shipped result set {folder}: {name} differs from the file that was published (SHA-256 "
                f"mismatch with {MANIFEST}): it is truncated or edited; restore it (git checkout -- {path})"
            )
    return manifest


def verified_gpus(root: str | Path | None) -> list[str]:
    """The GPU types with a complete shipped result set under ``root``, each verified; [] for ``None`` (the
    user opted out of shipped results)."""
    if root is None:
        return []
    root = Path(root)
    if not root.is_dir():
        raise ShippedSetError(
            f"reference_dir {str(root)!r} is not a folder: the shipped results are missing. Restore it, point "
            "reference_dir at the folder, or set reference_dir: null to render the report without shipped results"
        )
    sets = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not sets:
        raise ShippedSetError(
            f"reference_dir {str(root)!r} holds no result set (one folder per GPU type); set reference_dir: null "
            "to render the report without shipped results"
        )
    for folder in sets:
        verify(folder)
    return [p.name for p in sets]
