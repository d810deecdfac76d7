"""Where the rows of one report section come from: the commits they were measured at, how many rows each,
and which measured-code files changed between those commits (as the shipped set's manifest records them,
``analysis.publish.measured_code_diff``).

A result set resumed from a shipped one mixes commits, and only its CSVs and manifest say so; the report
shows this per section so a reader knows which kernel version each figure's rows ran.
"""

from __future__ import annotations

import pandas as pd

from analysis.core import tables

SHORT = 12  # hex digits of a commit shown (the manifest's change keys use as many)


def _same(a: str, b: str) -> bool:
    """Commits written at different lengths (a full hash, a short one) name the same commit."""
    n = min(len(a), len(b))
    return n >= 7 and a[:n] == b[:n]


def rows_per_commit(frames: list[pd.DataFrame], section: str) -> list[tuple[str, int]]:
    """(commit, rows) of the rows of ``section`` (an experiment, or a family such as quant or moe), most
    rows first; rows without a commit count under "unknown"."""
    parts = []
    for df in frames:
        if df is None or df.empty:
            continue
        parts.append(df.loc[tables.section_mask(df, section), "git_sha"].fillna("unknown").astype(str))
    shas = pd.concat(parts) if parts else pd.Series(dtype=str)
    counts = shas.value_counts()
    return [(str(sha), int(n)) for sha, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def code_changes(commits: list[str], manifest: dict | None) -> list[tuple[str, str, list[str]]]:
    """(from, to, files) for each pair of ``commits`` the manifest has a measured-code diff for. The manifest
    diffs its first commit against every later one; pairs it does not record are left out."""
    recorded = (manifest or {}).get("measured_code_changes") or {}
    out = []
    for key, files in recorded.items():
        base, _, other = key.partition("..")
        if any(_same(base, c) for c in commits) and any(_same(other, c) for c in commits):
            out.append((base, other, sorted(files)))
    return out


def describe(frames: list[pd.DataFrame], section: str, manifest: dict | None) -> dict | None:
    """The section's provenance for the report (None when it has no rows): the commits with their row
    counts, and the measured-code changes between them (or why they are not known)."""
    commits = rows_per_commit(frames, section)
    if not commits:
        return None
    shas = [sha for sha, _ in commits if sha != "unknown"]
    changes = code_changes(shas, manifest)
    if len(shas) <= 1:
        remark = "all rows from one commit"
    elif changes:
        remark = ""
    else:
        remark = "the measured-code changes between these commits are not recorded (no manifest lists them)"
    return {
        "commits": [(sha[:SHORT], n) for sha, n in commits],
        "changes": [(a[:SHORT], b[:SHORT], ", ".join(files) or "none") for a, b, files in changes],
        "remark": remark,
    }
