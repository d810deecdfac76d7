"""The MoE family's plan: routed SwiGLU expert layers (``moe:`` in the config), their shards and their cost.

Torch-free, like every plan. A shard is one (layer shape, dtype, routing), every token count inside:
``moe_<model>_<dtype>_<routing>``, one GPU job writing ``results/<gpu>/moe/<shard>.csv``; its rows go to the
operator table ``ops.csv``, whose layout and nominal rates it shares with the W4A16 family. The layer shapes
are named here (``SHAPES``: experts, top_k, hidden, expert FFN width) and the config lists names.

Implementations (``IMPLS``, with the op each measures): the whole layer (``moe-layer``): ``ours-moe``
(``kernels.moe.moe_ffn``, its stages also timed one by one), ``ours-moe-persistent`` (the same layer on the
persistent grouped GEMM, a candidate), ``loop-moe`` (a PyTorch loop over experts), ``gather-moe`` (per-token
gathering of expert weights), ``grouped-mm-moe`` (our routing around ``torch._grouped_mm``), ``dense-ffn`` (a
dense SwiGLU FFN of equal active FLOPs); the grouped GEMM alone (``grouped-gemm``): ``ours-grouped``,
``ours-grouped-persistent`` (the candidate path), ``torch-grouped-mm``, ``loop-grouped``.

``estimate_seconds`` is a planning aid like W4A16's (``analysis.families.ops.plan``), with a per-expert
host cost for the PyTorch loops.
"""

from __future__ import annotations

import dataclasses

from analysis.core import models
from analysis.core.costs import rounds_seconds
from analysis.core.flops import moe_ffn_flops
from analysis.families._shared import operator_plan as ops

EXPERIMENTS = ("moe",)
# MoE layers: experts, top_k, hidden, expert FFN width.
SHAPES = {
    "mixtral": (8, 2, 4096, 14336),
    "deepseek": (64, 6, 2048, 1408),
    "qwen": (128, 8, 2048, 768),
}
# MoE implementations and the op each measures.
IMPLS = {
    "ours-moe": "moe-layer",  # kernels.moe.moe_ffn, and its stages timed one by one
    "ours-moe-persistent": "moe-layer",  # moe_ffn(..., path="persistent"): the candidate grouped GEMM
    "loop-moe": "moe-layer",  # PyTorch loop over experts (kernels.moe.reference)
    "gather-moe": "moe-layer",  # per-token gathering of expert weights, batched products
    "grouped-mm-moe": "moe-layer",  # our routing/dispatch/combine around torch._grouped_mm
    "dense-ffn": "moe-layer",  # a dense SwiGLU FFN of equal active FLOPs (width top_k · ffn)
    "ours-grouped": "grouped-gemm",  # kernels.moe.grouped_gemm on the dispatched rows (gate projection)
    "ours-grouped-persistent": "grouped-gemm",  # grouped_gemm(..., path="persistent") on the same rows
    "torch-grouped-mm": "grouped-gemm",  # torch._grouped_mm on the same rows
    "loop-grouped": "grouped-gemm",  # one matmul per expert
}
ROUTINGS = ("uniform", "zipf")
DTYPES = ("float16", "bfloat16", "float32")
STAGES = ("routing", "dispatch", "gemm", "combine")


@dataclasses.dataclass
class MoeSpec:
    """One shard: a routed SwiGLU layer at every token count of ``tokens``, one routing."""

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
    spread_rounds: int = 0  # repeat rounds per timed point (the harness's step 6); the config's default is 3
    check_rows: int = 32
    seed: int = 0
    experiment: str = "moe"

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; one of {DTYPES}")
        if self.spread_rounds < 0:
            raise ValueError(f"spread_rounds must be >= 0, got {self.spread_rounds}")
        if self.routing not in ROUTINGS:
            raise ValueError(f"unknown routing {self.routing!r}; one of {ROUTINGS}")
        bad = [i for i in self.impls if i not in IMPLS]
        if bad:
            raise ValueError(f"unknown MoE implementations {bad}; known: {list(IMPLS)}")
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"top_k={self.top_k} must be in [1, experts={self.experts}]")
        if not self.tokens or min(self.tokens) < 1:
            raise ValueError("tokens must list token counts >= 1")

    def points(self) -> int:
        """Rows: one per (tokens, impl), plus the four stage rows of ours-moe."""
        per = len(self.impls) + (len(STAGES) if "ours-moe" in self.impls else 0)
        return len(self.tokens) * per


def spec(fields: dict) -> MoeSpec:
    return MoeSpec(**fields)


def shards(config: dict) -> dict[str, dict]:
    """Shard name → ``MoeSpec`` fields for every GPU job of the ``moe`` config section."""
    m = config["moe"]
    out: dict[str, dict] = {}
    for grid in m["grids"]:
        for model in grid["models"]:
            e, k, h, f = SHAPES[model]
            for routing in grid["routings"]:
                name = f"moe_{model}_{m['dtype']}_{routing}"
                if name in out:
                    raise ValueError(f"the moe config makes shard {name!r} twice (overlapping grids)")
                fields = dict(
                    model=model,
                    experts=e,
                    top_k=k,
                    hidden=h,
                    ffn=f,
                    dtype=m["dtype"],
                    tokens=list(grid["tokens"]),
                    routing=routing,
                    impls=list(m["impls"]),
                    zipf_s=m["zipf_s"],
                    gather_chunk_gib=m["gather_chunk_gib"],
                    gather_max_gb=m["gather_max_gb"],
                    **ops.timing(m),
                )
                MoeSpec(**fields)  # a bad combination fails when the workflow is planned, not in a GPU job
                out[name] = fields
    return out


# --- cost estimate -----------------------------------------------------------------------------------

SHAPE_S = 2.0  # the expert weights drawn
LOOP_S = 200e-6  # per expert and call of the PyTorch loops (a host synchronisation each)
COMPILE_S = {"ours-moe": 6.0, "ours-moe-persistent": 6.0, "ours-grouped": 2.0, "ours-grouped-persistent": 2.5}


def _gathered(s: MoeSpec, t: int) -> float:
    return models.gather_moe_bytes(t, s.top_k, s.hidden, s.ffn)


def _point_s(s: MoeSpec, impl: str, t: int) -> float:
    e, k, h, f = s.experts, s.top_k, s.hidden, s.ffn
    layer = moe_ffn_flops(t, k, h, f)
    weights = models.moe_expert_weight_bytes(min(e, t * k), h, f)
    timing = (s.warmup_ms + s.rep_ms) / 1e3
    if impl == "gather-moe":
        if _gathered(s, t) > s.gather_max_gb * 1e9:
            return ops.POINT_S  # refused without running (an "unsupported" row)
        call = _gathered(s, t) / ops.BANDWIDTH
    elif impl in ("loop-moe", "loop-grouped"):
        call = ops.call_s(layer / (3 if impl == "loop-grouped" else 1), weights) + e * LOOP_S
    elif impl in ("ours-grouped", "ours-grouped-persistent", "torch-grouped-mm"):
        call = ops.call_s(layer / 3, weights / 3)
    else:
        call = ops.call_s(layer, weights)
    stages = len(STAGES) if impl == "ours-moe" else 0
    rounds = rounds_seconds(s.spread_rounds, s.warmup_ms, s.rep_ms, call)
    return (1 + stages) * (ops.POINT_S + timing + rounds) + ops.CALLS * call * (2 if stages else 1)


def estimate_seconds(fields: dict) -> float:
    """Planned seconds of one shard on an H200 (an estimate: see the module docstring)."""
    s = spec(fields)
    return ops.SHARD_S + SHAPE_S + sum(_point_s(s, i, t) for t in s.tokens for i in s.impls)


def compile_keys(fields: dict) -> set[tuple]:
    """Our kernels' specialisations a shard compiles (kernel, dtype)."""
    s = spec(fields)
    return {(impl, s.dtype) for impl in s.impls if impl in COMPILE_S}
