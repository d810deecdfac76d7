"""Run the CPU pipeline of two checkouts on their shipped result sets and compare what they produce, file by file.

    python tools/compare_runs.py OLD NEW [--work DIR]

``OLD`` and ``NEW`` are checkouts (work trees) of this project, say a commit before a refactoring and one after
it. Each runs ``snakemake --profile workflow/profiles/cpu`` with the interpreter checks off (they measure
nothing the comparison needs), its results written under ``DIR/<old|new>/``. Then:

- verdicts: ``results/audit/verdicts.csv``, row by row (by claim and GPU), every column the two share;
- figures: every figure's table (``<name>.csv`` under ``results/report/``, wherever a layout puts it),
  matched by figure name, compared as tables (numbers to 1e-9 relative);
- tables: every table of the HTML report (its text, cell by cell), as a multiset: the same tables, in
  whatever section order.

Text is compared after two normalisations: each run's results folder is written ``results/`` (the verdicts'
evidence names the files it read), and every ``--moved OLD=NEW`` path is replaced (a module the evidence names
that a refactoring moved). ``--ignore-column COL`` leaves a verdict column out of the comparison, and its values
out of the report's tables (each run's own values are replaced there by a placeholder), for a change that
rewrites that column on purpose (say, evidence written anew) and must leave everything else as it was. Prints
one line per compared file and a summary; exits 1 when anything differs.
"""

from __future__ import annotations

import argparse
import collections
import html
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

CONFIG = "attention: {interpreter_check: {enabled: false}}\n"


def run(checkout: Path, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.yaml").write_text(CONFIG)
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "--cores",
        "2",
        "--profile",
        "workflow/profiles/cpu",
        "--configfile",
        str(out / "compare.yaml"),
        "--config",
        f"results_dir={out / 'results'}",
        f"report={out / 'report.html'}",
    ]
    r = subprocess.run(cmd, cwd=checkout, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{checkout}: the pipeline failed\n{(r.stdout + r.stderr)[-4000:]}")
    return out


def figure_tables(results: Path) -> dict[str, Path]:
    return {p.stem: p for p in sorted((results / "report").rglob("*.csv"))}


def normalise(text: str, run: Path, moved: dict[str, str]) -> str:
    text = text.replace(f"{run / 'results'}/", "results/")
    for old, new in moved.items():
        text = text.replace(old, new)
    return text


IGNORED = "⟨ignored⟩"  # what an ignored column's value reads as in the report's tables


def _without(text: str, ignored: set[str]) -> str:
    """``text`` with every one of ``ignored`` in it (the longest first) written ``IGNORED``."""
    for value in sorted(ignored, key=len, reverse=True):
        text = text.replace(value, IGNORED)
    return text


def report_tables(path: Path, moved: dict[str, str], ignored: set[str] = frozenset()) -> collections.Counter:
    """Every table of the report, as its cells' text (normalised after the markup is stripped, since the report
    marks up the words of a path; with ``ignored`` values in it written ``IGNORED``)."""
    text = path.read_text(encoding="utf-8")
    out = collections.Counter()
    for table in re.findall(r"<table.*?</table>", text, re.S):
        cells = [
            normalise(html.unescape(re.sub(r"<[^>]+>", "", c)).strip(), path.parent, moved)
            for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", table, re.S)
        ]
        if ignored:
            cells = [_without(" ".join(c.split()), ignored) for c in cells]
        out[" | ".join(cells)] += 1
    return out


def same_frames(a: pd.DataFrame, b: pd.DataFrame) -> str:
    """'' when equal, else what differs."""
    if list(a.columns) != list(b.columns):
        return f"columns differ: {sorted(set(a.columns) ^ set(b.columns))} (or their order)"
    if len(a) != len(b):
        return f"{len(a)} rows against {len(b)}"
    try:
        pd.testing.assert_frame_equal(
            a.reset_index(drop=True), b.reset_index(drop=True), check_dtype=False, rtol=1e-9, atol=0
        )
    except AssertionError as exc:
        return str(exc).splitlines()[0] + " " + " ".join(str(exc).splitlines()[1:4])
    return ""


def verdicts(run: Path, moved: dict[str, str]) -> pd.DataFrame:
    df = pd.read_csv(run / "results" / "audit" / "verdicts.csv", keep_default_na=False)
    df["evidence"] = [normalise(e, run, moved) for e in df["evidence"]]
    return df.sort_values(["claim_id", "gpu"])


def compare(
    old: Path, new: Path, moved: dict[str, str] | None = None, ignore: tuple[str, ...] = ()
) -> list[tuple[str, str]]:
    """(what, '' or how it differs) for every compared file; the verdict columns ``ignore`` left out."""
    out, moved = [], moved or {}
    va, vb = verdicts(old, moved), verdicts(new, {})
    shared = [c for c in va.columns if c in vb.columns and c not in ignore]
    out.append(("verdicts.csv", same_frames(va[shared], vb[shared])))
    fa, fb = figure_tables(old / "results"), figure_tables(new / "results")
    for name in sorted(set(fa) | set(fb)):
        if name not in fa or name not in fb:
            out.append((f"figure {name}", f"only in {'new' if name in fb else 'old'}"))
            continue
        out.append((f"figure {name}", same_frames(pd.read_csv(fa[name]), pd.read_csv(fb[name]))))
    left_out = [{" ".join(str(v).split()) for c in ignore for v in frame[c] if str(v)} for frame in (va, vb)]
    ta = report_tables(old / "report.html", moved, left_out[0])
    tb = report_tables(new / "report.html", {}, left_out[1])
    for label, (x, y) in {"only in old": (ta, tb), "only in new": (tb, ta)}.items():
        for table, n in (x - y).items():
            out.append((f"report table {table[:80]!r}", f"{label} ({n}×)"))
    out.append((f"report tables ({sum(ta.values())} old, {sum(tb.values())} new)", "" if ta == tb else "differ"))
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--work", type=Path, default=Path("compare-runs"))
    ap.add_argument("--no-run", action="store_true", help="compare the results already under --work")
    ap.add_argument(
        "--moved",
        action="append",
        default=[],
        metavar="OLD=NEW",
        help="a path the old run's text names that the new one names NEW (repeatable)",
    )
    ap.add_argument(
        "--ignore-column",
        action="append",
        default=[],
        metavar="COL",
        help="a verdict column to leave out, in the verdicts and the report's tables (repeatable)",
    )
    args = ap.parse_args(argv)
    work = args.work.resolve()
    if not args.no_run:
        run(args.old.resolve(), work / "old")
        run(args.new.resolve(), work / "new")
    results = compare(work / "old", work / "new", dict(m.split("=", 1) for m in args.moved), tuple(args.ignore_column))
    for what, diff in results:
        print(f"{'same' if not diff else 'DIFFERS'}  {what}" + (f": {diff}" if diff else ""))
    bad = sum(1 for _, d in results if d)
    print(f"{len(results) - bad} of {len(results)} compared files the same")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
