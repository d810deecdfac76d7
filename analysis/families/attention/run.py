"""The attention family's run: one shard in, its rows out (``analysis.families.attention.measure`` says what
each experiment measures, ``analysis.families._shared.attention_measure`` how a point is measured;
variable-length batches: ``analysis.families.attention.varlen``)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from analysis.families.attention import measure, varlen
from analysis.families.attention.plan import Spec

log = logging.getLogger(__name__)


def run(
    spec: Spec, env: dict, device: str = "cuda", log_line: Callable[[str], None] = log.info, files=None
) -> list[dict]:
    """Measure every point of ``spec``; rows of the attention table (``files`` is not used)."""
    if spec.experiment == "varlen":
        return varlen.run(spec, env, device, log_line)
    return measure.run_dense(spec, env, device, log_line)
