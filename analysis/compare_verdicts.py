"""Two result sets' verdicts side by side: ``python -m analysis.compare_verdicts SET_A SET_B``.

What a publisher runs before replacing a shipped set (``docs/shipping.md``): do the two runs' verdicts agree,
and where they do not, did both runs see it coming? Each SET is a folder of result tables: one GPU type's set
(``reports/reference/h200/``, ``results/h200/``: its ``attention.csv``, ``ops.csv``, ``traffic.csv`` side by
side, its GPU type read from its ``environment.json``, else the folder's name), or a results folder holding
one such set per GPU type (``results/``). Both are audited with the code of this checkout (not with the code
that measured them): the articles' claims and the families' performance targets, each measured verdict with
its borderline band (``analysis.audit``; the band widens to the rows' repeat rounds where they have them,
``analysis.audit.band``). Verdict rows are matched by claim and GPU type, over the GPU types both sets have
(and the rows recomputed from the models, which do not depend on a set). Every row whose verdict differs is
listed with both verdicts, observations and bands and whether it was borderline in A and in B.

A change flagged borderline in both sets is one the measured run-to-run spread covers. Any other change is
not: flagged in one set only or in neither, or a row judged in one set and untestable (or missing) in the
other. Exit status: 0 when every change was flagged in both sets, 1 when one was not, 2 when a set cannot be
read (the message names it). The GPU-independent tables (compiled kernels) are not part of a set: the claims
that read them are untestable in both and never differ. (``tools/compare_runs.py`` is the converse: two
checkouts' outputs from the same shipped sets.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from analysis import audit, registry
from analysis.core import validate
from analysis.pipeline import read_context

KEY = ["claim_id", "gpu", "nth"]  # a verdict row: its claim, its GPU type, its place among that pair's rows


class SetError(ValueError):
    """A result set that cannot be compared; the message names the folder."""


def gpu_tables() -> list[str]:
    """The tables measured on each GPU type (not the GPU-independent ones)."""
    return [name for name in registry.tables() if any(f.scope == "gpu" for f in registry.of_table(name))]


def result_sets(folder: str | Path) -> dict[str, dict[str, Path]]:
    """GPU type → table name → file of the set(s) in ``folder`` (one set, or one per subfolder)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SetError(f"{folder}: no such folder")
    names = gpu_tables()

    def tables(path: Path) -> dict[str, Path]:
        return {n: path / f"{n}.csv" for n in names if (path / f"{n}.csv").is_file()}

    found = {folder: tables(folder)} if tables(folder) else {p: tables(p) for p in sorted(folder.iterdir())}
    out: dict[str, dict[str, Path]] = {}
    for path, files in found.items():
        if not files:
            continue
        gpu = _gpu_of(path)
        if gpu in out:
            raise SetError(f"{folder}: two sets of GPU type {gpu!r} ({path.name} and another)")
        out[gpu] = files
    if not out:
        raise SetError(f"{folder}: no result tables ({', '.join(f'{n}.csv' for n in names)}) in it or its subfolders")
    return out


def _gpu_of(path: Path) -> str:
    env = path / "environment.json"
    return validate.read_environment(env)["gpu"] if env.is_file() else path.name


def verdicts(sets: dict[str, dict[str, Path]]) -> pd.DataFrame:
    """The audit of the claims and the performance targets on ``sets`` (``result_sets``), with the current code."""
    by_table: dict[str, dict[str, Path]] = {}
    for gpu, files in sets.items():
        for name, path in files.items():
            by_table.setdefault(name, {})[gpu] = path
    claims = [*registry.claims(), *(t for ts in registry.targets().values() for t in ts)]
    df = audit.audit(claims, read_context(by_table), registry.evaluators())
    return df.assign(nth=df.groupby(["claim_id", "gpu"]).cumcount())


def changes(a: pd.DataFrame, b: pd.DataFrame, gpus: set[str]) -> pd.DataFrame:
    """The verdict rows of ``a`` and ``b`` (``verdicts``) on ``gpus`` and the analytic ones whose verdict differs
    (a row missing from one side counts as differing), with ``flagged``: borderline in both."""
    keep = lambda df: df[df["gpu"].isin(gpus | {audit.ANALYTIC})]  # noqa: E731
    cols = [*KEY, "verdict", "observed", "band", "borderline"]
    both = keep(a)[cols].merge(keep(b)[cols], on=KEY, how="outer", suffixes=("_a", "_b"), indicator=True)
    differ = both[(both["_merge"] != "both") | (both["verdict_a"] != both["verdict_b"])].copy()
    for side in ("a", "b"):
        differ[f"verdict_{side}"] = differ[f"verdict_{side}"].fillna("(no row)")
        differ[f"borderline_{side}"] = differ[f"borderline_{side}"].eq(True)  # (no row: not borderline)
        for col in ("observed", "band"):
            differ[f"{col}_{side}"] = differ[f"{col}_{side}"].fillna("")
    differ["flagged"] = differ["borderline_a"] & differ["borderline_b"]
    return differ.drop(columns="_merge").sort_values(KEY).reset_index(drop=True)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _why(row) -> str:
    if row.flagged:
        return "flagged in both"
    if "untestable" in (row.verdict_a, row.verdict_b) or "(no row)" in (row.verdict_a, row.verdict_b):
        return "NOT FLAGGED: judged in one set only"
    return "NOT FLAGGED in " + " and ".join(s for s, f in (("A", row.borderline_a), ("B", row.borderline_b)) if not f)


def report(names: tuple[str, str], a: pd.DataFrame, b: pd.DataFrame, gpus: set[str], only: dict) -> list[str]:
    """The lines the command prints: the sets, their borderline counts, every change (``changes``)."""
    diff = changes(a, b, gpus)
    measured = lambda df: df[df["gpu"].isin(gpus)]  # noqa: E731
    judged = lambda df: measured(df)[measured(df)["verdict"] != "untestable"]  # noqa: E731
    lines = [
        f"A: {names[0]}",
        f"B: {names[1]}",
        f"GPU types compared: {', '.join(sorted(gpus))}"
        + "".join(f"; only in {side}: {', '.join(sorted(g))}" for side, g in only.items() if g),
        f"verdict rows (claims and performance targets): {len(measured(a))} measured in A, {len(measured(b))} in B; "
        f"borderline: {int(judged(a)['borderline'].sum())} of {len(judged(a))} judged in A, "
        f"{int(judged(b)['borderline'].sum())} of {len(judged(b))} in B",
    ]
    if diff.empty:
        return [*lines, "every verdict row is the same in both sets"]
    lines.append(f"{len(diff)} verdict row{'s differ' if len(diff) > 1 else ' differs'}:")
    for r in diff.itertuples():
        lines += [
            f"  {r.claim_id} [{r.gpu}]: {r.verdict_a} → {r.verdict_b}; borderline in A: {_yes(r.borderline_a)}, "
            f"in B: {_yes(r.borderline_b)}: {_why(r)}",
            f"      A: {r.observed_a or '—'}" + (f" (band: {r.band_a})" if r.band_a else ""),
            f"      B: {r.observed_b or '—'}" + (f" (band: {r.band_b})" if r.band_b else ""),
        ]
    bad = int((~diff["flagged"]).sum())
    lines.append(f"{bad} of {len(diff)} not flagged borderline in both sets" if bad else "each flagged in both sets")
    return lines


def compare(set_a: str | Path, set_b: str | Path) -> tuple[list[str], int]:
    """The report's lines and the exit status (0: every change flagged in both sets, 1: not)."""
    sa, sb = result_sets(set_a), result_sets(set_b)
    gpus = set(sa) & set(sb)
    if not gpus:
        raise SetError(f"{set_a} ({', '.join(sorted(sa))}) and {set_b} ({', '.join(sorted(sb))}) share no GPU type")
    a, b = verdicts(sa), verdicts(sb)
    lines = report((str(set_a), str(set_b)), a, b, gpus, {"A": set(sa) - gpus, "B": set(sb) - gpus})
    return lines, int(not changes(a, b, gpus)["flagged"].all())


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.compare_verdicts", description=__doc__.split("\n\n")[0])
    ap.add_argument("set_a", metavar="SET_A", help="a result set's folder (or a results folder), e.g. the shipped one")
    ap.add_argument("set_b", metavar="SET_B", help="the other, e.g. a fresh run's results/<gpu>")
    args = ap.parse_args(argv)
    try:
        lines, status = compare(args.set_a, args.set_b)
    except (SetError, validate.DataError) as exc:
        ap.exit(2, f"{ap.prog}: error: {exc}\n")
    print("\n".join(lines))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
