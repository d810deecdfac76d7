"""FlashAttention-3's backward for Hopper (sm_90) in Gluon: dQ, dK and dV of ``fa3.attention``.

FA-3's manner: a preprocess (Δ = rowsum(dO ∘ O), the logsumexp in log2, the fp32 dQ accumulator zeroed), then
one CTA per block of 128 keys of a (batch, K/V head): a producer streams Q, dO and the rows' logsumexp and Δ
through an mbarrier ring by TMA while two consumer warpgroups, 64 keys each, keep K and V in shared memory,
run every product on WGMMA and accumulate dK and dV in registers over every query tile of every query head
of the group (grouped-query heads are summed there, in order); dQ is added in fp32 with atomics (by the
consumers, or with ``BwdSchedule(dq_writer=True)`` by the producer partition from a staging buffer), then
converted (``fa3_bwd_kernels.py`` says how each step runs). ``deterministic=True`` orders the adds of every
dQ element by key block (a semaphore per query tile), so that two runs give the same bits; the default does
not (the adds of different key blocks land in whatever order the CTAs reach them). Each technique can be
switched off (``BwdSchedule``) for the ablation.

Handles: float16 and bfloat16, head dims 64, 128 and 256 (at 256 the two consumers share 64 keys and split
the head dim; warp specialised with the consumers adding dQ only), causal masks aligned bottom-right, any
lengths (Nq ≠ Nk, rows that see no key), grouped-query heads, any strides of q, k, v, out and dO (what TMA
cannot read is copied). Does not handle: other head dims (``fa2``'s backward does), other GPUs, Triton's
interpreter (the preprocess and the conversion run there; ``fa3_bwd_emulate`` emulates the main kernel's
tiles on the CPU), dropout, varlen. **Not yet run on a GPU**: compiled for sm_90 and its SASS checked on the
CPU (tests/kernels/test_fa3_bwd_compile.py), its tile algorithm emulated against float64
(tests/kernels/test_fa3_bwd.py); the GPU-marked tests there are the check still to come. Until they pass,
``fa3.attention`` backpropagates through FA-2's backward unless ``backward="fa3"`` is asked for.
"""

from __future__ import annotations

import dataclasses
import functools
import typing

import torch
import triton
import triton.language as tl

from kernels._runtime import LaunchCache, check_flag, device_guard, softmax_scale
from kernels.attention.common import check_grad_shapes, check_tensors
from kernels.attention.fa3_host import GluonLauncher, Tma, cdiv, check_hopper, tma_arg

__all__ = [
    "BwdConfig",
    "BwdSchedule",
    "SCHEDULES",
    "HEAD_DIMS",
    "KEYS_PER_CONSUMER",
    "NUM_CONSUMERS",
    "backward",
    "backward_kernel",
    "check_schedule",
    "default_config",
    "kernel_specialisation",
    "last_config",
    "schedule_of",
    "tile_range",
]

HEAD_DIMS = (64, 128, 256)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
KEYS_PER_CONSUMER = 64  # a warpgroup's wgmma tile is 64 rows high: the keys of one consumer
NUM_CONSUMERS = 2
BLOCK_N = KEYS_PER_CONSUMER * NUM_CONSUMERS  # keys per CTA; at d = 256 the consumers share 64 (BwdConfig)
_LOG2E = 1.4426950408889634
_REGISTERS_PER_SM = 65536
# per producer thread, by (TMA, dQ writer): TMA copies need no addresses; per-thread copies, and the dQ
# writer's adds, do (at 40 the writer's own loop compiles without spills; 56 left the consumers 224 and
# they spilled 16 values a tile at d = 128)
_PRODUCER_REGS = {(True, False): 24, (False, False): 56, (True, True): 40, (False, True): 56}


# ---------------------------------------------------------------------------------------------------
# Triton kernels: the preprocess and the conversion of dQ (they run in the interpreter too)
# ---------------------------------------------------------------------------------------------------


@triton.jit
def _bwd_preprocess_kernel(
    Out,  # (B, H, Nq, d) the forward's output
    DO,  # (B, H, Nq, d) its gradient
    LSE,  # (B, H, Nq) fp32, natural log
    ROWS,  # (2, B·H, q_rows) fp32: the logsumexp in log2 (+inf past Nq and where it is -inf), then Δ
    DQ_ACC,  # (B·H, q_rows, d) fp32: zeroed here
    SEM,  # (B·H, q_rows / BLOCK_M, SEMS) int32: zeroed here (deterministic dQ)
    stride_ob,
    stride_oh,
    stride_om,
    stride_od,
    stride_dob,
    stride_doh,
    stride_dom,
    stride_dod,
    stride_lb,
    stride_lh,
    stride_lm,
    heads,
    seqlen_q,
    q_rows,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    SEMS: tl.constexpr,  # semaphores per query tile (0: none)
):
    """One query tile of one (batch, head): Δ_i = Σ_d dO_id · O_id in fp32, the logsumexp times log2 e, the
    accumulator's rows zeroed, the tile's semaphores zeroed. Rows past Nq get Δ = 0 and +inf: P = 0 there."""
    tile = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // heads).to(tl.int64)
    h = (bh % heads).to(tl.int64)
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, HEAD_DIM)
    ok = rows < seqlen_q
    r64 = rows.to(tl.int64)
    o = tl.load(
        Out + b * stride_ob + h * stride_oh + r64[:, None] * stride_om + cols[None, :] * stride_od,
        mask=ok[:, None],
        other=0.0,
    )
    do = tl.load(
        DO + b * stride_dob + h * stride_doh + r64[:, None] * stride_dom + cols[None, :] * stride_dod,
        mask=ok[:, None],
        other=0.0,
    )
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    lse = tl.load(LSE + b * stride_lb + h * stride_lh + r64 * stride_lm, mask=ok, other=float("-inf"))
    # a row that sees no key has lse = -inf: +inf makes its P = exp2(s - inf) = 0 instead of inf
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    base = bh.to(tl.int64) * q_rows + r64
    tl.store(ROWS + base, lse2)
    tl.store(ROWS + q_rows * tl.num_programs(1).to(tl.int64) + base, delta)
    tl.store(DQ_ACC + base[:, None] * HEAD_DIM + cols[None, :], tl.zeros([BLOCK_M, HEAD_DIM], tl.float32))
    if SEMS > 0:
        sems = tl.arange(0, SEMS)
        tl.store(SEM + (bh.to(tl.int64) * tl.num_programs(0) + tile) * SEMS + sems, tl.zeros([SEMS], tl.int32))


@triton.jit
def _bwd_dq_kernel(
    DQ_ACC,  # (B·H, q_rows, d) fp32: dQ / sm_scale
    DQ,  # (B, H, Nq, d) in the inputs' dtype
    stride_b,
    stride_h,
    stride_m,
    stride_d,
    heads,
    seqlen_q,
    q_rows,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """dQ = sm_scale · the accumulator, in the inputs' dtype, for one query tile of one (batch, head)."""
    tile = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // heads).to(tl.int64)
    h = (bh % heads).to(tl.int64)
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, HEAD_DIM)
    r64 = rows.to(tl.int64)
    acc = tl.load(DQ_ACC + (bh.to(tl.int64) * q_rows + r64)[:, None] * HEAD_DIM + cols[None, :])
    ptrs = DQ + b * stride_b + h * stride_h + r64[:, None] * stride_m + cols[None, :] * stride_d
    tl.store(ptrs, (acc * sm_scale).to(DQ.dtype.element_ty), mask=(rows < seqlen_q)[:, None])


# launches after the first of each kind skip Triton's argument binding (kernels._runtime.LaunchCache)
_PREPROCESS = LaunchCache(_bwd_preprocess_kernel)
_CONVERT_DQ = LaunchCache(_bwd_dq_kernel)


# ---------------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BwdSchedule:
    """Which of FlashAttention-3's techniques the backward uses; each off is the plainer schedule.

    ``warp_specialize``: a producer partition issues the loads while the consumer warpgroups compute (off:
    one partition of eight warps issues its own TMA loads a ring ahead, and hands dSᵀ to dQ's product with a
    barrier of its own threads instead of an mbarrier between warpgroups). ``tma``: the producer loads with
    the Tensor Memory Accelerator (off: per-thread ``cp.async`` copies). ``dq_writer``, the dQ strategy: the
    consumers stage their parts of dQ in shared memory and the producer partition adds them to the fp32
    accumulator, a ring behind its loads (off: the consumers add their parts themselves, with vector atomic
    reductions from their registers). Their order is ``backward``'s ``deterministic``, either way."""

    warp_specialize: bool = True
    tma: bool = True
    dq_writer: bool = False

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if not isinstance(getattr(self, f.name), bool):
                raise TypeError(f"BwdSchedule.{f.name} must be a bool, got {getattr(self, f.name)!r}")
        if not self.warp_specialize and (not self.tma or self.dq_writer):
            raise ValueError(
                "without warp specialisation there is no producer to copy per thread or to write dQ: "
                "tma=True and dq_writer=False"
            )


# The ablation: FA-3's schedule, each technique switched off in turn, and the other dQ strategy.
SCHEDULES = {
    "fa3": BwdSchedule(),
    "no-warp-specialize": BwdSchedule(warp_specialize=False),
    "no-tma": BwdSchedule(tma=False),
    "dq-writer": BwdSchedule(dq_writer=True),
}


@dataclasses.dataclass(frozen=True)
class BwdConfig:
    """Tiles: ``block_m`` query rows per tile (64, or 128: dQ's tile then split by rows between the
    consumers), ``num_stages`` ring slots, ``block_n`` keys per CTA: 128 (64 per consumer warpgroup), or 64
    shared by the two, each with half of the head dim (d = 256: dK and dV of 64 keys × 256 columns would take
    every register a consumer has)."""

    block_m: int
    num_stages: int
    block_n: int = BLOCK_N

    def __post_init__(self):
        for name in ("block_m", "num_stages", "block_n"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"BwdConfig.{name} must be an int, got {value!r}")
        if self.block_m not in (64, 128):
            raise ValueError(f"BwdConfig.block_m must be 64 or 128, got {self.block_m}")
        if not 1 <= self.num_stages <= 4:
            raise ValueError(f"BwdConfig.num_stages must be 1 to 4, got {self.num_stages}")
        if self.block_n not in (KEYS_PER_CONSUMER, BLOCK_N):
            raise ValueError(f"BwdConfig.block_n must be {KEYS_PER_CONSUMER} or {BLOCK_N}, got {self.block_n}")
        if self.block_n == KEYS_PER_CONSUMER and self.block_m != 64:
            raise ValueError(f"BwdConfig.block_n={KEYS_PER_CONSUMER} (the head dim split) needs block_m=64")

    @property
    def split_d(self) -> bool:
        """The consumers share the block's keys and split the head dim."""
        return self.block_n == KEYS_PER_CONSUMER

    def __str__(self) -> str:
        return f"BLOCK_M={self.block_m},BLOCK_N={self.block_n},num_stages={self.num_stages}"


# 64 query rows a tile: at d = 64, 128-row tiles hold Sᵀ and dPᵀ of 128 columns beside dK and dV, and the
# consumers spill around the tile loops; 64 compile without spills (test_fa3_bwd_compile). At d = 256 two
# ring slots fill shared memory (226 of Hopper's 227 KiB).
_DEFAULT_TILES = {64: BwdConfig(64, 2), 128: BwdConfig(64, 2), 256: BwdConfig(64, 2, block_n=KEYS_PER_CONSUMER)}


def default_config(head_dim: int) -> BwdConfig:
    _check_head_dim(head_dim)
    return _DEFAULT_TILES[head_dim]


def schedule_of(schedule: BwdSchedule | str) -> BwdSchedule:
    """A ``BwdSchedule``, or the one a name of ``SCHEDULES`` stands for."""
    if isinstance(schedule, str):
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be a BwdSchedule or one of {sorted(SCHEDULES)}, got {schedule!r}")
        return SCHEDULES[schedule]
    if not isinstance(schedule, BwdSchedule):
        raise TypeError(f"schedule must be a BwdSchedule or a name in SCHEDULES, got {type(schedule).__name__}")
    return schedule


_LAST_CONFIG: list[tuple[BwdConfig, BwdSchedule, bool] | None] = [None]


def last_config() -> tuple[BwdConfig, BwdSchedule, bool] | None:
    """The (tiles, schedule, deterministic) of the most recent ``backward``."""
    return _LAST_CONFIG[0]


def kernel_specialisation(
    config: BwdConfig, schedule: BwdSchedule, causal: bool, deterministic: bool = False
) -> tuple[dict, dict]:
    """(constexprs, launch options) of one variant: what ``backward`` launches and what the compile tests
    build for sm_90 without a GPU. With warp specialisation the CTA is the producer warpgroup and two consumer
    warpgroups, launched at the register cap that lets one CTA fill an SM; ``setmaxnreg`` hands the
    producer's share to the consumers (at most 240 each; the producer keeps 24 registers a thread with TMA,
    40 where it also writes dQ, 56 where it copies per thread). Without, one partition of eight warps."""
    ws = schedule.warp_specialize
    warps = 4 * (1 + NUM_CONSUMERS) if ws else 4 * NUM_CONSUMERS
    cap = min(255, _REGISTERS_PER_SM // (32 * warps)) // 8 * 8
    producer_regs = _PRODUCER_REGS[(schedule.tma, schedule.dq_writer)]
    consumer_regs = min(240, (cap * (1 + NUM_CONSUMERS) - producer_regs) // NUM_CONSUMERS // 8 * 8)
    constexprs = dict(
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        NUM_CONSUMERS=NUM_CONSUMERS,
        NUM_STAGES=config.num_stages,
        IS_CAUSAL=bool(causal),
        WARP_SPECIALIZE=ws,
        USE_TMA=schedule.tma,
        DETERMINISTIC=bool(deterministic),
        CONSUMER_REGS=consumer_regs,
        DQ_WRITER=schedule.dq_writer,
    )
    options = dict(num_warps=4, maxnreg=cap) if ws else dict(num_warps=warps)
    return constexprs, options


@functools.lru_cache(maxsize=64)
def _specialisation(config, schedule, causal, deterministic) -> tuple[dict, dict]:
    return kernel_specialisation(config, schedule, causal, deterministic)


def backward_kernel():
    """The Gluon kernel ``backward`` launches, also for compiling it without a GPU (the compile tests)."""
    from kernels.attention import fa3_bwd_kernels

    return fa3_bwd_kernels._fa3_bwd_kernel


@functools.cache
def row_layout():
    """The shared layout of the logsumexp and Δ rows' TMA blocks: unswizzled (one row of fp32)."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


def tile_range(
    j: int, seqlen_q: int, seqlen_k: int, block_m: int, causal: bool, block_n: int = BLOCK_N
) -> tuple[int, int, int]:
    """(i_lo, i_mid, n_m): the query tiles the CTA of key block ``j`` (of ``block_n`` keys) walks per head,
    i_lo … n_m - 1, of which i_lo … i_mid - 1 are masked (crossing the bottom-right-aligned causal diagonal,
    or all of them where the block runs past the last key). The kernel computes the same in Gluon
    (``_fa3_bwd_kernel``)."""
    start_n = j * block_n
    n_m = cdiv(seqlen_q, block_m)
    if causal:
        off = seqlen_k - seqlen_q
        i_lo = max(start_n - off, 0) // block_m
        i_mid = cdiv(max(start_n + block_n - 1 - off, 0), block_m)
    else:
        i_lo = i_mid = 0
    if start_n + block_n > seqlen_k:
        i_mid = n_m
    i_lo = min(i_lo, n_m)
    return i_lo, min(max(i_mid, i_lo), n_m), n_m


# ---------------------------------------------------------------------------------------------------
# Checks and launchers
# ---------------------------------------------------------------------------------------------------


def check_schedule(config: BwdConfig, schedule: BwdSchedule) -> None:
    """The head-dim split (d = 256's tiles) runs warp specialised, with the consumers adding dQ."""
    if config.split_d and (not schedule.warp_specialize or schedule.dq_writer):
        raise NotImplementedError(
            f"the FA-3 backward's head-dim split (d = 256's tiles, {config}) runs warp specialised with the "
            f"consumers adding dQ, not {schedule}; kernels.attention.fa2's backward handles every head dim"
        )


def _check_head_dim(head_dim: int) -> None:
    if head_dim not in HEAD_DIMS:
        raise NotImplementedError(
            f"head_dim {head_dim} is not supported by the FA-3 backward (it handles "
            f"{', '.join(map(str, HEAD_DIMS))}); kernels.attention.fa2's backward handles every head dim"
        )


class Work(typing.NamedTuple):
    """The backward's buffers, views of one allocation: the rows (logsumexp in log2, Δ: ``[2, B·H, q_rows]``
    fp32), the dQ accumulator ``[B·H, q_rows, d]`` fp32 and the semaphores ``[B·H, q_rows / block_m, 2]``
    int32 (one unused element unless deterministic)."""

    rows: torch.Tensor
    dq_acc: torch.Tensor
    sem: torch.Tensor
    q_rows: int


def prepare(do, q, out, lse, block_m: int, deterministic: bool) -> Work:
    """The preprocess: buffers allocated (one each) and filled by one Triton launch."""
    b, h, seqlen_q, d = q.shape
    n_m = cdiv(seqlen_q, block_m)
    q_rows = n_m * block_m
    # one allocation for the rows, the accumulator and the semaphores (4-byte words all; the rows end on a
    # 256-byte boundary: q_rows % 64 == 0); the preprocess fills every word the main kernel reads
    sems = NUM_CONSUMERS if deterministic else 0
    n_rows, n_acc, n_sem = 2 * b * h * q_rows, b * h * q_rows * d, max(b * h * n_m * sems, 1)
    words = torch.empty((n_rows + n_acc + n_sem,), device=q.device, dtype=torch.float32)
    rows = words[:n_rows].view(2, b * h, q_rows)
    dq_acc = words[n_rows : n_rows + n_acc].view(b * h, q_rows, d)
    sem = words[n_rows + n_acc :].view(torch.int32)
    sem = sem.view(b * h, n_m, sems) if sems else sem
    args = (out, do, lse, rows, dq_acc, sem, *out.stride(), *do.stride(), *lse.stride(), h, seqlen_q, q_rows)
    with device_guard(q):
        _PREPROCESS.launch((n_m, b * h, 1), args, dict(HEAD_DIM=d, BLOCK_M=block_m, SEMS=sems), 4, 1)
    return Work(rows, dq_acc, sem, q_rows)


def finish(work: Work, dq: torch.Tensor, sm_scale: float, block_m: int) -> None:
    """dQ from the accumulator, one Triton launch."""
    b, h, seqlen_q, d = dq.shape
    args = (work.dq_acc, dq, *dq.stride(), h, seqlen_q, work.q_rows, float(sm_scale))
    with device_guard(dq):
        _CONVERT_DQ.launch((work.q_rows // block_m, b * h, 1), args, dict(HEAD_DIM=d, BLOCK_M=block_m), 4, 1)


def _launch(do, q, k, v, work, dk, dv, *, causal, sm_scale, config, schedule, deterministic) -> None:
    b, h, seqlen_q, d = q.shape
    h_kv, seqlen_k = k.shape[1], k.shape[2]
    constexprs, options = _specialisation(config, schedule, bool(causal), bool(deterministic))
    q, q_desc = tma_arg(q, (config.block_m, d))
    do, do_desc = tma_arg(do, (config.block_m, d))
    k, k_desc = tma_arg(k, (config.block_n, d))
    v, v_desc = tma_arg(v, (config.block_n, d))
    lse2, delta = work.rows[0], work.rows[1]
    layout = row_layout()
    block = (1, config.block_m)
    lse_desc = Tma(lse2, tuple(lse2.shape), tuple(lse2.stride()), block, layout)
    delta_desc = Tma(delta, tuple(delta.shape), tuple(delta.stride()), block, layout)
    grid = (cdiv(seqlen_k, config.block_n), b * h_kv, 1)
    args = (
        (q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, q, k, v, do, lse2, delta)
        + (work.dq_acc, work.sem, dk, dv)
        + q.stride()[:3]
        + k.stride()[:3]
        + v.stride()[:3]
        + do.stride()[:3]
        + dk.stride()[:3]
        + dv.stride()[:3]
        + (seqlen_q, seqlen_k, h, h_kv, work.q_rows, sm_scale * _LOG2E, float(sm_scale))
    )
    with device_guard(q):
        _launcher()(grid, args, constexprs, options)


@functools.cache
def _launcher() -> GluonLauncher:
    return GluonLauncher(backward_kernel())


def backward(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    *,
    deterministic: bool = False,
    config: BwdConfig | None = None,
    schedule: BwdSchedule | str = "fa3",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of ``fa3.attention`` from the forward's output and logsumexp (``fa3.forward``).

    ``deterministic``: dQ's fp32 adds in key-block order, bit-identical run to run (the default is not:
    the order of the adds, and so dQ's last bits, can change between runs; dK and dV are deterministic
    either way). ``config`` pins the tiles (``default_config``), ``schedule`` is a ``BwdSchedule`` or a
    name of ``SCHEDULES``. Returns contiguous tensors shaped like q, k, v in their dtype. Not yet verified on
    a GPU (the module's docstring says what is).
    """
    schedule = schedule_of(schedule)
    causal = check_flag("causal", causal)
    deterministic = check_flag("deterministic", deterministic)
    check_tensors(
        q,
        k,
        v,
        4,
        "[batch, heads, seq, head_dim]",
        dense=True,
        dtypes=SUPPORTED_DTYPES,
        dtype_note="the FA-3 backward supports float16 and bfloat16 (fa2 also runs float32)",
    )
    b, h, seqlen_q, d = q.shape
    _check_head_dim(d)
    check_grad_shapes(do, out, lse, q.shape, (b, h, seqlen_q), q)
    check_hopper(q)
    sm_scale = softmax_scale(d, sm_scale)
    if config is None:
        config = default_config(d)
    elif not isinstance(config, BwdConfig):
        raise TypeError(f"config must be a BwdConfig, got {type(config).__name__}")
    check_schedule(config, schedule)
    _LAST_CONFIG[0] = (config, schedule, deterministic)
    if q.numel() == 0 or k.numel() == 0:  # nothing to launch: the gradients of an empty side are zeros
        return tuple(torch.zeros(t.shape, device=t.device, dtype=t.dtype) for t in (q, k, v))
    do = do.to(q.dtype)
    dq = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    dk = torch.empty(k.shape, device=k.device, dtype=k.dtype)
    dv = torch.empty(v.shape, device=v.device, dtype=v.dtype)
    work = prepare(do, q, out, lse, config.block_m, deterministic)
    _launch(
        do,
        q,
        k,
        v,
        work,
        dk,
        dv,
        causal=causal,
        sm_scale=sm_scale,
        config=config,
        schedule=schedule,
        deterministic=deterministic,
    )
    finish(work, dq, sm_scale, config.block_m)
    return dq, dk, dv
