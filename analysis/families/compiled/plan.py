"""The compiled family's plan: which kernel variants to compile and read (``compiled:`` in the config).

Torch-free, like every plan. The family is GPU-independent (scope ``machine``): its one shard, ``kernels``,
compiles every variant of the section once per run on this machine's CPU, into
``results/compiled/kernels.csv`` (``analysis.families.compiled.run`` says what is read from each).
"""

from __future__ import annotations

import dataclasses

EXPERIMENTS = ("fa3-schedules", "producer-registers", "mma-issue")


@dataclasses.dataclass
class CompiledSpec:
    """The ``compiled`` config section: what to compile, and how many compiler processes at once."""

    dtype: str
    head_dims: list[int]
    schedules: list[str]
    experiments: list[str]
    producer_regs: list[int]
    workers: int = 1

    def points(self) -> int:
        return len(jobs(dataclasses.asdict(self)))


def spec(fields: dict) -> CompiledSpec:
    return CompiledSpec(**fields)


def shards(config: dict) -> dict[str, dict]:
    """The one shard of the ``compiled`` section: the section's fields."""
    fields = {k: v for k, v in config["compiled"].items() if k != "enabled"}
    CompiledSpec(**fields)
    return {"kernels": fields}


def jobs(section: dict) -> list[tuple]:
    """The variants of the config section ``compiled`` (see workflow/config.yaml), in a fixed order."""
    out = []
    dtype = section["dtype"]
    if "fa3-schedules" in section["experiments"]:
        for d in section["head_dims"]:
            for schedule in section["schedules"]:
                out.append(("fa3-schedules", d, dtype, False, schedule, None))
    if "producer-registers" in section["experiments"]:
        for schedule in ("fa3", "no-tma"):
            for regs in section["producer_regs"]:
                out.append(("producer-registers", 128, dtype, False, schedule, regs))
    if "mma-issue" in section["experiments"]:
        for capability in (90, 80):
            out.append(("mma-issue", 128, dtype, False, f"sm_{capability}", None))
    return out
