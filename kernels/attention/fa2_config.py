"""FlashAttention-2's launch configurations: the forward's autotuning space and tuner, the backward's tiles.

Forward: ``FA2Config`` (BLOCK_M × BLOCK_N tiles, warps, stages) and ``default_configs``, the autotuning
space; ``_prune`` drops what cannot fit the shape or the device (shared memory, accumulator registers) and
``tuner`` wraps the heuristics kernel in Triton's autotuner over a space (one tuner per space, each keeping
its own per-shape choices). ``KERNELS_FA2_CONFIG`` (``CONFIG_ENV``) pins one configuration for every call.

Backward: ``FA2BwdConfig`` (one ``FA2Config`` per pass, dK/dV and dQ) from a table of the best tiles of a
sweep on an H200 per (head dim, causal), falling back to smaller tiles where a GPU has less shared memory
(``bwd_fits``: an estimate calibrated on what Triton allocates for sm_90); ``KERNELS_FA2_BWD_CONFIG``
(``BWD_CONFIG_ENV``) pins both passes. In the interpreter both spaces are small tiles, so that a CPU run
stays short while still crossing several tiles.

Tested: tests/kernels/test_fa2_forward.py and test_fa2_backward.py (parsing, pins, pruning, the fallbacks on
simulated shared-memory limits); the tuned choice on a GPU in the GPU-marked tests.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import NamedTuple

import torch
import triton

from kernels._runtime import INTERPRET, check_int
from kernels.attention.common import check_head_dim
from kernels.attention.fa2_kernels import _fwd_heuristic_kernel

CONFIG_ENV = "KERNELS_FA2_CONFIG"


@dataclasses.dataclass(frozen=True)
class FA2Config:
    """One launch configuration: tile sizes and the compiler's warps and pipeline depth."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):  # tl.arange and tl.dot: powers of two, at least 16
            value = check_int(name, getattr(self, name))
            if value < 16 or value & (value - 1):
                raise ValueError(f"FA2Config {name} must be a power of two >= 16, got {value}")
        warps = check_int("num_warps", self.num_warps)
        if warps < 1 or warps & (warps - 1):
            raise ValueError(f"FA2Config num_warps must be a power of two >= 1, got {warps}")
        check_int("num_stages", self.num_stages, minimum=1)

    def to_triton(self) -> triton.Config:
        return triton.Config(
            {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n},
            num_warps=self.num_warps,
            num_stages=self.num_stages,
        )

    def __str__(self) -> str:
        return f"BLOCK_M={self.block_m},BLOCK_N={self.block_n},num_warps={self.num_warps},num_stages={self.num_stages}"

    @classmethod
    def parse(cls, text: str) -> FA2Config:
        """Parse ``BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=3`` (the form ``str`` prints)."""
        fields = {"BLOCK_M": "block_m", "BLOCK_N": "block_n", "num_warps": "num_warps", "num_stages": "num_stages"}
        values = {}
        for part in text.split(","):
            name, _, value = part.strip().partition("=")
            if name not in fields or not value.strip().isdigit():
                raise ValueError(f"cannot parse FA-2 config {text!r}: expected {str(cls(128, 64, 8, 3))!r}")
            values[fields[name]] = int(value)
        if set(values) != set(fields.values()):
            raise ValueError(f"FA-2 config {text!r} must set all of {list(fields)}")
        return cls(**values)

    @classmethod
    def from_triton(cls, cfg: triton.Config) -> FA2Config:
        return cls(cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.num_warps, cfg.num_stages)


def default_configs() -> list[FA2Config]:
    """The autotuning space.

    On a GPU: 128-row Q tiles with 8 warps (two warpgroups, Hopper's wgmma shape) won at head dim 128
    on an H200 (block sweep, Triton 3.6: 128×64 or 128×128 with 3–4 stages, 4 warps at half speed);
    at head dim 64 four warps also do; 64-row tiles keep head dim 256 within registers and shared
    memory and suit GPUs with less shared memory. The pruning filter drops what cannot fit the shape
    or the device. Triton's automatic warp specialisation gave no gain there and failed to compile
    with 4 warps, so it is not in the space.
    In the interpreter, small tiles keep the CPU run short while still crossing several tiles.
    """
    if INTERPRET:
        return [FA2Config(32, 16, 4, 1)]
    return [
        FA2Config(128, 128, 8, 3),
        FA2Config(128, 64, 8, 3),
        FA2Config(128, 64, 8, 4),
        FA2Config(128, 64, 4, 3),
        FA2Config(128, 128, 4, 3),
        FA2Config(64, 64, 4, 3),
        FA2Config(64, 32, 4, 2),
    ]


@functools.cache
def shared_mem_limit(device: torch.device) -> int:
    if device.type != "cuda":
        return 1 << 30
    index = torch.cuda.current_device() if device.index is None else device.index
    props = triton.runtime.driver.active.utils.get_device_properties(index)
    return int(props["max_shared_mem"])


def _fits(cfg: FA2Config, block_d: int, elem_bytes: int, smem_limit: int) -> bool:
    # Q tile once, K and V tiles once per pipeline stage; registers: the fp32 accumulator
    # (BLOCK_M × BLOCK_D) spread over the program's threads must leave room for Q, P and addresses.
    smem = (cfg.block_m * block_d + 2 * cfg.num_stages * cfg.block_n * block_d) * elem_bytes
    acc_regs_per_thread = cfg.block_m * block_d // (32 * cfg.num_warps)
    return smem <= smem_limit and acc_regs_per_thread <= 128


def _prune(configs, named_args, **kwargs):
    q = named_args["Q"]
    block_d = kwargs.get("BLOCK_D", named_args.get("BLOCK_D"))
    limit = shared_mem_limit(q.device)
    seq_cap = max(16, triton.next_power_of_2(named_args["seqlen_q"]))
    kept = []
    for c in configs:
        cfg = FA2Config.from_triton(c)
        if cfg.block_m > seq_cap and cfg.block_m > 64:
            continue
        if _fits(cfg, block_d, q.element_size(), limit):
            kept.append(c)
    # never leave the tuner empty: the smallest tile always compiles
    return kept or [min(configs, key=lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"])]


def _bench_for_tuning(fn, quantiles):
    # shorter than do_bench's defaults: tuning is a ranking, the harness does the careful timing
    return triton.testing.do_bench(fn, warmup=10, rep=40, quantiles=quantiles)


_TUNERS: dict[tuple, object] = {}


def tuner(configs: tuple[FA2Config, ...]):
    """An autotuned kernel over ``configs`` (cached: each tuner keeps its own per-shape choices)."""
    if configs not in _TUNERS:
        _TUNERS[configs] = triton.autotune(
            configs=[c.to_triton() for c in configs],
            # dtypes are part of the key too
            key=["seqlen_q", "seqlen_k", "HEAD_DIM", "IS_CAUSAL", "EAGER_RESCALE"],
            prune_configs_by={"early_config_prune": _prune},
            do_bench=_bench_for_tuning,
        )(_fwd_heuristic_kernel)
    return _TUNERS[configs]


def configs_in_effect(config: FA2Config | None) -> tuple[FA2Config, ...]:
    if config is not None:
        return (config,)
    pinned = os.environ.get(CONFIG_ENV, "").strip()
    if pinned:
        return (FA2Config.parse(pinned),)
    return tuple(default_configs())


BWD_CONFIG_ENV = "KERNELS_FA2_BWD_CONFIG"
BWD_CONFIG_INTERPRET = FA2Config(16, 16, 4, 1)


class FA2BwdConfig(NamedTuple):
    """The backward's two launch configurations, one per pass.

    ``dkdv``: BLOCK_N keys per program, query tiles of BLOCK_M rows streamed past them. ``dq``: BLOCK_M
    queries per program, key tiles of BLOCK_N rows streamed. ``str`` gives the form the environment
    variable ``KERNELS_FA2_BWD_CONFIG`` takes: ``dkdv=BLOCK_M=64,BLOCK_N=64,...;dq=BLOCK_M=128,...``.
    """

    dkdv: FA2Config
    dq: FA2Config

    def __str__(self) -> str:
        return f"dkdv={self.dkdv};dq={self.dq}"

    @classmethod
    def parse(cls, text: str) -> FA2BwdConfig:
        """Parse ``dkdv=<FA2Config>;dq=<FA2Config>`` (the form ``str`` prints; both passes required)."""
        parts: dict[str, FA2Config] = {}
        for chunk in text.split(";"):
            name, _, config = chunk.strip().partition("=")
            name = name.strip()
            if name not in ("dkdv", "dq") or name in parts:
                raise ValueError(
                    f"cannot parse FA-2 backward config {text!r}: expected 'dkdv=<config>;dq=<config>', "
                    f"e.g. {str(cls(FA2Config(64, 64, 4, 2), FA2Config(128, 128, 8, 2)))!r}"
                )
            parts[name] = FA2Config.parse(config)
        if set(parts) != {"dkdv", "dq"}:
            raise ValueError(f"FA-2 backward config {text!r} must set both passes, dkdv= and dq=")
        return cls(parts["dkdv"], parts["dq"])


# The best backward tiles of a sweep on an H200 (Triton 3.6, float16, N = 4096, 16384 tokens, hidden size
# 2048; one pass's configuration varied at a time, the whole backward timed), keyed by (padded head dim,
# causal). At d = 128 every BLOCK_N = 128 for dK/dV was far slower.
_BWD_SWEEP_H200: dict[tuple[int, bool], FA2BwdConfig] = {
    (64, False): FA2BwdConfig(FA2Config(64, 64, 4, 3), FA2Config(128, 64, 8, 2)),
    (64, True): FA2BwdConfig(FA2Config(64, 64, 4, 3), FA2Config(64, 64, 4, 3)),
    (128, False): FA2BwdConfig(FA2Config(64, 64, 4, 2), FA2Config(128, 128, 8, 2)),
    (128, True): FA2BwdConfig(FA2Config(64, 64, 4, 2), FA2Config(128, 128, 8, 2)),
    (256, False): FA2BwdConfig(FA2Config(64, 64, 8, 2), FA2Config(64, 64, 4, 2)),
    (256, True): FA2BwdConfig(FA2Config(64, 64, 8, 2), FA2Config(64, 64, 4, 2)),
}
# tried in order when the swept tile does not fit a GPU (less shared memory) or a dtype (float32)
_BWD_FALLBACKS = (
    FA2Config(64, 64, 4, 2),
    FA2Config(64, 32, 4, 2),
    FA2Config(32, 32, 4, 2),
    FA2Config(32, 32, 4, 1),
    FA2Config(16, 16, 4, 1),
)


def bwd_fits(which: str, cfg: FA2Config, block_d: int, elem_bytes: int, smem_limit: int) -> bool:
    """Whether a backward pass's tile plausibly fits: an estimate, not the compiler's allocation.

    Shared memory: the two resident tiles (K, V for dK/dV; Q, dO for dQ) once and the two streamed tiles
    once per pipeline stage, plus 10 KiB of scratch. Calibrated on what Triton 3.6 allocates compiling
    these kernels for sm_90 with aligned inputs: the tiles alone exactly for dQ (e.g. 192 KiB for
    128×128 s2 at d = 128, fp16), the tiles plus 9 KiB for dK/dV (105 KiB for 64×64 s2 at d = 128).
    Registers: the fp32 accumulators (dK and dV, or dQ) spread over the program's threads must leave room
    for the rest, as in the forward's ``_fits``.
    """
    if which == "dkdv":
        resident, streamed, acc_rows = cfg.block_n, cfg.block_m, 2 * cfg.block_n
    else:
        resident, streamed, acc_rows = cfg.block_m, cfg.block_n, cfg.block_m
    smem = (2 * resident + 2 * cfg.num_stages * streamed) * block_d * elem_bytes + 10 * 1024
    return smem <= smem_limit and acc_rows * block_d // (32 * cfg.num_warps) <= 128


def gpu_bwd_configs(head_dim: int, causal: bool, *, elem_bytes: int = 2, smem_limit: int) -> FA2BwdConfig:
    """The backward tiles for a GPU with ``smem_limit`` bytes of shared memory per block: the H200
    sweep's best for this head dim when it fits (``bwd_fits``), else the first fallback that does."""
    check_head_dim(head_dim)
    block_d = max(16, triton.next_power_of_2(head_dim))
    swept = _BWD_SWEEP_H200[(max(64, block_d), bool(causal))]
    chosen = []
    for which, best in (("dkdv", swept.dkdv), ("dq", swept.dq)):
        candidates = (best, *_BWD_FALLBACKS)
        chosen.append(
            next((c for c in candidates if bwd_fits(which, c, block_d, elem_bytes, smem_limit)), candidates[-1])
        )
    return FA2BwdConfig(*chosen)


def default_bwd_configs(
    head_dim: int, causal: bool, device: torch.device | str | None = None, dtype: torch.dtype = torch.float16
) -> FA2BwdConfig:
    """The backward tiles used when none is pinned: 16×16 in the interpreter (a short CPU run that still
    crosses several tiles), else ``gpu_bwd_configs`` for ``device`` (the current CUDA device if None)."""
    if INTERPRET:
        return FA2BwdConfig(BWD_CONFIG_INTERPRET, BWD_CONFIG_INTERPRET)
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    return gpu_bwd_configs(
        head_dim, causal, elem_bytes=dtype.itemsize, smem_limit=shared_mem_limit(torch.device(device))
    )


def bwd_configs_in_effect(
    head_dim: int, causal: bool, q: torch.Tensor, dkdv_config: FA2Config | None, dq_config: FA2Config | None
) -> FA2BwdConfig:
    """Explicit arguments first (each pass on its own), then ``KERNELS_FA2_BWD_CONFIG``, then the defaults."""
    pinned = os.environ.get(BWD_CONFIG_ENV, "").strip()
    base = FA2BwdConfig.parse(pinned) if pinned else default_bwd_configs(head_dim, causal, q.device, q.dtype)
    return FA2BwdConfig(dkdv_config or base.dkdv, dq_config or base.dq)
