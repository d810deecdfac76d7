"""The traffic family's plan: which kernels to profile under Nsight Compute (``traffic:`` in the config).

Torch-free, like every plan. The question the family answers: do the byte models of ``analysis.core.models``
describe what attention kernels move through DRAM (``analysis.families.traffic.run`` says how it is
measured). One shard, ``traffic``, per measured GPU type: every point of ``Spec.planned()`` in one process
under ``ncu``, so the profiler starts once. Points: ``traffic-scaling``, every implementation over N × d;
``traffic-blocks``, our kernel at one N across block configurations (its own batch, so that the output
dwarfs the L2 cache and few of its writes are still cached, uncounted, when the kernel ends);
``traffic-inst-mix``, our FA-2 forward at one long N, its executed instructions counted by pipe (a second
ncu pass with those metrics: the claim that tensor-core GEMMs are most of the inner loop's instructions).
"""

from __future__ import annotations

import dataclasses
import math

from analysis.families._shared.attention_plan import CALLABLE_IMPLS, DTYPE_NAMES

DEFAULT_TIMEOUT_S = 900.0

EXPERIMENTS = ("traffic-scaling", "traffic-blocks", "traffic-inst-mix")
INST_MIX = "traffic-inst-mix"
# Implementations that write S and P to memory: the standard-attention model applies to them.
MATERIALISING = ("naive", "sdpa-math")
ELEM_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
# The fields that identify a point (every kernel row of a point shares them).
POINT_KEYS = [
    "experiment",
    "impl",
    "dtype",
    "batch",
    "heads",
    "seqlen",
    "head_dim",
    "causal",
    "block_m",
    "block_n",
    "num_warps",
    "num_stages",
]


_CONFIG_FIELDS = {"BLOCK_M": "block_m", "BLOCK_N": "block_n", "num_warps": "num_warps", "num_stages": "num_stages"}


def config_fields(text: str | None) -> dict:
    """``BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=3`` → block_m … num_stages (NaN for none).

    The same text form as ``kernels.attention.fa2.FA2Config``; parsed here without importing the kernel
    (and torch), so that figures and tables can read it anywhere.
    """
    out = {v: math.nan for v in _CONFIG_FIELDS.values()}
    if not text or not str(text).strip():
        return out
    for part in str(text).split(","):
        name, _, value = part.strip().partition("=")
        if name not in _CONFIG_FIELDS or not value.strip().isdigit():
            raise ValueError(
                f"cannot parse FA-2 config {text!r}: expected e.g. 'BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=3'"
            )
        out[_CONFIG_FIELDS[name]] = int(value)
    missing = [k for k, v in _CONFIG_FIELDS.items() if isinstance(out[v], float)]
    if missing:
        raise ValueError(f"FA-2 config {text!r} does not set {missing}")
    return out


@dataclasses.dataclass
class Spec:
    """The traffic experiment (see ``traffic`` in ``workflow/config.yaml`` for each field)."""

    impls: list[str]
    seqlens: list[int]
    head_dims: list[int]
    batch: int = 1
    heads: int = 16
    dtype: str = "float16"
    causal: bool = False
    fa2_config: str | None = None  # None: our kernel's autotuner chooses per shape, as in the benchmarks
    block_sweep: dict = dataclasses.field(default_factory=dict)  # seqlen, head_dims, configs, batch (optional)
    inst_mix: dict = dataclasses.field(default_factory=dict)  # seqlen, head_dim, batch (empty: none)
    timeout_s: float = DEFAULT_TIMEOUT_S
    ncu_args: list[str] = dataclasses.field(default_factory=list)  # extra ncu options, before the program
    require: bool = False  # raise instead of writing "unsupported" rows when ncu or the GPU is missing
    seed: int = 0

    def __post_init__(self):
        unknown = set(self.impls) - set(CALLABLE_IMPLS)
        if unknown:
            raise ValueError(f"unknown implementations {sorted(unknown)}; known: {CALLABLE_IMPLS}")
        if self.dtype not in DTYPE_NAMES or self.dtype not in ELEM_BYTES:
            raise ValueError(f"unknown dtype {self.dtype!r}; known: {sorted(ELEM_BYTES)}")
        extra = set(self.block_sweep) - {"seqlen", "head_dims", "configs", "batch"}
        if extra:
            raise ValueError(f"block_sweep has unknown keys {sorted(extra)}")
        extra = set(self.inst_mix) - {"seqlen", "head_dim", "batch"}
        if extra:
            raise ValueError(f"inst_mix has unknown keys {sorted(extra)}")
        for text in [self.fa2_config, *self.block_sweep.get("configs", [])]:
            config_fields(text)  # fail at planning, not inside the profiled program

    def points(self) -> int:
        return len(self.planned())

    def planned(self) -> list[dict]:
        """Every point to profile, in the order the target runs them."""
        base = dict(dtype=self.dtype, batch=self.batch, heads=self.heads, causal=bool(self.causal))
        pts = []
        for d in self.head_dims:
            for n in self.seqlens:
                for impl in self.impls:
                    config = self.fa2_config if impl == "ours-fa2" else None
                    pts.append(
                        dict(experiment="traffic-scaling", impl=impl, seqlen=n, head_dim=d, config=config, **base)
                    )
        sweep = self.block_sweep
        if sweep.get("configs") and sweep.get("seqlen"):
            # its own batch: outputs much larger than L2, so that writes left in L2 at the end are a small part
            swept = dict(base, batch=int(sweep.get("batch") or self.batch))
            for d in sweep.get("head_dims") or self.head_dims:
                for config in sweep["configs"]:
                    pts.append(
                        dict(
                            experiment="traffic-blocks",
                            impl="ours-fa2",
                            seqlen=sweep["seqlen"],
                            head_dim=d,
                            config=config,
                            **swept,
                        )
                    )
        mix = self.inst_mix
        if mix.get("seqlen"):
            point = dict(base, batch=int(mix.get("batch") or self.batch))
            d = int(mix.get("head_dim") or 128)
            pts.append(
                dict(experiment=INST_MIX, impl="ours-fa2", seqlen=mix["seqlen"], head_dim=d, config=None, **point)
            )
        return pts


def spec(fields: dict) -> Spec:
    return Spec(**fields)


def shards(config: dict) -> dict[str, dict]:
    """The one shard of the ``traffic`` config section: its fields, with ``require`` when ``enabled`` is true
    (a missing ncu or GPU then fails the job instead of writing "unsupported" rows)."""
    section = config["traffic"]
    fields = dict({k: v for k, v in section.items() if k != "enabled"}, require=section["enabled"] is True)
    Spec(**fields)  # a bad field fails when the workflow is planned, not inside the profiled program
    return {"traffic": fields}
