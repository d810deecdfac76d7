"""What a config's grid is expected to cost, per family: ``python -m analysis.budget workflow/config.yaml [...]``.

For every registered family whose plan estimates its shards (``estimate_seconds``, ``compile_keys``,
``COMPILE_S``), the table that ``workflow/config.yaml`` quotes under the family's section: shards, points,
estimated seconds with a warm Triton cache, and the extra seconds of first compiles with an empty one
(``analysis.core.costs``). An estimate fitted to a shipped run's logs, not a measurement: the real cost is in
each shard's log.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from analysis import registry
from analysis.configuration import load_config
from analysis.core.costs import format_budget, tally_budget
from analysis.core.family import Family


def estimates(fam: Family) -> bool:
    return all(hasattr(fam.plan, name) for name in ("estimate_seconds", "compile_keys", "COMPILE_S"))


def budget(fam: Family, config: dict) -> dict[str, dict]:
    """Experiment → shards, points, seconds and compile seconds of the family's shards of ``config``."""
    plan = fam.plan
    return tally_budget(fam.shards(config), plan.spec, plan.estimate_seconds, plan.compile_keys, plan.COMPILE_S)


def budget_table(fam: Family, config: dict) -> list[str]:
    """The family's budget as the lines ``workflow/config.yaml`` quotes (empty when it makes no shard)."""
    b = budget(fam, config)
    return format_budget(b) if b else []


# In a config file, a family's quoted budget is the comment lines "#   ..." right under a line
# "# Budget of <family> ...:" (at any indentation, the same for both).
_HEADER = re.compile(r"^(\s*)# Budget of (\w+)\b.*:$")


def quoted(text: str) -> dict[str, list[str]]:
    """Family → the budget lines a config file quotes for it."""
    lines, out = text.splitlines(), {}
    for i, line in enumerate(lines):
        m = _HEADER.match(line)
        if m:
            prefix, quote = m.group(1) + "#   ", []
            for later in lines[i + 1 :]:
                if not later.startswith(prefix):
                    break
                quote.append(later[len(prefix) :])
            out[m.group(2)] = quote
    return out


def requote(text: str, config: dict) -> str:
    """``text`` with every quoted budget replaced by the one ``config`` gives now."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        out.append(lines[i])
        m = _HEADER.match(lines[i])
        i += 1
        if m:
            prefix = m.group(1) + "#   "
            while i < len(lines) and lines[i].startswith(prefix):
                i += 1
            out += [prefix + line for line in budget_table(registry.family(m.group(2)), config)]
    return "\n".join(out) + "\n"


def main(args: list[str]) -> None:
    """Print every family's budget of the config files given; with ``--write``, rewrite the budgets quoted in
    the last of them instead."""
    write = "--write" in args
    paths = [a for a in args if a != "--write"] or ["workflow/config.yaml"]
    config = load_config(paths)
    if write:
        Path(paths[-1]).write_text(requote(Path(paths[-1]).read_text(encoding="utf-8"), config), encoding="utf-8")
        return
    for fam in registry.FAMILIES.values():
        if estimates(fam):
            print(f"{fam.name}:")
            print("\n".join(f"  {line}" for line in budget_table(fam, config)) or "  (no shards)")


if __name__ == "__main__":
    main(sys.argv[1:])
