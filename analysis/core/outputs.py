"""Every file the pipeline writes is written whole or not at all: a temporary file, then a rename.

A step that fails halfway (bad input, a crash, a killed job) must never leave a half-written table, verdict
file or report, nor delete the last good one. So each writer here writes to a temporary name in the same
folder (a rename within one file system is atomic) and renames it over the target only once everything is
written; a folder of figures is built under a temporary name and swapped in whole. The workflow's rules
mark these outputs ``update()``, so that Snakemake itself does not delete the previous version before the
job runs (and restores it if the job fails).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pandas as pd


def _temporary(path: Path, what: str = "tmp") -> Path:
    return path.with_name(f".{path.name}.{what}-{os.getpid()}")


def write_bytes(path: str | Path, data: bytes) -> Path:
    """``data`` to ``path`` through a temporary file in the same folder (created if needed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_text(path: str | Path, text: str) -> Path:
    """``text`` (UTF-8) to ``path`` through a temporary file."""
    return write_bytes(path, text.encode("utf-8"))


def write_csv(df: pd.DataFrame, path: str | Path) -> Path:
    """A frame as CSV (no index) to ``path`` through a temporary file."""
    return write_text(path, df.to_csv(index=False))


@contextlib.contextmanager
def folder(path: str | Path) -> Iterator[Path]:
    """Build a folder's new contents under a temporary name (yielded); on success it replaces ``path`` whole,
    on an exception it is removed and ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    work, old = _temporary(path), _temporary(path, "old")
    for leftover in (work, old):
        shutil.rmtree(leftover, ignore_errors=True)
    work.mkdir()
    try:
        yield work
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    if path.exists():
        path.rename(old)
    work.rename(path)
    shutil.rmtree(old, ignore_errors=True)
