"""Grouped GEMM in Triton: one launch multiplies each expert's contiguous segment of rows by its own matrix.

``out[r] = a[r] @ b[e]`` with torch._grouped_mm's conventions (rows sorted by expert, int32 cumulative END
offsets), optionally with a SwiGLU expert's first layer fused (``swiglu_b``: the gate and up products
accumulated side by side in fp32, ``silu(gate) · up`` written once, so neither goes to memory). Every
program finds its expert and rows from the offsets itself, so nothing is built or read back on the host:
the launch is one kernel. Handles float16 and bfloat16 on a GPU, exact float32, any segment lengths (an
empty expert costs nothing), any K and N, any strides. Does not handle: a transposed ``b``, split-K,
per-expert scales (FP8), autotuning (one configuration per dtype; ``config=`` pins another). Tested in the
interpreter (tests/kernels/test_moe.py: odd K, N and segments, empty experts) and on an H200 against
torch._grouped_mm; timed by the ``moe`` family's ``grouped-gemm`` rows.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from kernels._runtime import (
    INTERPRET,
    LaunchCache,
    check_bf16,
    check_device,
    check_flag,
    device_guard,
    host_values,
)

__all__ = ["GroupedGemmConfig", "default_config", "grouped_gemm"]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
GROUP_M = 8  # row tiles per group of the grouped program order


# ---------------------------------------------------------------------------------------------------
# Kernel
# ---------------------------------------------------------------------------------------------------


@triton.jit
def _grouped_gemm_kernel(
    A,  # [rows, K], rows sorted by expert
    B,  # [E, K, N]
    B2,  # [E, K, N]: the up projection when FUSE_SWIGLU, else unused
    C,  # [rows, N]
    Offsets,  # [E] int32: cumulative end offsets of the segments (any stride)
    stride_off,
    num_experts,
    max_tiles,  # ceil(rows / BLOCK_M) + E: a host-known bound on the row tiles of all segments
    N,
    K,
    stride_am,
    stride_ak,
    stride_be,
    stride_bk,
    stride_bn,
    stride_b2e,
    stride_b2k,
    stride_b2n,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FUSE_SWIGLU: tl.constexpr,
    IS_FP32: tl.constexpr,
    E_POW2: tl.constexpr,  # next power of two ≥ num_experts
    GROUP_M: tl.constexpr,  # row tiles per group of the grouped program order
):
    """One (row tile, N tile) of the grouped product. The row tiles are each expert's segment cut into
    ceil(count / BLOCK_M) tiles, laid end to end in expert order; a program finds its expert and first row
    from a prefix sum of the E tile counts (in registers). ``max_tiles`` bounds the row tiles on the host
    (every segment adds at most one partial tile): programs past the last one return at once. Rows past a
    segment's end, columns past N and the K tail are masked; fp32 accumulation, the output in the inputs'
    dtype."""
    # Grouped program order (as in Triton's matmul tutorial): GROUP_M consecutive row tiles sweep the N
    # tiles together, so that their A rows and each B panel are read from HBM about once, not once per
    # N tile (A) or per row tile (B).
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_pid_n
    first_m = (pid // in_group) * GROUP_M
    group_m = tl.minimum(max_tiles - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_m
    pid_n = (pid % in_group) // group_m

    # Which expert owns row tile pid_m, from the offsets alone (no tile map built on the host side):
    # each expert's segment is ceil(count / BLOCK_M) tiles, laid end to end in expert order.
    e = tl.arange(0, E_POW2)
    ends = tl.load(Offsets + e * stride_off, mask=e < num_experts, other=0)
    starts = tl.load(Offsets + (e - 1) * stride_off, mask=(e > 0) & (e < num_experts), other=0)
    tiles = (ends - starts + BLOCK_M - 1) // BLOCK_M  # 0 for empty experts and for the padding lanes
    tile_end = tl.cumsum(tiles, 0)
    if pid_m >= tl.sum(tiles):  # past the last tile of the last non-empty expert
        return
    expert = tl.sum((tile_end <= pid_m).to(tl.int32))
    mine = e == expert
    row_start = tl.sum(tl.where(mine, starts + (pid_m - (tile_end - tiles)) * BLOCK_M, 0))
    row_end = tl.sum(tl.where(mine, ends, 0))

    # int64 row offsets: rows · stride passes 2^31 at a few hundred thousand rows of a wide hidden size
    offs_m = (row_start + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < row_end
    mask_n = offs_n < N

    a_ptrs = A + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    e64 = expert.to(tl.int64)
    b_ptrs = B + e64 * stride_be + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if FUSE_SWIGLU:
        b2_ptrs = B2 + e64 * stride_b2e + offs_k[:, None] * stride_b2k + offs_n[None, :] * stride_b2n
        acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)

    for k0 in range(0, K, BLOCK_K):
        mask_k = offs_k < K - k0
        a = tl.load(a_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        if IS_FP32:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        if FUSE_SWIGLU:
            b2 = tl.load(b2_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
            if IS_FP32:
                acc2 = tl.dot(a, b2, acc2, input_precision="ieee")
            else:
                acc2 = tl.dot(a, b2, acc2)
            b2_ptrs += BLOCK_K * stride_b2k
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    if FUSE_SWIGLU:
        # silu(gate) · up on the fp32 accumulators: the gate is not rounded before the nonlinearity
        acc = acc / (1.0 + tl.exp(-acc)) * acc2
    c_ptrs = C + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


# ---------------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GroupedGemmConfig:
    """One launch configuration: tile sizes and the compiler's warps and pipeline depth."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two ≥ 16 (tl.dot's minimum), got {value}")


def default_config(dtype: torch.dtype, fuse_swiglu: bool = False) -> GroupedGemmConfig:
    """The configuration used when none is pinned.

    In the interpreter: 16×16×16 tiles, short CPU runs that still cross several tiles of every dimension.
    On a GPU: 128×128×64 with 8 warps (two warpgroups, Hopper's wgmma shape) and 3 stages, a common
    starting point for Hopper GEMMs, which a sweep of tile shapes on an H200 found the fastest on two of the
    three MoE shapes of the default grid and close on the third. The fused
    SwiGLU epilogue keeps two accumulators and two B tiles per stage, so it uses 128×64 tiles (not swept);
    float32 tiles are twice as wide in bytes, so they use 64×64×32 (a testing mode).
    """
    if INTERPRET:
        return GroupedGemmConfig(16, 16, 16, 4, 1)
    if dtype == torch.float32:
        return GroupedGemmConfig(64, 64, 32, 4, 2)
    if fuse_swiglu:
        return GroupedGemmConfig(128, 64, 64, 8, 3)
    return GroupedGemmConfig(128, 128, 64, 8, 3)


# ---------------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------------


def _check_inputs(
    a: torch.Tensor, b: torch.Tensor, expert_offsets: torch.Tensor, b2: torch.Tensor | None, check_offsets: bool
) -> None:
    named = [("a", a), ("b", b), ("expert_offsets", expert_offsets)] + ([("swiglu_b", b2)] if b2 is not None else [])
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if a.dim() != 2:
        raise ValueError(f"a must be [total_rows, K], got shape {tuple(a.shape)}")
    if b.dim() != 3:
        raise ValueError(f"b must be [E, K, N], got shape {tuple(b.shape)}")
    if b.shape[0] == 0:
        raise ValueError("b has no experts (E = 0)")
    if a.shape[1] != b.shape[1]:
        raise ValueError(
            f"a's K ({a.shape[1]}) does not match b's K ({b.shape[1]}): a {tuple(a.shape)}, b {tuple(b.shape)}"
        )
    if b2 is not None and b2.shape != b.shape:
        raise ValueError(f"swiglu_b must have b's shape {tuple(b.shape)}, got {tuple(b2.shape)}")
    if a.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"a has dtype {a.dtype}; supported: float16, bfloat16, float32")
    for name, t in named[1:2] + named[3:]:
        if t.dtype != a.dtype:
            raise TypeError(f"{name} must have a's dtype {a.dtype}, got {t.dtype}")
    if expert_offsets.dtype != torch.int32:
        raise TypeError(f"expert_offsets must be int32 (torch._grouped_mm's convention), got {expert_offsets.dtype}")
    if expert_offsets.shape != (b.shape[0],):
        raise ValueError(f"expert_offsets must be [E] = [{b.shape[0]}], got shape {tuple(expert_offsets.shape)}")
    check_device(*(t for _, t in named), names=tuple(n for n, _ in named))
    check_bf16(a.dtype, a.device, "a")
    if check_flag("check_offsets", check_offsets):
        # the values on the host: one device-to-host copy the first time a GPU tensor is seen, none on later
        # calls with the same unmodified tensor (kernels._runtime.host_values), so that a steady-state call,
        # and a CUDA graph captured after a first call, do not synchronise
        offsets = host_values(expert_offsets)
        if min(offsets) < 0 or any(hi < lo for lo, hi in zip(offsets, offsets[1:], strict=False)):
            raise ValueError(f"expert_offsets must be non-negative and non-decreasing, got {list(offsets)}")
        if offsets[-1] != a.shape[0]:
            raise ValueError(
                f"expert_offsets must end at total_rows = {a.shape[0]} (cumulative END offsets), "
                f"got last offset {offsets[-1]}"
            )


# launches after the first of each kind skip Triton's per-call binding of 25 arguments (kernels._runtime.LaunchCache)
_KERNEL = LaunchCache(_grouped_gemm_kernel)


def _launch(grid, a, b, b2, out, expert_offsets, num_experts, max_tiles, n, k, cfg, fuse) -> None:
    _KERNEL.launch(
        (grid[0], 1, 1),
        (
            a,
            b,
            b2,
            out,
            expert_offsets,
            expert_offsets.stride(0),
            num_experts,
            max_tiles,
            n,
            k,
            *a.stride(),
            *b.stride(),
            *b2.stride(),
            *out.stride(),
        ),
        dict(
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            FUSE_SWIGLU=fuse,
            IS_FP32=a.dtype == torch.float32,
            E_POW2=triton.next_power_of_2(num_experts),
            GROUP_M=GROUP_M,
        ),
        cfg.num_warps,
        cfg.num_stages,
    )


def grouped_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    expert_offsets: torch.Tensor,
    *,
    swiglu_b: torch.Tensor | None = None,
    config: GroupedGemmConfig | None = None,
    check_offsets: bool = True,
) -> torch.Tensor:
    """``out[r] = a[r] @ b[e]`` for the rows ``r`` of each expert ``e``'s segment, in one launch.

    ``a [total_rows, K]`` sorted by expert, ``b [E, K, N]``, ``expert_offsets [E]`` int32 cumulative END
    offsets (last = total_rows), all on one device with one dtype (float16, bfloat16; float32 as a
    testing mode). Returns ``[total_rows, N]`` in that dtype, accumulated in fp32.

    ``swiglu_b [E, K, N]``: fuse a SwiGLU expert's first layer, returning ``silu(a @ b[e]) · (a @ swiglu_b[e])``.
    ``check_offsets``: verify the offsets' values (non-negative, non-decreasing, last = total_rows),
    which reads them back to the host the first time a GPU tensor is seen (a synchronisation; later calls
    with the same, unmodified tensor reuse that copy, so a steady-state call or a CUDA graph captured
    after a first call does not synchronise); pass False when they come from ``routing.dispatch`` (new
    each call) and the launch must not synchronise. Unchecked bad offsets give wrong results or
    out-of-bounds reads. Every tensor may have any strides (the offsets too).
    Raises ``ValueError`` / ``TypeError`` on bad shapes, dtypes, devices or offsets.
    """
    _check_inputs(a, b, expert_offsets, swiglu_b, check_offsets)
    fuse = swiglu_b is not None
    cfg = config or default_config(a.dtype, fuse)
    rows, k = a.shape
    num_experts, _, n = b.shape
    out = torch.empty((rows, n), device=a.device, dtype=a.dtype)
    if rows == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()  # an empty sum; with the SwiGLU epilogue silu(0) · 0 = 0 as well
    b2 = swiglu_b if fuse else b
    max_tiles = triton.cdiv(rows, cfg.block_m) + num_experts
    grid = (max_tiles * triton.cdiv(n, cfg.block_n),)
    with device_guard(a):
        _launch(grid, a, b, b2, out, expert_offsets, num_experts, max_tiles, n, k, cfg, fuse)
    return out
