"""A claim judged on its subject: the kernel it is about (``Claim.subject``), its official build where that has rows
here, else our replication, and the words that say which.

``judged(claim, results, gpu, **where)`` is what an evaluator asks before it picks rows: which implementation
its verdict reads among the rows ``where`` selects on ``gpu``, which one it shows beside, and the note's words.
An official subject that finished there is judged, our replication (``ours``) beside it ("official 73%, ours
76%"); one that did not is replaced by ours, and the words say why: not installed here (its rows are
``absent``), did not finish (their statuses), or no rows in this result set (measured before the peers were).
A subject that is ours (no official build runs here) is judged on ours, and the words say why.
"""

from __future__ import annotations

import dataclasses

from analysis.audit.claims import Claim
from analysis.audit.context import Results, Selection


@dataclasses.dataclass(frozen=True)
class Judged:
    impl: str  # what the verdict is judged on
    beside: str  # what is shown beside it ("" when nothing is)
    text: str  # the note's words on both
    official: bool  # whether ``impl`` is the official build
    missing: Selection | None = None  # the subject's rows that did not finish, where they decided it (evidence)

    def label(self, impl: str) -> str:
        """ "official" or "ours" for ``impl`` (the judged one or the one beside it), as the figures are named."""
        return "official" if impl == self.impl and self.official else "ours"

    @property
    def evidence(self) -> tuple[Selection, ...]:
        """The selections beside the evaluator's own that its evidence names (the missing subject's rows)."""
        return (self.missing,) if self.missing is not None else ()


def judged(claim: Claim, results: Results, gpu: str, **where) -> Judged:
    """The implementation ``claim``'s verdict on ``gpu`` is judged on, among the rows of ``results`` that ``where``
    selects (module docstring)."""
    s = claim.subject
    if s is None:
        raise ValueError(f"claim {claim.id!r} names no subject")
    if not s.official:
        return Judged(s.impl, "", f"judged on {s.impl}: {s.why}", official=False)
    if not results.select(gpu, impl=s.impl, **where).empty:
        return Judged(s.impl, s.ours, f"judged on {s.impl}, {s.why}; ours ({s.ours}) beside it", official=True)
    tried = results.select(gpu, finished=False, impl=s.impl, **where)
    counts = tried.rows["status"].value_counts()
    if tried.empty:
        why = "has no rows in this result set"
    elif set(counts.index) == {"absent"}:
        why = "is not installed here"
    else:
        why = "did not finish here (" + ", ".join(f"{n} {status}" for status, n in counts.items()) + ")"
    return Judged(
        s.ours,
        "",
        f"judged on ours ({s.ours}): {s.impl} {why}; it is the claim's subject, {s.why}",
        official=False,
        missing=None if tried.empty else tried,
    )
