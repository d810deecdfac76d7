"""The attention family's run: one shard in, its rows out (``analysis.families.attention.measure`` says what
each experiment measures, ``analysis.families._shared.attention_measure`` how a point is measured;
variable-length batches: ``analysis.families.attention.varlen``; batches of paged requests:
``analysis.families.attention.serving``)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from analysis.families.attention import measure, serving, varlen
from analysis.families.attention.plan import Spec
from analysis.families.attention.serving_plan import ServingSpec

log = logging.getLogger(__name__)


def run(
    spec: Spec | ServingSpec, env: dict, device: str = "cuda", log_line: Callable[[str], None] = log.info, files=None
) -> list[dict]:
    """Measure every point of ``spec``; rows of the attention table (``files`` is not used)."""
    if isinstance(spec, ServingSpec):
        return serving.run(spec, env, device, log_line)
    if spec.experiment == "varlen":
        return varlen.run(spec, env, device, log_line)
    return measure.run_dense(spec, env, device, log_line)
