"""The operator experiments' grid: W4A16 linear layers (``quant:``) and MoE layers (``moe:``) of the config.

Kept free of torch and Triton, like ``analysis.experiments.grid``, so that the workflow plans its jobs without
importing them. ``quant_shards(config["quant"])`` and ``moe_shards(config["moe"])`` give shard name → fields
of ``QuantSpec`` / ``MoeSpec``; ``workflow/rules/ops.smk`` makes one GPU job per shard, writing
``results/<gpu>/ops/<shard>.csv``, so a rerun resumes shard by shard.

Shards. Quant: one per (layer shape, dtype, group size), every M of ``ms`` and every implementation inside:
``w4a16_<model>_<dtype>_g<group>`` (``_sym`` for the symmetric format). MoE: one per (layer shape, dtype,
routing), every token count inside: ``moe_<model>_<dtype>_<routing>``.

The layer shapes are named here (``QUANT_SHAPES``, ``MOE_SHAPES``) and the config lists names; a test keeps
the schema's lists equal to these.

``estimate_seconds`` is a planning aid, not a measurement (the real cost is in each shard's log): a new
process per shard (``SHARD_S``), a fixed setup per shape and per point (inputs, quantisation, the float64
reference on sampled rows), the harness's warm-up and repetitions, and about ``CALLS`` untimed calls per
point at nominal H200 rates (``BANDWIDTH`` bytes/s for memory-bound calls, ``TFLOPS`` for products;
a call costs the larger of the two). ``COMPILE_S`` is Triton's first compile of each of our kernels'
specialisations (paid once per run with an empty cache).
"""

from __future__ import annotations

import dataclasses

from analysis.core import models
from analysis.core.flops import gemm_flops, moe_ffn_flops

# Llama-3 linear layers, in_features → out_features (the weight is [out, in] = [n, k]).
QUANT_SHAPES = {
    "llama3-8b-qo": (4096, 4096),
    "llama3-8b-up": (4096, 14336),
    "llama3-8b-down": (14336, 4096),
    "llama3-8b-kv": (4096, 1024),
    "llama3-70b-qo": (8192, 8192),
    "llama3-70b-up": (8192, 28672),
    "llama3-70b-down": (28672, 8192),
}
# MoE layers: experts, top_k, hidden, expert FFN width.
MOE_SHAPES = {
    "mixtral": (8, 2, 4096, 14336),
    "deepseek": (64, 6, 2048, 1408),
    "qwen": (128, 8, 2048, 768),
}
QUANT_IMPLS = ("ours-w4a16", "ours-w8a16", "torch-linear", "dequant-linear", "torch-int4pack", "copy-weight")
# MoE implementations and the op each measures.
MOE_IMPLS = {
    "ours-moe": "moe-layer",  # kernels.moe.moe_ffn, and its stages timed one by one
    "loop-moe": "moe-layer",  # PyTorch loop over experts (kernels.moe.reference)
    "gather-moe": "moe-layer",  # per-token gathering of expert weights, batched products
    "grouped-mm-moe": "moe-layer",  # our routing/dispatch/combine around torch._grouped_mm
    "dense-ffn": "moe-layer",  # a dense SwiGLU FFN of equal active FLOPs (width top_k · ffn)
    "ours-grouped": "grouped-gemm",  # kernels.moe.grouped_gemm on the dispatched rows (gate projection)
    "torch-grouped-mm": "grouped-gemm",  # torch._grouped_mm on the same rows
    "loop-grouped": "grouped-gemm",  # one matmul per expert
}
ROUTINGS = ("uniform", "zipf")
DTYPES = ("float16", "bfloat16", "float32")
STAGES = ("routing", "dispatch", "gemm", "combine")


@dataclasses.dataclass
class QuantSpec:
    """One quant shard: a linear layer ``x [m, k] @ W [n, k]ᵀ`` at every m of ``ms``."""

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
    check_rows: int = 32
    seed: int = 0
    experiment: str = "w4a16"

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; one of {DTYPES}")
        bad = [i for i in self.impls if i not in QUANT_IMPLS]
        if bad:
            raise ValueError(f"unknown quant implementations {bad}; known: {list(QUANT_IMPLS)}")
        if self.group_size not in (32, 64, 128):
            raise ValueError(f"group_size must be 32, 64 or 128, got {self.group_size}")
        if self.k % self.group_size or self.n % 8:
            raise ValueError(f"k={self.k} must be a multiple of group_size and n={self.n} of 8")
        if not self.ms or min(self.ms) < 1:
            raise ValueError("ms must list row counts >= 1")

    def points(self) -> int:
        """Rows: one per (M, impl), copy-weight once (it does not depend on M)."""
        per_m = [i for i in self.impls if i != "copy-weight"]
        return len(self.ms) * len(per_m) + ("copy-weight" in self.impls)


@dataclasses.dataclass
class MoeSpec:
    """One MoE shard: a routed SwiGLU layer at every token count of ``tokens``, one routing."""

    model: str
    experts: int
    top_k: int
    hidden: int
    ffn: int
    dtype: str
    tokens: list[int]
    routing: str
    impls: list[str]
    zipf_s: float = 1.2
    gather_chunk_gib: float = 4.0
    gather_max_gb: float = 512.0
    warmup_ms: float = 10
    rep_ms: float = 30
    check_rows: int = 32
    seed: int = 0
    experiment: str = "moe"

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; one of {DTYPES}")
        if self.routing not in ROUTINGS:
            raise ValueError(f"unknown routing {self.routing!r}; one of {ROUTINGS}")
        bad = [i for i in self.impls if i not in MOE_IMPLS]
        if bad:
            raise ValueError(f"unknown MoE implementations {bad}; known: {list(MOE_IMPLS)}")
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"top_k={self.top_k} must be in [1, experts={self.experts}]")
        if not self.tokens or min(self.tokens) < 1:
            raise ValueError("tokens must list token counts >= 1")

    def points(self) -> int:
        """Rows: one per (tokens, impl), plus the four stage rows of ours-moe."""
        per = len(self.impls) + (len(STAGES) if "ours-moe" in self.impls else 0)
        return len(self.tokens) * per


def _timing(section: dict) -> dict:
    return dict(warmup_ms=section["warmup_ms"], rep_ms=section["rep_ms"], check_rows=section["check_rows"])


def quant_shards(q: dict) -> dict[str, dict]:
    """Shard name → ``QuantSpec`` fields for every GPU job of the ``quant`` config section."""
    shards: dict[str, dict] = {}
    if not q["enabled"]:
        return shards
    for model in q["models"]:
        k, n = QUANT_SHAPES[model]
        for dtype in q["dtypes"]:
            for g in q["group_sizes"]:
                name = f"w4a16_{model}_{dtype}_g{g}" + ("_sym" if q["symmetric"] else "")
                fields = dict(model=model, n=n, k=k, dtype=dtype, group_size=g, ms=list(q["ms"]),
                              impls=list(q["impls"]), symmetric=bool(q["symmetric"]), **_timing(q))  # fmt: skip
                QuantSpec(**fields)  # a bad combination fails when the workflow is planned, not in a GPU job
                shards[name] = fields
    return shards


def moe_shards(m: dict) -> dict[str, dict]:
    """Shard name → ``MoeSpec`` fields for every GPU job of the ``moe`` config section."""
    shards: dict[str, dict] = {}
    if not m["enabled"]:
        return shards
    for grid in m["grids"]:
        for model in grid["models"]:
            e, k, h, f = MOE_SHAPES[model]
            for routing in grid["routings"]:
                name = f"moe_{model}_{m['dtype']}_{routing}"
                if name in shards:
                    raise ValueError(f"the moe config makes shard {name!r} twice (overlapping grids)")
                fields = dict(model=model, experts=e, top_k=k, hidden=h, ffn=f, dtype=m["dtype"],
                              tokens=list(grid["tokens"]), routing=routing, impls=list(m["impls"]),
                              zipf_s=m["zipf_s"], gather_chunk_gib=m["gather_chunk_gib"],
                              gather_max_gb=m["gather_max_gb"], **_timing(m))  # fmt: skip
                MoeSpec(**fields)
                shards[name] = fields
    return shards


def ops_shards(config: dict) -> dict[str, dict]:
    """Every ops shard of the config: name → fields, with ``family`` (quant / moe) added."""
    out = {name: {"family": "quant", **f} for name, f in quant_shards(config["quant"]).items()}
    out.update({name: {"family": "moe", **f} for name, f in moe_shards(config["moe"]).items()})
    return out


def spec_of(fields: dict) -> QuantSpec | MoeSpec:
    """The spec of an ``ops_shards`` entry."""
    rest = {k: v for k, v in fields.items() if k != "family"}
    return QuantSpec(**rest) if fields["family"] == "quant" else MoeSpec(**rest)


# --- cost estimate -----------------------------------------------------------------------------------

SHARD_S = 4.5  # a new Python process: imports, CUDA context, environment check
SHAPE_S = {"quant": 1.5, "moe": 2.0}  # weights drawn, quantised, converted; expert weights drawn
POINT_S = 0.1  # inputs, the float64 reference on sampled rows, the gate
CALLS = 9  # untimed calls of a point: the gate, peak memory, the harness's estimate
BANDWIDTH = 4.0e12  # bytes/s, a nominal H200 stream rate
TFLOPS = 600e12  # a nominal bf16 dense rate
LOOP_S = 200e-6  # per expert and call of the PyTorch loops (a host synchronisation each)
COMPILE_S = {"ours-w4a16": 3.0, "ours-w8a16": 3.0, "ours-moe": 6.0, "ours-grouped": 2.0}


def _call_s(flops: float, nbytes: float) -> float:
    return max(flops / TFLOPS, nbytes / BANDWIDTH)


def _quant_point_s(spec: QuantSpec, impl: str, m: int) -> float:
    n, k = spec.n, spec.k
    flops = gemm_flops(m, n, k) if impl != "copy-weight" else 0.0
    int4 = models.int4_weight_bytes(n, k, spec.group_size, 2, 0 if spec.symmetric else 2)  # one int32 per group
    nbytes = {
        "torch-linear": models.dense_weight_bytes(n, k),
        "dequant-linear": models.unfused_dequant_bytes(n, k, int4),
        "copy-weight": 2 * int4,  # read and written
        "ours-w8a16": models.int8_weight_bytes(n, k, 2),
        "torch-int4pack": models.int4pack_weight_bytes(n, k, spec.group_size),
    }.get(impl, int4)
    return POINT_S + (spec.warmup_ms + spec.rep_ms) / 1e3 + CALLS * _call_s(flops, nbytes)


def _gathered(spec: MoeSpec, t: int) -> float:
    return models.gather_moe_bytes(t, spec.top_k, spec.hidden, spec.ffn)


def _moe_point_s(spec: MoeSpec, impl: str, t: int) -> float:
    e, k, h, f = spec.experts, spec.top_k, spec.hidden, spec.ffn
    layer = moe_ffn_flops(t, k, h, f)
    weights = models.moe_expert_weight_bytes(min(e, t * k), h, f)
    timing = (spec.warmup_ms + spec.rep_ms) / 1e3
    if impl == "gather-moe":
        if _gathered(spec, t) > spec.gather_max_gb * 1e9:
            return POINT_S  # refused without running (an "unsupported" row)
        call = _gathered(spec, t) / BANDWIDTH
    elif impl in ("loop-moe", "loop-grouped"):
        call = _call_s(layer / (3 if impl == "loop-grouped" else 1), weights) + e * LOOP_S
    elif impl in ("ours-grouped", "torch-grouped-mm"):
        call = _call_s(layer / 3, weights / 3)
    else:
        call = _call_s(layer, weights)
    stages = len(STAGES) if impl == "ours-moe" else 0
    return (1 + stages) * (POINT_S + timing) + CALLS * call * (2 if stages else 1)


def estimate_seconds(fields: dict) -> float:
    """Planned seconds of one ops shard on an H200 (an estimate: see the module docstring)."""
    spec = spec_of(fields)
    total = SHARD_S + SHAPE_S[fields["family"]]
    if isinstance(spec, QuantSpec):
        per_m = [i for i in spec.impls if i != "copy-weight"]
        copy = _quant_point_s(spec, "copy-weight", 1) if "copy-weight" in spec.impls else 0.0
        return total + copy + sum(_quant_point_s(spec, i, m) for m in spec.ms for i in per_m)
    return total + sum(_moe_point_s(spec, i, t) for t in spec.tokens for i in spec.impls)


def compile_keys(fields: dict) -> set[tuple]:
    """Our kernels' specialisations a shard compiles (dtype, kernel, small-M/large-M path)."""
    spec = spec_of(fields)
    keys = set()
    if isinstance(spec, QuantSpec):
        for impl in spec.impls:
            if impl in COMPILE_S:
                keys |= {(impl, spec.dtype, spec.group_size, m <= 16) for m in spec.ms}
    else:
        keys |= {(impl, spec.dtype) for impl in spec.impls if impl in COMPILE_S}
    return keys


def budget(shards: dict[str, dict]) -> dict[str, dict]:
    """Experiment → shards, points, estimated seconds (warm cache) and first-compile seconds."""
    from analysis.experiments.grid import tally_budget

    return tally_budget(shards, spec_of, estimate_seconds, compile_keys, COMPILE_S)


def budget_table(shards: dict[str, dict]) -> list[str]:
    """The budget as the comment lines quoted in ``workflow/config.yaml`` (quant and moe sections)."""
    from analysis.experiments.grid import format_budget

    return format_budget(budget(shards))


if __name__ == "__main__":  # python -m analysis.experiments.ops_grid workflow/config.yaml [more config files]
    import sys

    from analysis.experiments.grid import load_config

    cfg = load_config(sys.argv[1:] or ["workflow/config.yaml"])
    print("\n".join(budget_table(ops_shards(cfg))))
