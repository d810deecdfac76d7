"""What the report shows of a row of the attention table, whichever family wrote it (attention, FP8): a point's
shape in words, for the failure and check tables."""

from __future__ import annotations

import numpy as np
import pandas as pd


def shape(row) -> str:
    """``B=.. H=.. N=.. d=..`` (``Nq=.. Nk=..`` when they differ) and ``causal``, for the failure tables."""

    def part(key):
        v = row.get(key)
        return "?" if pd.isna(v) else str(int(v))

    nq, nk = part("seqlen_q"), part("seqlen_k")
    n = f"N={nq}" if nq == nk else f"Nq={nq} Nk={nk}"
    causal = row.get("causal")  # a bool as the table's reader typed it
    causal = isinstance(causal, (bool, np.bool_)) and bool(causal)
    return f"B={part('batch')} H={part('heads')} {n} d={part('head_dim')}" + (" causal" if causal else "")
