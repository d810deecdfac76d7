"""Where the report's numbers come from: per GPU type, the shipped result set or this run, with the commits and
days its rows were measured at (``origin``, the first screen); per section, the commits its rows were measured
at, how many rows each, and which measured-code files changed between those commits (``describe``, as the
shipped set's manifest records them, ``analysis.publish.measured_code_diff``).

``peers_text``: which official kernels ran beside ours on a GPU type (``analysis.families._shared.peers``), with
the versions its ``environment.json`` records, and which were not installed there.

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


def _per_commit(shas: list[pd.Series]) -> list[tuple[str, int]]:
    """(commit, rows) of the rows whose commits are ``shas``, most rows first; "unknown" where none is recorded."""
    both = pd.concat([s.fillna("unknown").astype(str) for s in shas]) if shas else pd.Series(dtype=str)
    counts = both.value_counts()
    return [(str(sha), int(n)) for sha, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def rows_per_commit(frames: list[pd.DataFrame], section: str) -> list[tuple[str, int]]:
    """(commit, rows) of the rows of ``section`` (an experiment, or a family such as quant or moe), most
    rows first; rows without a commit count under "unknown"."""
    return _per_commit(
        [df.loc[tables.section_mask(df, section), "git_sha"] for df in frames if df is not None and not df.empty]
    )


def origin(frames: list[pd.DataFrame], manifest: dict | None) -> dict:
    """Where a GPU type's rows (``frames``: its tables) come from: a shipped result set (its tables have the
    ``MANIFEST.json`` of ``analysis.publish`` beside them: ``manifest``) or this run. ``rows``, ``commits``
    (commit, rows) and the first and last ``days`` they were measured on are read from the rows themselves
    (``git_sha``, ``timestamp``); ``published``: the day the shipped set was published."""
    frames = [df for df in frames if df is not None and not df.empty]
    commits = _per_commit([df["git_sha"] if "git_sha" in df else pd.Series([None] * len(df)) for df in frames])
    stamps = [df["timestamp"].dropna() for df in frames if "timestamp" in df]
    days = sorted({str(t)[:10] for s in stamps for t in s})
    return {
        "shipped": manifest is not None,
        "rows": sum(len(df) for df in frames),
        "commits": [(sha[:SHORT], n) for sha, n in commits],
        "days": (days[0], days[-1]) if days else (),
        "published": str((manifest or {}).get("published", ""))[:10],
    }


def _rows(n: int) -> str:
    return f"{n} row{'' if n == 1 else 's'}"


def rows_text(o: dict, verb: str = "measured") -> str:
    """The rows of an ``origin`` in words: how many, at which commits, on which days."""
    if not o["rows"]:
        return "no rows"
    commits = o["commits"]
    if len(commits) == 1:
        at = "an unrecorded commit" if commits[0][0] == "unknown" else f"commit {commits[0][0]}"
    else:
        at = "commits " + ", ".join(f"{sha} ({_rows(n)})" for sha, n in commits)
    days = o["days"]
    when = "" if not days else f" on {days[0]}" if days[0] == days[1] else f" from {days[0]} to {days[1]}"
    return f"{_rows(o['rows'])} {verb} at {at}{when}"


def origin_text(o: dict) -> str:
    """``origin`` in words, for the first screen."""
    if not o["shipped"]:
        return f"measured by this run: {rows_text(o)}"
    published = f", published {o['published']}" if o["published"] and o["published"] not in o["days"] else ""
    return f"the shipped result set, not measured by this run: {rows_text(o)}{published}"


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


def peers_text(frames: list[pd.DataFrame], env: dict) -> str:
    """Which official kernels ran beside ours on a GPU type (``analysis.families._shared.peers``): per peer with
    rows in its tables (``frames``), the versions ``environment.json`` (``env``) records and how many of its rows
    finished, or that it is not installed there (its rows are ``absent``); "" when no table has a peer's row (a
    result set measured before the peers were)."""
    from analysis.families._shared import peers

    frames = [df for df in frames if df is not None and not df.empty and "impl" in df]
    recorded = env.get("peers") or {}
    out = []
    for impl in peers.PEERS:
        status = pd.Series([s for df in frames for s in df.loc[df["impl"] == impl, "status"]], dtype=object)
        if status.empty:
            continue
        absent, done = int((status == "absent").sum()), int((status == "ok").sum())
        if absent == len(status):
            out.append(f"{impl} not installed ({_rows(absent)} absent)")
            continue
        versions = peers.version_text(recorded[impl]) if impl in recorded else "versions not recorded"
        out.append(f"{impl} ({versions}): {done} of {_rows(len(status))} finished")
    return "; ".join(out)
