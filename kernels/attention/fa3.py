"""FlashAttention-3's forward for Hopper (sm_90) in Gluon, and FP8's use of it; FA-2's backward, or FA-3's.

The FA-2 algorithm on FlashAttention-3's schedule: a producer loading K/V with TMA into a ring of
mbarrier-guarded shared-memory slots, two consumer warpgroups of 64 query rows running WGMMA and the
softmax with the producer's registers (``setmaxnreg``), ping-pong between them and, inside each, the softmax
of one tile overlapping the P V product of the one before. Each technique can be switched off
(``Schedule``), so the ablation measures one kernel. FP8 (``forward_fp8``, called by ``fp8.py``): the same
kernel on e4m3 inputs, V in a layout of its own (``FP8Values``), without ping-pong by default.

Handles: float16 and bfloat16, head dims 64, 128 and 256, causal masks aligned bottom-right, any lengths,
grouped-query heads, any strides (what TMA cannot describe is copied first). Does not handle: other head
dims or float32 (``fa2`` does), other GPUs, Triton's interpreter, dropout, varlen. Tested: compiled for
sm_90 on the CPU, every head dim and schedule, the SASS checked (tests/kernels/test_fa3_compile.py); on an
H200 against float64 (tests/kernels/test_fa3.py). The kernel is in ``fa3_kernels.py``, its tiles' pieces in
``fa3_tiles.py``, the host side (TMA's descriptors, the cached launcher) in ``fa3_host.py``.

Backward (``attention``): FA-2's Triton backward by default; ``backward="fa3"`` selects FA-3's Gluon backward
(``fa3_bwd``), which is compiled and emulated on the CPU but not yet verified on a GPU, and so not the default.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import typing

import torch

from kernels._runtime import check_flag, device_guard, softmax_scale
from kernels.attention import fa2, fa3_bwd
from kernels.attention.common import check_tensors
from kernels.attention.fa3_host import GluonLauncher, cdiv, check_hopper, gl_dtype, tma_arg

__all__ = [
    "FA3Config",
    "gl_dtype",
    "Schedule",
    "SCHEDULES",
    "FP8_SCHEDULE",
    "HEAD_DIMS",
    "attention",
    "forward",
    "forward_fp8",
    "FP8Values",
    "fp8_values",
    "fp8_key_slots",
    "FP8_KEY_GROUP",
    "FP8_ROW_SUMS_ON_MMA",
    "fp8_row_sums",
    "scale_strides",
    "default_config",
    "last_config",
    "kernel_specialisation",
    "forward_kernel",
    "kernel_for_lengths",
    "q_tile_rows",
    "schedule_of",
]

HEAD_DIMS = (64, 128, 256)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
_LOG2E = 1.4426950408889634
_ROWS_PER_CONSUMER = 64  # one warpgroup's wgmma tile is 64 rows high
ROWS_PER_CONSUMER = _ROWS_PER_CONSUMER
_REGISTERS_PER_SM = 65536


# ---------------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Which of FlashAttention-3's techniques the kernel uses; each off is the plainer schedule.

    ``warp_specialize``: a producer partition issues the loads and consumer warpgroups compute (off: one
    partition of 4·consumers warps issues its own TMA loads a ring ahead). ``pingpong``: the two consumers
    take turns issuing their GEMMs, so one's softmax overlaps the other's GEMMs. ``overlap``: inside a
    consumer, the softmax of tile j overlaps the P V product of tile j-1. ``tma``: the producer loads with
    the Tensor Memory Accelerator (off: a producer warpgroup of per-thread ``cp.async`` copies).
    """

    warp_specialize: bool = True
    pingpong: bool = True
    overlap: bool = True
    tma: bool = True

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if not isinstance(getattr(self, f.name), bool):
                raise TypeError(f"Schedule.{f.name} must be a bool, got {getattr(self, f.name)!r}")
        if not self.warp_specialize and (self.pingpong or not self.tma):
            raise ValueError("without warp specialisation there is no producer: pingpong=False and tma=True")


# The ablation: FA-3's schedule, then each technique switched off in turn.
SCHEDULES = {
    "fa3": Schedule(),
    "no-warp-specialize": Schedule(warp_specialize=False, pingpong=False),
    "no-pingpong": Schedule(pingpong=False),
    "no-overlap": Schedule(overlap=False),
    "no-tma": Schedule(tma=False),
}

# FP8's default schedule: FA-3's without ping-pong. On e4m3 a tile's two GEMMs take half their bf16 time
# and its exponentials the same, so a consumer's softmax outlasts the other consumer's GEMMs and the turn only
# makes each wait for the other; on an H200 (a probe outside the pipeline: d = 64 and 128, N = 4096 to
# 16384, both masks, interleaved rounds) every FP8 case ran faster without it, the 16-bit kernel not. The
# ablation still switches each technique off from FA-3's full schedule (experiment fp8-ablation).
FP8_SCHEDULE = "no-pingpong"

CONFIG_ENV = "KERNELS_FA3_CONFIG"
CONFIG_FP8_ENV = "KERNELS_FA3_FP8_CONFIG"


@dataclasses.dataclass(frozen=True)
class FA3Config:
    """Tiles: ``block_n`` keys per K/V tile, ``num_stages`` ring slots, ``num_consumers`` warpgroups of
    64 query rows (a CTA owns 64 · num_consumers rows)."""

    block_n: int
    num_stages: int
    num_consumers: int = 2

    def __post_init__(self):
        for name in ("block_n", "num_stages", "num_consumers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"FA3Config.{name} must be an int, got {value!r}")
        if self.block_n not in (16, 32, 64, 128, 256):
            raise ValueError(f"FA3Config.block_n must be a power of two from 16 to 256, got {self.block_n}")
        if not 1 <= self.num_stages <= 8:
            raise ValueError(f"FA3Config.num_stages must be 1 to 8, got {self.num_stages}")
        if self.num_consumers not in (1, 2):
            raise ValueError(f"FA3Config.num_consumers must be 1 or 2, got {self.num_consumers}")

    @property
    def cta_rows(self) -> int:
        return _ROWS_PER_CONSUMER * self.num_consumers

    def __str__(self) -> str:
        return f"BLOCK_N={self.block_n},num_stages={self.num_stages},num_consumers={self.num_consumers}"

    @classmethod
    def parse(cls, text: str) -> FA3Config:
        """Parse ``BLOCK_N=128,num_stages=2,num_consumers=2`` (the form ``str`` prints)."""
        fields = {"BLOCK_N": "block_n", "num_stages": "num_stages", "num_consumers": "num_consumers"}
        values = {}
        for part in text.split(","):
            name, _, value = part.strip().partition("=")
            if name not in fields or not value.strip().isdigit():
                raise ValueError(f"cannot parse FA-3 config {text!r}: expected {str(cls(128, 2))!r}")
            values[fields[name]] = int(value)
        if not {"block_n", "num_stages"} <= set(values):
            raise ValueError(f"FA-3 config {text!r} must set BLOCK_N and num_stages")
        return cls(**values)


# Tiles per head dim: the K/V ring has to fit in shared memory beside the CTA's Q tile, and S (64 × block_n)
# beside O (64 × d) in a consumer's registers.
_DEFAULT_TILES = {64: FA3Config(128, 3), 128: FA3Config(128, 2), 256: FA3Config(64, 2)}


# FP8: K/V tiles of half the bytes, so deeper rings fit; O gets a 16-bit staging buffer of its own. The depths
# are the fastest on an H200 (a probe outside the pipeline, N = 8192 and 16384, both masks, interleaved rounds):
# at d = 64 three slots (four were 1% slower without the mask, 9% with it), at d = 256 two (three 2% slower);
# at d = 128 two, three and four were within the rounds' spread.
_DEFAULT_TILES_FP8 = {64: FA3Config(128, 3), 128: FA3Config(128, 3), 256: FA3Config(64, 2)}


def default_config(head_dim: int, fp8: bool = False) -> FA3Config:
    """The tiles used when none is pinned (``config=``, or ``KERNELS_FA3_CONFIG`` / ``KERNELS_FA3_FP8_CONFIG``)."""
    _check_head_dim(head_dim)
    return (_DEFAULT_TILES_FP8 if fp8 else _DEFAULT_TILES)[head_dim]


def config_in_effect(head_dim: int, config: FA3Config | None = None, fp8: bool = False) -> FA3Config:
    """``config`` itself, else the tiles pinned by ``KERNELS_FA3_CONFIG`` (``KERNELS_FA3_FP8_CONFIG`` for
    ``fp8``), else ``default_config``."""
    if config is not None:
        if not isinstance(config, FA3Config):
            raise TypeError(f"config must be an FA3Config, got {type(config).__name__}")
        return config
    pinned = os.environ.get(CONFIG_FP8_ENV if fp8 else CONFIG_ENV, "").strip()
    return FA3Config.parse(pinned) if pinned else default_config(head_dim, fp8)


_LAST_CONFIG: list[tuple[FA3Config, Schedule] | None] = [None]


def last_config() -> tuple[FA3Config, Schedule] | None:
    """The (tiles, schedule) of the most recent ``forward``."""
    return _LAST_CONFIG[0]


def kernel_specialisation(
    config: FA3Config,
    schedule: Schedule,
    causal: bool,
    head_dim: int,
    producer_regs: int | None = None,
    fp8: bool = False,
    p_scale: float = 1.0,
    q_block: int | None = None,
    kv_block: int | None = None,
) -> tuple[dict, dict]:
    """(constexprs, launch options) of one kernel variant: what ``forward`` launches, and what the compile
    tests and the compiled-kernel audit build for sm_90 without a GPU.

    Registers: with warp specialisation the CTA is the producer warpgroup (4 warps; with TMA one thread
    issues the copies) and the consumer warpgroups, launched at the register cap that lets one CTA fill an
    SM; ``setmaxnreg`` then hands the producer's share to the consumers. ``producer_regs`` (per producer
    thread) defaults to 24 with TMA (FA-3's split) and 56 for per-thread copies, which need addresses;
    the consumers get the rest, at most 240. ``fp8``: e4m3 inputs with descales, P scaled by ``p_scale``, one
    Q descale per ``q_block`` rows and one K/V descale per ``kv_block`` keys where they are per block, the row
    sums on the tensor cores where ``fp8_row_sums(head_dim, schedule)`` says so."""
    consumers = config.num_consumers if schedule.warp_specialize else 1
    warps = 4 * (1 + config.num_consumers) if schedule.warp_specialize else 4 * config.num_consumers
    cap = min(255, _REGISTERS_PER_SM // (32 * warps)) // 8 * 8
    if producer_regs is None:
        producer_regs = 24 if schedule.tma else 56
    consumer_regs = min(240, (cap * (1 + consumers) - producer_regs) // consumers // 8 * 8)
    constexprs = dict(
        BLOCK_M=_ROWS_PER_CONSUMER,
        BLOCK_N=config.block_n,
        NUM_CONSUMERS=config.num_consumers,
        NUM_STAGES=config.num_stages,
        IS_CAUSAL=bool(causal),
        WARP_SPECIALIZE=schedule.warp_specialize,
        PINGPONG=schedule.pingpong and config.num_consumers == 2,
        OVERLAP=schedule.overlap,
        USE_TMA=schedule.tma,
        CONSUMER_REGS=consumer_regs,
        IS_FP8=bool(fp8),
        P_SHIFT=float(math.log2(p_scale)) if fp8 else 0.0,
        Q_BLOCK=q_block or _ROWS_PER_CONSUMER,
        KV_BLOCK=kv_block or config.block_n,
        SUMS_ON_MMA=bool(fp8) and fp8_row_sums(head_dim, schedule) == "p8",
    )
    options = dict(num_warps=4, maxnreg=cap) if schedule.warp_specialize else dict(num_warps=warps)
    return constexprs, options


# ---------------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------------


def q_tile_rows(config: FA3Config, schedule: Schedule) -> int:
    """Rows of one TMA transfer of Q and of O: a consumer's with warp specialisation, else the CTA's."""
    return _ROWS_PER_CONSUMER if schedule.warp_specialize else config.cta_rows


def _check_head_dim(head_dim: int) -> None:
    if head_dim not in HEAD_DIMS:
        raise NotImplementedError(
            f"head_dim {head_dim} is not supported by the FA-3 kernel (it handles {', '.join(map(str, HEAD_DIMS))}); "
            "kernels.attention.fa2 handles every head dim from 1 to 256"
        )


def _check_inputs(q, k, v, causal) -> None:
    check_tensors(
        q,
        k,
        v,
        4,
        "[batch, heads, seq, head_dim]",
        dense=True,
        dtypes=SUPPORTED_DTYPES,
        dtype_note="the FA-3 kernel supports float16 and bfloat16 (fa2 also runs float32)",
    )
    check_flag("causal", causal)
    _check_head_dim(q.shape[-1])
    check_hopper(q)


def schedule_of(schedule: Schedule | str) -> Schedule:
    """A ``Schedule``, or the one a name of ``SCHEDULES`` stands for."""
    if isinstance(schedule, str):
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be a Schedule or one of {sorted(SCHEDULES)}, got {schedule!r}")
        return SCHEDULES[schedule]
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule must be a Schedule or a name in SCHEDULES, got {type(schedule).__name__}")
    return schedule


# ---------------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------------


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    *,
    config: FA3Config | None = None,
    schedule: Schedule | str = "fa3",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward kernel. Returns ``(out [B, H, Nq, d], lse [B, H, Nq] float32)``, as ``fa2.forward``.

    ``config`` pins the tiles (as does ``KERNELS_FA3_CONFIG``); ``schedule`` is a ``Schedule`` or a name of
    ``SCHEDULES`` (the ablation's variants). ``last_config()`` reports what ran.
    """
    schedule = schedule_of(schedule)
    _check_inputs(q, k, v, causal)
    b, h, seqlen_q, d = q.shape
    seqlen_k = k.shape[2]
    sm_scale = softmax_scale(d, sm_scale)
    config = config_in_effect(d, config)
    _LAST_CONFIG[0] = (config, schedule)
    out = torch.empty((b, h, seqlen_q, d), device=q.device, dtype=q.dtype)
    lse = torch.empty((b, h, seqlen_q), device=q.device, dtype=torch.float32)
    if out.numel() == 0 or seqlen_k == 0:  # nothing to compute, or no keys: every row sees nothing
        lse.fill_(float("-inf"))
        return out.zero_(), lse
    _launch(q, k, v, out, lse, None, causal=causal, sm_scale=sm_scale, config=config, schedule=schedule)
    return out, lse


def _launch(
    q, k, v, out, lse, fp8, *, causal, sm_scale, config, schedule, p_scale=1.0, q_block=None, kv_block=None
) -> None:
    """The kernel on checked inputs. ``fp8``: None (16-bit), or ``(q_scale, k_scale, v_scale)`` with e4m3 q, k
    and ``v`` the data of ``FP8Values``."""
    b, h, seqlen_q, d = q.shape
    seqlen_k = k.shape[2]
    constexprs, options = _specialisation(
        config, schedule, bool(causal), d, fp8 is not None, float(p_scale), q_block, kv_block
    )
    rows = q_tile_rows(config, schedule)
    q, q_desc = tma_arg(q, (rows, d))
    k, k_desc = tma_arg(k, (config.block_n, d))
    v, v_desc = tma_arg(v, (d, config.block_n) if fp8 is not None else (config.block_n, d))
    _, o_desc = tma_arg(out, (rows, d))
    scales = fp8 if fp8 is not None else (lse, lse, lse)
    strides = tuple(x for sc in scales for x in scale_strides(sc)) if fp8 is not None else (0,) * 9
    grid = (cdiv(seqlen_q, config.cta_rows), b * h, 1)
    args = (
        (q_desc, k_desc, v_desc, o_desc, q, k, v, lse, *scales)
        + q.stride()[:3]
        + k.stride()[:3]
        + v.stride()[:3]
        + strides
        + (seqlen_q, seqlen_k, h, h // k.shape[1], sm_scale * _LOG2E)
    )
    with device_guard(q):
        _launcher(kernel_for_lengths(seqlen_q, seqlen_k))(grid, args, constexprs, options)


@functools.lru_cache(maxsize=256)
def _specialisation(config, schedule, causal, head_dim, fp8, p_scale, q_block, kv_block) -> tuple[dict, dict]:
    """``kernel_specialisation``, made once per variant (the launcher only reads the dicts)."""
    return kernel_specialisation(
        config, schedule, causal, head_dim, fp8=fp8, p_scale=p_scale, q_block=q_block, kv_block=kv_block
    )


@functools.cache
def _launcher(kernel) -> GluonLauncher:
    return GluonLauncher(kernel)


def forward_kernel(any_length: bool = False):
    """The Gluon kernel ``forward`` and ``forward_fp8`` launch (``kernel_specialisation`` gives a variant's
    constexprs and launch options), also for compiling it without a GPU (the compile tests, the compiled
    family). ``any_length``: its copy that never specialises the sequence lengths, launched where one is 1
    (``fa3_kernels._fa3_fwd_kernel_any_length`` says why)."""
    from kernels.attention import fa3_kernels

    return fa3_kernels._fa3_fwd_kernel_any_length if any_length else fa3_kernels._fa3_fwd_kernel


def kernel_for_lengths(seqlen_q: int, seqlen_k: int):
    """The kernel object ``_launch`` runs for these lengths (``forward_kernel``)."""
    return forward_kernel(any_length=min(seqlen_q, seqlen_k) == 1)


def scale_strides(scale: torch.Tensor) -> tuple[int, int, int]:
    """(batch, head, block) strides of a descale tensor of shape (), (B, H) or (B, H, blocks); 0 where coarser."""
    return (tuple(scale.stride()) + (0, 0, 0))[:3] if scale.dim() else (0, 0, 0)


# FP8's V layout. P's fp32 registers (wgmma accumulator layout: thread t of a quad holds columns 2t, 2t+1
# of every 8) become the e4m3 A operand of P V (thread t must hold 4 consecutive k of every 16) without
# moving a value between threads if the keys of every group of 32 are taken in another order: P's column
# c = 16·a1 + 8·a0 + 2·t + b is the product's k = 16·a1 + 4·t + 2·a0 + b. V's keys are stored in that order
# (``fp8_key_slots``), so the product is unchanged. The kernel reinterprets P's registers that way
# (``fa3_tiles._p_fp8``); the fused quantiser writes V so (``fp8_quant.quantize(..., interleave=True)``).
FP8_KEY_GROUP = 32
# head dims whose FP8 kernel takes the row sums on the tensor cores (P · 1, an 8-column accumulator), ℓ the
# sum of the rounded P, with TMA and with per-thread copies. Elsewhere the accumulator's registers make the
# consumers spill (d = 256; d = 128 without TMA, whose producer keeps 56 registers a thread for addresses,
# leaving the consumers 224), and ℓ sums the fp32 P.
FP8_ROW_SUMS_ON_MMA = {True: (64, 128), False: (64,)}


def fp8_row_sums(head_dim: int, schedule: Schedule | str | None = None) -> str:
    """What the FP8 kernel's ℓ sums at ``head_dim`` on ``schedule`` (a ``Schedule`` or name of ``SCHEDULES``;
    None for ``FP8_SCHEDULE``; it matters by its loads, TMA or not): ``"p8"`` (the rounded P that multiplies
    V) or ``"p"`` (the fp32 P): ``fp8.emulate``'s ``row_sums``."""
    tma = schedule_of(FP8_SCHEDULE if schedule is None else schedule).tma
    return "p8" if head_dim in FP8_ROW_SUMS_ON_MMA[tma] else "p"


def _fp8_width(n: int) -> int:
    """Columns of the FP8 V layout for ``n`` keys: rounded up to whole groups."""
    return cdiv(n, FP8_KEY_GROUP) * FP8_KEY_GROUP


def fp8_key_slots(n: int, device=None) -> torch.Tensor:
    """The column of each of ``n`` keys in the FP8 kernel's V layout (int64, a permutation within every
    ``FP8_KEY_GROUP`` keys)."""
    key = torch.arange(n, device=device)
    w = key % FP8_KEY_GROUP
    return key - w + (w & 16) + ((w >> 1) & 3) * 4 + ((w >> 3) & 1) * 2 + (w & 1)


class FP8Values(typing.NamedTuple):
    """V in the FP8 kernel's layout: ``data`` ``[B, H_kv, d, N']`` float8_e4m3fn, keys contiguous, N' = the
    ``seqlen`` keys rounded up to ``FP8_KEY_GROUP`` with zeros, key n at column ``fp8_key_slots(N')[n]``.
    Made by ``fp8_values`` (a copy) or by the fused quantiser (``fp8_quant.quantize(..., interleave=True)``)."""

    data: torch.Tensor
    seqlen: int

    def rows(self) -> torch.Tensor:
        """V back as a ``[B, H_kv, N, d]`` e4m3 tensor (a copy, in key order)."""
        slots = fp8_key_slots(self.seqlen, self.data.device)
        return self.data.view(torch.uint8)[..., slots].transpose(-1, -2).view(self.data.dtype)


def fp8_values(v8: torch.Tensor) -> FP8Values:
    """``v8`` ``[B, H_kv, N, d]`` e4m3 (any strides) copied into the FP8 kernel's layout (``FP8Values``)."""
    b, h, n, d = v8.shape
    data = torch.zeros((b, h, d, _fp8_width(n)), device=v8.device, dtype=torch.uint8)
    data[..., fp8_key_slots(n, v8.device)] = v8.view(torch.uint8).transpose(-1, -2)
    return FP8Values(data.view(v8.dtype), n)


def _check_fp8_values(v: FP8Values, seqlen_k: int) -> None:
    width = _fp8_width(seqlen_k)
    data = v.data
    if v.seqlen != seqlen_k or data.dim() != 4 or data.shape[-1] != width or data.stride(-1) != 1:
        raise ValueError(
            f"v is FP8Values of {v.seqlen} keys, data {tuple(data.shape)}: expected {seqlen_k} keys "
            f"in a [B, H_kv, d, {width}] tensor with the keys contiguous"
        )


def forward_fp8(
    q8: torch.Tensor,
    k8: torch.Tensor,
    v: torch.Tensor | FP8Values,
    q_scale: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    *,
    q_block: int | None = None,
    kv_block: int | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    config: FA3Config | None = None,
    schedule: Schedule | str | None = None,
    p_scale: float = 256.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The FA-3 kernel on e4m3 inputs: ``(out [B, H, Nq, d] out_dtype, lse [B, H, Nq] float32)``.

    ``q8`` ``[B, H, Nq, d]`` and ``k8`` ``[B, H_kv, Nk, d]`` are float8_e4m3fn; ``v`` is V in the kernel's
    layout (``FP8Values``), or a ``[B, H_kv, Nk, d]`` e4m3 tensor, then copied into it (``fp8_values``). The
    descales are float32 of shape () (per tensor), (B, H) / (B, H_kv) (per head) or (B, H, ⌈Nq / q_block⌉) /
    (B, H_kv, ⌈Nk / kv_block⌉) (per block; ``q_block`` a multiple of 64, the rows of a consumer warpgroup,
    ``kv_block`` a multiple of the K/V tile; defaults: 64 and the tile). The arguments are checked by
    ``kernels.attention.fp8`` (which calls this); here only what the kernel itself needs: Hopper, a supported
    head dim, the blocks against the tiles, V's layout. ``schedule``: None for ``FP8_SCHEDULE``.
    """
    schedule = schedule_of(FP8_SCHEDULE if schedule is None else schedule)
    check_flag("causal", causal)
    check_hopper(q8)
    d = q8.shape[-1]
    _check_head_dim(d)
    b, h, seqlen_q, _ = q8.shape
    seqlen_k = k8.shape[2]
    sm_scale = softmax_scale(d, sm_scale)
    config = config_in_effect(d, config, fp8=True)
    q_block = _ROWS_PER_CONSUMER if q_block is None else q_block
    kv_block = config.block_n if kv_block is None else kv_block
    if q_scale.dim() == 3 and q_block % _ROWS_PER_CONSUMER:
        raise ValueError(f"q_block={q_block} must be a multiple of {_ROWS_PER_CONSUMER} for the FA-3 kernel")
    if (k_scale.dim() == 3 or v_scale.dim() == 3) and kv_block % config.block_n:
        raise ValueError(f"kv_block={kv_block} must be a multiple of the FA-3 kernel's BLOCK_N={config.block_n}")
    if config.block_n % FP8_KEY_GROUP:
        raise ValueError(f"FP8 needs BLOCK_N a multiple of {FP8_KEY_GROUP} (its V layout), got {config.block_n}")
    _LAST_CONFIG[0] = (config, schedule)
    out = torch.empty((b, h, seqlen_q, d), device=q8.device, dtype=out_dtype)
    lse = torch.empty((b, h, seqlen_q), device=q8.device, dtype=torch.float32)
    if out.numel() == 0 or seqlen_k == 0:
        lse.fill_(float("-inf"))
        return out.zero_(), lse
    v = v if isinstance(v, FP8Values) else fp8_values(v)
    _check_fp8_values(v, seqlen_k)
    _launch(
        q8,
        k8,
        v.data,
        out,
        lse,
        (q_scale, k_scale, v_scale),
        causal=causal,
        sm_scale=sm_scale,
        config=config,
        schedule=schedule,
        p_scale=p_scale,
        q_block=q_block,
        kv_block=kv_block,
    )
    return out, lse


BACKWARDS = ("fa2", "fa3")


class _Backward(typing.NamedTuple):
    """Which backward ``attention`` builds: FA-2's (Triton, deterministic), or FA-3's (``fa3_bwd``) with its
    schedule and dQ order."""

    kind: str
    schedule: fa3_bwd.BwdSchedule
    deterministic: bool


def _backward_of(backward, backward_schedule, deterministic, head_dim: int) -> _Backward:
    if backward not in BACKWARDS:
        raise ValueError(f"backward must be one of {BACKWARDS}, got {backward!r}")
    deterministic = check_flag("deterministic", deterministic)
    bwd_schedule = fa3_bwd.schedule_of(backward_schedule)
    if backward == "fa3":
        if head_dim not in fa3_bwd.HEAD_DIMS:
            raise NotImplementedError(
                f"backward='fa3' handles head dims {', '.join(map(str, fa3_bwd.HEAD_DIMS))}, got {head_dim}; "
                "backward='fa2' handles every head dim"
            )
        fa3_bwd.check_schedule(fa3_bwd.default_config(head_dim), bwd_schedule)
    return _Backward(backward, bwd_schedule, deterministic)


class _FlashAttention3(torch.autograd.Function):
    """Forward with the FA-3 kernel; backward with FA-2's or FA-3's, both recomputing P from its logsumexp."""

    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale, schedule, bwd):
        out, lse = forward(q, k, v, causal=causal, sm_scale=sm_scale, schedule=schedule)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.sm_scale, ctx.bwd = causal, sm_scale, bwd
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        bwd = ctx.bwd
        if bwd.kind == "fa3":
            dq, dk, dv = fa3_bwd.backward(
                grad_out,
                q,
                k,
                v,
                out,
                lse,
                ctx.causal,
                ctx.sm_scale,
                deterministic=bwd.deterministic,
                schedule=bwd.schedule,
            )
        else:
            dq, dk, dv = fa2.backward(grad_out, q, k, v, out, lse, ctx.causal, ctx.sm_scale)
        return dq, dk, dv, None, None, None, None


# ---------------------------------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------------------------------


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    *,
    schedule: Schedule | str = "fa3",
    backward: str = "fa2",
    deterministic: bool = False,
    backward_schedule: fa3_bwd.BwdSchedule | str = "fa3",
) -> torch.Tensor:
    """FlashAttention-3 forward: ``softmax(q kᵀ · sm_scale [+ causal mask]) v`` on a Hopper GPU.

    Args:
        q: ``[B, H, Nq, d]``; k, v: ``[B, H_kv, Nk, d]`` with H_kv dividing H; float16 or bfloat16, on an
            sm_90 GPU; d in 64, 128, 256. Any strides.
        causal: mask keys after the query, aligned to the bottom-right corner when Nq ≠ Nk.
        sm_scale: score scale, default ``1/sqrt(d)``.
        schedule: a ``Schedule`` or a name in ``SCHEDULES``; the default is FA-3's full schedule.
        backward: the backward pass autograd runs: ``"fa2"`` (the default: FA-2's Triton backward,
            deterministic, every head dim) or ``"fa3"`` (``fa3_bwd``: the Gluon FA-3 backward, head dims 64,
            128 and 256, **not yet verified on a GPU**, hence not the default).
        deterministic: with ``backward="fa3"``, dQ's adds in a fixed order (bit-identical gradients run to
            run); without it dQ's last bits can change between runs. (FA-2's backward is deterministic.)
        backward_schedule: with ``backward="fa3"``, a ``fa3_bwd.BwdSchedule`` or a name in
            ``fa3_bwd.SCHEDULES`` (the backward's ablation).

    Returns: ``[B, H, Nq, d]`` in the input dtype. Differentiable.
    Raises ``TypeError``/``ValueError`` for bad inputs (as ``fa2``), ``NotImplementedError`` for other head
    dims and ``RuntimeError`` off Hopper or in the interpreter.
    """
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v)):
        head_dim = q.shape[-1] if isinstance(q, torch.Tensor) and q.dim() else 0
        bwd = _backward_of(backward, backward_schedule, deterministic, head_dim)
        return _FlashAttention3.apply(q, k, v, causal, sm_scale, schedule, bwd)
    out, _ = forward(q, k, v, causal=causal, sm_scale=sm_scale, schedule=schedule)
    return out
