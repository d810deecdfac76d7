"""What a grid of shards is expected to cost: tallied per experiment from a plan's estimates, and printed.

A family's plan estimates one shard (``estimate_seconds``, ``compile_keys``, ``COMPILE_S``; an estimate fitted to
a shipped run's logs, not a measurement); ``tally_budget`` adds its shards up per experiment and
``format_budget`` prints the table that ``workflow/config.yaml`` quotes under each family's section
(``python -m analysis.budget`` recomputes every family's, and a test keeps the quotes equal). ``rounds_seconds`` is
what every plan adds for a timed point's repeat rounds (``analysis.core.harness``, step 6).
"""

from __future__ import annotations

ROUND_SCALE = 0.25  # a repeat round's share of the point's warm-up and repetition time (harness.ROUND_SCALE)
ROUND_CALLS = 1  # the fewest calls of a round: one timed (no warm-up where a call outlasts it)


def rounds_seconds(rounds: int, warmup_ms: float, rep_ms: float, call_s: float) -> float:
    """Seconds of a timed point's ``rounds`` repeat rounds: each ``ROUND_SCALE`` of its warm-up and repetition
    time, or ``ROUND_CALLS`` call of ``call_s`` seconds where that takes longer."""
    return rounds * max(ROUND_SCALE * (warmup_ms + rep_ms) / 1e3, ROUND_CALLS * call_s)


def tally_budget(shards: dict[str, dict], spec_of, estimate, keys_of, compile_s: dict) -> dict[str, dict]:
    """Experiment → shards, points, estimated seconds with a warm Triton cache (``seconds``) and the extra
    seconds of first compiles with an empty one (``compile``; each specialisation counted once, under the
    first shard in name order that needs it). ``spec_of(fields)`` gives a shard's spec (its ``experiment``
    and ``points()``), ``estimate(fields)`` its warm-cache seconds, ``keys_of(fields)`` the specialisations it
    compiles, whose first element keys ``compile_s`` (seconds of one first compile)."""
    out: dict[str, dict] = {}
    seen: set[tuple] = set()
    for name in sorted(shards):
        fields = shards[name]
        spec = spec_of(fields)
        e = out.setdefault(spec.experiment, {"shards": 0, "points": 0, "seconds": 0.0, "compile": 0.0})
        e["shards"] += 1
        e["points"] += spec.points()
        e["seconds"] += estimate(fields)
        new = keys_of(fields) - seen
        seen |= new
        e["compile"] += sum(compile_s[k[0]] for k in new)
    return out


def format_budget(b: dict[str, dict]) -> list[str]:
    """A ``budget`` (experiment → shards, points, seconds, compile) as aligned comment lines with a total."""
    lines = [f"{'experiment':<20}{'shards':>7}{'points':>8}{'est. s':>8}{'+compile':>10}"]
    for name, e in b.items():
        lines.append(f"{name:<20}{e['shards']:>7}{e['points']:>8}{e['seconds']:>8.0f}{e['compile']:>10.0f}")
    tot = {k: sum(e[k] for e in b.values()) for k in ("shards", "points", "seconds", "compile")}
    lines.append(f"{'total':<20}{tot['shards']:>7}{tot['points']:>8}{tot['seconds']:>8.0f}{tot['compile']:>10.0f}")
    return lines
