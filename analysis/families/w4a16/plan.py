"""The W4A16 family's plan: weight-only quantised linear layers (``w4a16:`` in the config), shards and cost.

Torch-free, like every plan. A shard is one (layer shape, dtype, group size), every M of ``ms`` and every
implementation inside: ``w4a16_<model>_<dtype>_g<group>`` (``_sym`` for the symmetric format), one GPU job
writing ``results/<gpu>/w4a16/<shard>.csv``. The layer shapes are named here (``SHAPES``) and the config lists
names; a test keeps the config schema's list equal to these.

Implementations: ``ours-w4a16`` (int4 dequantised in registers, the default path), ``ours-w8a16`` (int8 per
channel, the default path), their candidate paths ``ours-w4a16-tc`` / ``ours-w8a16-tc`` (the persistent
tensor-core kernel, from M = 64 up) and ``ours-w4a16-streamk`` / ``ours-w8a16-streamk`` (stream-K decoding, up
to M = 64; ``PATH_MS``), ``torch-linear``
(the unquantised 16-bit weight, cuBLAS), ``dequant-linear`` (dequantise to memory, then ``F.linear``: the
unfused path), ``torch-int4pack`` (PyTorch's int4 kernel on the same codes), ``copy-weight`` (a device copy of
the packed int4 codes: the copy-bandwidth ceiling, once per shard).

``estimate_seconds`` is a planning aid, not a measurement (the real cost is in each shard's log), on the
operator-like families' cost model (``analysis.families._shared.operator_plan``): a new process per shard, a
fixed setup per shape (``SHAPE_S``) and per point, the harness's warm-up and repetitions, and the untimed
calls of a point at nominal H200 rates. ``COMPILE_S`` is Triton's first compile of each of our kernels'
specialisations.
"""

from __future__ import annotations

import dataclasses

from analysis.core import models
from analysis.core.costs import rounds_seconds
from analysis.core.flops import gemm_flops
from analysis.families._shared import operator_plan

EXPERIMENTS = ("w4a16",)
# Llama-3 linear layers, in_features → out_features (the weight is [out, in] = [n, k]).
SHAPES = {
    "llama3-8b-qo": (4096, 4096),
    "llama3-8b-up": (4096, 14336),
    "llama3-8b-down": (14336, 4096),
    "llama3-8b-kv": (4096, 1024),
    "llama3-70b-qo": (8192, 8192),
    "llama3-70b-up": (8192, 28672),
    "llama3-70b-down": (28672, 8192),
}
IMPLS = (
    "ours-w4a16",
    "ours-w8a16",
    "ours-w4a16-tc",
    "ours-w4a16-streamk",
    "ours-w8a16-tc",
    "ours-w8a16-streamk",
    "torch-linear",
    "dequant-linear",
    "torch-int4pack",
    "copy-weight",
)
# the kernels.w4a16 path each of our implementations runs (None: the default)
PATHS = {
    "ours-w4a16": None,
    "ours-w8a16": None,
    "ours-w4a16-tc": "tc",
    "ours-w4a16-streamk": "streamk",
    "ours-w8a16-tc": "tc",
    "ours-w8a16-streamk": "streamk",
}
# the rows of x each candidate path is measured at (inclusive bounds): the persistent tensor-core kernel where
# it may replace the default (M ≥ 64), stream-K decoding up to where the default stops splitting K (M ≤ 64);
# both at M = 64, where the heuristic (kernels.w4a16.choose_path) would switch
PATH_MS = {"tc": (64, None), "streamk": (None, 64)}
# each default path's candidates, which figures draw as its variants and the summary judges by its targets
CANDIDATES = {
    base: tuple(impl for impl, path in PATHS.items() if path and impl.startswith(base))
    for base in ("ours-w4a16", "ours-w8a16")
}
DTYPES = ("float16", "bfloat16", "float32")


@dataclasses.dataclass
class W4A16Spec:
    """One shard: a linear layer ``x [m, k] @ W [n, k]ᵀ`` at every m of ``ms``."""

    model: str
    n: int
    k: int
    dtype: str
    group_size: int
    ms: list[int]
    impls: list[str]
    symmetric: bool = False
    warmup_ms: float = 10
    rep_ms: float = 30
    spread_rounds: int = 0  # repeat rounds per timed point (the harness's step 6); the config's default is 3
    check_rows: int = 32
    seed: int = 0
    experiment: str = "w4a16"

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; one of {DTYPES}")
        if self.spread_rounds < 0:
            raise ValueError(f"spread_rounds must be >= 0, got {self.spread_rounds}")
        bad = [i for i in self.impls if i not in IMPLS]
        if bad:
            raise ValueError(f"unknown w4a16 implementations {bad}; known: {list(IMPLS)}")
        if self.group_size not in (32, 64, 128):
            raise ValueError(f"group_size must be 32, 64 or 128, got {self.group_size}")
        if self.k % self.group_size or self.n % 8:
            raise ValueError(f"k={self.k} must be a multiple of group_size and n={self.n} of 8")
        if not self.ms or min(self.ms) < 1:
            raise ValueError("ms must list row counts >= 1")

    def impls_at(self, m: int) -> list[str]:
        """The implementations measured at M = m: all but copy-weight, the candidate paths in their range
        (``PATH_MS``)."""
        return [i for i in self.impls if i != "copy-weight" and measured_at(i, m)]

    def points(self) -> int:
        """Rows: one per (M, impl measured at M), copy-weight once (it does not depend on M)."""
        return sum(len(self.impls_at(m)) for m in self.ms) + ("copy-weight" in self.impls)


def measured_at(impl: str, m: int) -> bool:
    """Whether ``impl`` is measured at M = m: every implementation, a candidate path within its ``PATH_MS``."""
    low, high = PATH_MS.get(PATHS.get(impl), (None, None))
    return (low is None or m >= low) and (high is None or m <= high)


def spec(fields: dict) -> W4A16Spec:
    return W4A16Spec(**fields)


def shards(config: dict) -> dict[str, dict]:
    """Shard name → ``W4A16Spec`` fields for every GPU job of the ``w4a16`` config section."""
    q = config["w4a16"]
    out: dict[str, dict] = {}
    for model in q["models"]:
        k, n = SHAPES[model]
        for dtype in q["dtypes"]:
            for g in q["group_sizes"]:
                name = f"w4a16_{model}_{dtype}_g{g}" + ("_sym" if q["symmetric"] else "")
                fields = dict(
                    model=model,
                    n=n,
                    k=k,
                    dtype=dtype,
                    group_size=g,
                    ms=list(q["ms"]),
                    impls=list(q["impls"]),
                    symmetric=bool(q["symmetric"]),
                    **operator_plan.timing(q),
                )
                W4A16Spec(**fields)  # a bad combination fails when the workflow is planned, not in a GPU job
                out[name] = fields
    return out


# --- cost estimate -----------------------------------------------------------------------------------

SHAPE_S = 1.5  # the weight drawn, quantised, converted
COMPILE_S = {impl: 3.0 if PATHS[impl] is None else 4.0 for impl in PATHS}


def _point_s(s: W4A16Spec, impl: str, m: int) -> float:
    n, k = s.n, s.k
    flops = gemm_flops(m, n, k) if impl != "copy-weight" else 0.0
    int4 = models.int4_weight_bytes(n, k, s.group_size, 2, 0 if s.symmetric else 2)  # one int32 per group
    nbytes = {
        "torch-linear": models.dense_weight_bytes(n, k),
        "dequant-linear": models.unfused_dequant_bytes(n, k, int4),
        "copy-weight": 2 * int4,  # read and written
        "ours-w8a16": models.int8_weight_bytes(n, k, 2),
        "ours-w8a16-tc": models.int8_weight_bytes(n, k, 2),
        "ours-w8a16-streamk": models.int8_weight_bytes(n, k, 2),
        "torch-int4pack": models.int4pack_weight_bytes(n, k, s.group_size),
    }.get(impl, int4)
    call = operator_plan.call_s(flops, nbytes)
    return (
        operator_plan.POINT_S
        + (s.warmup_ms + s.rep_ms) / 1e3
        + operator_plan.CALLS * call
        + rounds_seconds(s.spread_rounds, s.warmup_ms, s.rep_ms, call)
    )


def estimate_seconds(fields: dict) -> float:
    """Planned seconds of one shard on an H200 (an estimate: see the module docstring)."""
    s = spec(fields)
    copy = _point_s(s, "copy-weight", 1) if "copy-weight" in s.impls else 0.0
    return operator_plan.SHARD_S + SHAPE_S + copy + sum(_point_s(s, i, m) for m in s.ms for i in s.impls_at(m))


def compile_keys(fields: dict) -> set[tuple]:
    """Our kernels' specialisations a shard compiles (dtype, kernel, small-M/large-M path)."""
    s = spec(fields)
    keys = set()
    for impl in s.impls:
        if impl in COMPILE_S:
            keys |= {(impl, s.dtype, s.group_size, m <= 16) for m in s.ms if measured_at(impl, m)}
    return keys
