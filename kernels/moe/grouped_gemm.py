"""Grouped GEMM in Triton: one launch multiplies each expert's contiguous segment of rows by its own matrix.

``out[r] = a[r] @ b[e]`` with torch._grouped_mm's conventions (rows sorted by expert, int32 cumulative END
offsets), optionally with a SwiGLU expert's first layer fused (``swiglu_b``: the gate and up products
accumulated side by side in fp32, ``silu(gate) · up`` written once, so neither goes to memory). Every
program finds its expert and rows from the offsets itself, so nothing is built or read back on the host:
the launch is one kernel (``grouped_kernels``). Two paths (``path=``): ``"grouped"``, the default, a program
per possible tile; ``"persistent"``, a candidate for large token counts not yet measured on a GPU, a fixed
grid walking the real tiles with tensor descriptors per expert segment (TMA) on Hopper where the layouts
allow. Handles float16 and bfloat16 on a GPU, exact float32, any segment lengths (an empty expert costs
nothing), any K and N, any strides. Does not handle: a transposed ``b``, split-K, per-expert scales (FP8),
autotuning (one configuration per dtype and path; ``config=`` pins another). Tested in the interpreter
(tests/kernels/test_moe.py, test_moe_persistent.py: odd K, N and segments, empty experts) and on an H200
against torch._grouped_mm (the default path); timed by the ``moe`` family's ``grouped-gemm`` rows.
"""

from __future__ import annotations

import dataclasses

import torch
import triton

from kernels._launch import descriptor_scratch
from kernels._runtime import (
    INTERPRET,
    LaunchCache,
    check_bf16,
    check_device,
    check_flag,
    compute_capability,
    device_guard,
    host_values,
    multiprocessor_count,
)
from kernels.moe.grouped_kernels import _grouped_gemm_kernel, _grouped_persistent_kernel

__all__ = ["PATHS", "GroupedGemmConfig", "default_config", "grouped_gemm"]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
GROUP_M = 8  # row tiles per group of the grouped program order
PATHS = ("grouped", "persistent")  # the kernels (module docstring)
INTERPRET_SMS = 3  # multiprocessors the persistent grid assumes in the interpreter (odd: uneven shares)


# ---------------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GroupedGemmConfig:
    """One launch configuration: tile sizes, the compiler's warps and pipeline depth, and the kernel.

    path: one of ``PATHS``. For ``"persistent"``: programs_per_sm, the fixed grid's programs per
    multiprocessor; tma, load and store through tensor descriptors per expert segment where the layouts allow
    it (A's and B's and the output's rows contiguous and 16-byte aligned; a GPU of compute capability ≥ 9.0,
    or the interpreter), masked pointers otherwise.
    """

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    path: str = "grouped"
    programs_per_sm: int = 1
    tma: bool = False

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two ≥ 16 (tl.dot's minimum), got {value}")
        if self.path not in PATHS:
            raise ValueError(f"path must be one of {PATHS}, got {self.path!r}")
        if self.programs_per_sm < 1:
            raise ValueError(f"programs_per_sm must be ≥ 1, got {self.programs_per_sm}")
        if self.tma and self.path != "persistent":
            raise ValueError(f"tma belongs to path 'persistent', got path {self.path!r}")


def default_config(dtype: torch.dtype, fuse_swiglu: bool = False, path: str = "grouped") -> GroupedGemmConfig:
    """The configuration used when none is pinned.

    In the interpreter: 16×16×16 tiles, short CPU runs that still cross several tiles of every dimension.
    On a GPU: 128×128×64 with 8 warps (two warpgroups, Hopper's wgmma shape) and 3 stages, a common
    starting point for Hopper GEMMs, which a sweep of tile shapes on an H200 found the fastest on two of the
    three MoE shapes of the default grid and close on the third. The fused
    SwiGLU epilogue keeps two accumulators and two B tiles per stage, so it uses 128×64 tiles (not swept);
    float32 tiles are twice as wide in bytes, so they use 64×64×32 (a testing mode). The persistent path
    takes the same tiles (not swept), one program per multiprocessor, with descriptors.
    """
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS} or None (the default, 'grouped'), got {path!r}")
    extra = dict(path=path, tma=True) if path == "persistent" else {}
    if INTERPRET:
        return GroupedGemmConfig(16, 16, 16, 4, 1, **extra)
    if dtype == torch.float32:
        return GroupedGemmConfig(64, 64, 32, 4, 2, **extra)
    if fuse_swiglu:
        return GroupedGemmConfig(128, 64, 64, 8, 3, **extra)
    return GroupedGemmConfig(128, 128, 64, 8, 3, **extra)


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
_PERSISTENT = LaunchCache(_grouped_persistent_kernel)


def _tma_ok(a: torch.Tensor, b: torch.Tensor, b2: torch.Tensor, out: torch.Tensor) -> bool:
    """The layouts a descriptor per segment needs: unit stride along K (A) and N (B, the output), every other
    stride a multiple of 16 bytes and rows apart, every base 16-byte aligned; and a GPU with TMA."""

    def rows_ok(t: torch.Tensor) -> bool:
        inner = t.shape[-1]
        strides = t.stride()
        return (
            strides[-1] == 1
            and all(s * t.element_size() % 16 == 0 and s >= inner for s in strides[:-1])
            and t.data_ptr() % 16 == 0
        )

    if not all(rows_ok(t) for t in (a, b, b2, out)):
        return False
    return INTERPRET or compute_capability(a.device) >= (9, 0)


def _launch(a, b, b2, out, expert_offsets, num_experts, rows, n, k, cfg, fuse) -> None:
    max_tiles = triton.cdiv(rows, cfg.block_m) + num_experts  # every segment adds at most one partial tile
    tiles_n = triton.cdiv(n, cfg.block_n)
    offsets_args = (expert_offsets, expert_offsets.stride(0), num_experts)
    strides = (*a.stride(), *b.stride(), *b2.stride(), *out.stride())
    consts = dict(
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        FUSE_SWIGLU=fuse,
        IS_FP32=a.dtype == torch.float32,
        E_POW2=triton.next_power_of_2(num_experts),
        GROUP_M=GROUP_M,
    )
    if cfg.path == "grouped":
        args = (a, b, b2, out, *offsets_args, max_tiles, n, k, *strides)
        _KERNEL.launch((max_tiles * tiles_n, 1, 1), args, consts, cfg.num_warps, cfg.num_stages)
        return
    # a fixed grid: only sizes the host knows, so that a CUDA graph replays it for any routing
    programs = min(cfg.programs_per_sm * multiprocessor_count(a.device, INTERPRET_SMS), max_tiles * tiles_n)
    consts["USE_TMA"] = cfg.tma and _tma_ok(a, b, b2, out)
    with descriptor_scratch():
        _PERSISTENT.launch(
            (programs, 1, 1), (a, b, b2, out, *offsets_args, n, k, *strides), consts, cfg.num_warps, cfg.num_stages
        )


def grouped_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    expert_offsets: torch.Tensor,
    *,
    swiglu_b: torch.Tensor | None = None,
    config: GroupedGemmConfig | None = None,
    check_offsets: bool = True,
    path: str | None = None,
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
    ``path``: the kernel when no config is pinned (a config names its own): None or ``"grouped"`` (the
    default), ``"persistent"`` (a candidate, module docstring).
    Raises ``ValueError`` / ``TypeError`` on bad shapes, dtypes, devices, offsets, paths or configs.
    """
    _check_inputs(a, b, expert_offsets, swiglu_b, check_offsets)
    fuse = swiglu_b is not None
    if config is None:
        cfg = default_config(a.dtype, fuse, "grouped" if path is None else path)
    elif not isinstance(config, GroupedGemmConfig):
        raise TypeError(f"config must be a GroupedGemmConfig or None, got {type(config).__name__}")
    elif path is not None and path != config.path:
        raise ValueError(f"path={path!r} disagrees with config.path={config.path!r}: pass one of them")
    else:
        cfg = config
    rows, k = a.shape
    num_experts, _, n = b.shape
    out = torch.empty((rows, n), device=a.device, dtype=a.dtype)
    if rows == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()  # an empty sum; with the SwiGLU epilogue silu(0) · 0 = 0 as well
    b2 = swiglu_b if fuse else b
    with device_guard(a):
        _launch(a, b, b2, out, expert_offsets, num_experts, rows, n, k, cfg, fuse)
    return out
