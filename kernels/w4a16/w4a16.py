"""W4A16 and W8A16 linear layers in Triton: weights quantised offline, dequantised in registers.

``y = x @ dequant(W)ᵀ (+ bias)`` for an ``nn.Linear``-style weight ``W [N, K]`` in a format of
``kernels.w4a16.formats`` and 16-bit activations ``x [..., K]``. The kernels (``w4a16_kernels``) dequantise
the packed integers in registers, so the 16-bit weight never exists in memory: a decode step is bound by
reading the weights, and int4 reads a quarter of their 16-bit bytes. Here: the checks, the launch plan
(``w4a16_config.choose_config``, the grid), the cached split-K workspace and one launch through
``kernels._runtime.LaunchCache``, with no memset and no copy of a contiguous 2-D x.

Handles: any M (0 included) and leading dims, any N, K a multiple of the group size (int4) or any K (int8),
float16 and bfloat16 activations on a GPU, exact float32. Does not handle: activation quantisation,
act-order (GPTQ's permuted groups), a backward pass. Tested in the interpreter, compiled for sm_90, and on an
H200 (bf16 included): tests/kernels/test_w4a16.py.
"""

from __future__ import annotations

import functools

import torch
import triton

from kernels._runtime import (
    INTERPRET,
    LaunchCache,
    check_bf16,
    check_device,
    compute_capability,
    device_guard,
    multiprocessor_count,
)
from kernels.w4a16.formats import PACK_BLOCK, W4Weight, W8Weight, block_split
from kernels.w4a16.w4a16_config import DEFAULT_SM_COUNT, W4A16Config, check_config, choose_config, config_for
from kernels.w4a16.w4a16_kernels import _splitk_reduce_kernel, _w4a16_kernel, _w8a16_matmul_kernel

ACTIVATION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_activations(x: torch.Tensor, shape: tuple[int, int], bias: torch.Tensor | None, tensors, names) -> None:
    """Pure attribute checks on the common path; ``check_device`` (which builds messages) only when the
    tensors are not all on x's CUDA device."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in ACTIVATION_DTYPES:
        raise TypeError(f"x dtype {x.dtype} is not supported: use one of {list(ACTIVATION_DTYPES)}")
    if x.ndim < 1:
        raise ValueError("x must have at least one dimension, [..., in_features]")
    n, k = shape
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} input features, the weight expects {k}")
    if x.dtype == torch.bfloat16:  # the interpreter's tl.dot is wrong in bf16; old GPUs have no bf16 MMA
        check_bf16(x.dtype, x.device, "x")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
        if bias.shape != (n,):
            raise ValueError(f"bias must have shape ({n},), got {tuple(bias.shape)}")
        if not bias.is_floating_point():
            raise TypeError(f"bias must be floating point, got {bias.dtype}")
        tensors, names = (*tensors, bias), (*names, "bias")
    device = x.device
    if device.type == "cuda" and not INTERPRET and all(t.device == device for t in tensors):
        return
    check_device(x, *tensors, names=("x", *names))


def _empty_product(x, bias, m, n, k, lead):
    """The output when there is nothing to multiply (M, N or K zero)."""
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    if k == 0 and m and n:
        out.zero_()
        if bias is not None:
            out += bias.to(out.dtype)
    return out.reshape(*lead, n)


def _prepare(x, bias, n, k):
    """(x as [M, K], output [M, N], leading dims), or the finished output when there is nothing to multiply."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if m == 0 or n == 0 or k == 0:
        return None, _empty_product(x, bias, m, n, k, lead), lead
    return x2, torch.empty((m, n), device=x.device, dtype=x.dtype), lead


def _bias_stride(bias: torch.Tensor | None) -> int:
    """The bias's element stride (0 for an expanded one; 0 when there is none, unused then)."""
    return 0 if bias is None else bias.stride(0)


def _reduce(target, bias, out, split):
    m, n = out.shape
    block_m, block_n = 16, 64
    _REDUCE.launch(
        (triton.cdiv(m, block_m), triton.cdiv(n, block_n), 1),
        (target, bias, out, m, n, *target.stride(), *out.stride(), _bias_stride(bias)),
        dict(SPLIT_K=split, BLOCK_M=block_m, BLOCK_N=block_n),
        4,
        1,
    )


# Split-K workspaces, per (device, stream): fp32 partial sums and int32 arrival counters. The counters are
# zeroed once, when allocated, and every launch leaves them at 0 (the last program of each tile resets its
# counter), so a launch needs no memset. Per stream, because two launches that run at the same time must
# not share counters. Buffers that were outgrown are kept (in _RETIRED), so that a CUDA graph captured
# with them never points at freed memory. Not safe: one stream used from several host threads at once.
_WORKSPACES: dict[tuple[str, int, int], tuple[torch.Tensor, torch.Tensor]] = {}
_RETIRED: list[tuple[torch.Tensor, torch.Tensor]] = []


def _workspace(device: torch.device, partials: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    if device.type == "cuda":
        key = ("cuda", device.index, torch._C._cuda_getCurrentRawStream(device.index))
    else:
        key = (device.type, -1, 0)
    ws = _WORKSPACES.get(key)
    if ws is not None and ws[0].numel() >= partials and ws[1].numel() >= tiles:
        return ws
    if ws is not None:
        _RETIRED.append(ws)
        partials, tiles = max(partials, 2 * ws[0].numel()), max(tiles, 2 * ws[1].numel())
    ws = (
        torch.empty(max(partials, 1 << 16), device=device, dtype=torch.float32),
        torch.zeros(max(tiles, 1 << 12), device=device, dtype=torch.int32),
    )
    _WORKSPACES[key] = ws
    return ws


@functools.lru_cache(maxsize=4096)
def _plan_w4(cfg: W4A16Config, m: int, n: int, k: int) -> tuple[tuple[int, int, int], int, int, int, int]:
    """(grid, split, blocks per split, k_main, tail words) of an int4 launch; slices are whole loop steps of
    block_k inputs (the kernels mask the blocks of a last, partial step) and none is empty."""
    check_config(cfg, 4)
    k_main, tail_words = block_split(k)
    per_step = cfg.block_k // PACK_BLOCK
    blocks = k_main // PACK_BLOCK
    steps = triton.cdiv(blocks, per_step)
    blocks_per_split = triton.cdiv(steps, min(cfg.split_k, max(steps, 1))) * per_step
    split = max(1, triton.cdiv(blocks, blocks_per_split)) if blocks else 1
    grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n), split)
    return grid, split, blocks_per_split, k_main, tail_words


# launches after the first of each kind skip Triton's argument binding (kernels._runtime.LaunchCache)
_TENSOR_CORES = LaunchCache(_w4a16_kernel)
_W8 = LaunchCache(_w8a16_matmul_kernel)
_REDUCE = LaunchCache(_splitk_reduce_kernel)


def _launch_w4(x, weight: W4Weight, bias, config: W4A16Config | None) -> torch.Tensor:
    """One kernel launch and one ``torch.empty`` (the output) per call; the split-K workspace is cached."""
    n, k = weight.shape
    x2 = x if x.ndim == 2 else x.reshape(-1, k)
    m = x2.shape[0]
    if m == 0 or n == 0 or k == 0:
        return _empty_product(x, bias, m, n, k, x.shape[:-1])
    device = x.device
    cfg = config or config_for(m, n, k, multiprocessor_count(device, DEFAULT_SM_COUNT), INTERPRET, 4)
    grid, split, blocks_per_split, k_main, tail_words = _plan_w4(cfg, m, n, k)
    out = torch.empty((m, n), device=device, dtype=x.dtype)
    if split > 1:
        part, cnt = _workspace(device, split * m * n, grid[0] * grid[1] * grid[2] // split)
    else:
        part = cnt = None
    sz = weight.scale_zero
    if x.dtype == torch.float32:
        deq = 2
    elif sz is not None and weight.scales.dtype == x.dtype:
        deq = 3 if cfg.scale_after else 0
    else:
        deq = 1
    # PTX on pairs of 16-bit values (sub/mul .bf16x2 need sm_90); the plain-Triton form gives the same bits
    use_asm = cfg.asm and deq in (0, 3) and not INTERPRET and compute_capability(device) >= (9, 0)
    if deq in (0, 3):  # the combined int32 words, [K // group, N]
        s, z = sz, None
        stride_sg, stride_sn = sz.stride()
        stride_zn = stride_zg = 0
    else:
        s, z = weight.scales, weight.zeros
        stride_sn, stride_sg = s.stride()
        stride_zn, stride_zg = z.stride() if z is not None else (0, 0)
    _TENSOR_CORES.launch(
        grid,
        (
            x2,
            weight.packed,
            s,
            z,
            bias,
            out,
            part,
            cnt,
            m,
            n,
            k_main,
            blocks_per_split,
            split,
            *x2.stride(),
            *weight.packed.stride(),
            stride_sn,
            stride_sg,
            stride_zn,
            stride_zg,
            _bias_stride(bias),
        ),
        dict(
            GROUP=weight.group_size,
            SYMMETRIC=weight.symmetric,
            TAIL_WORDS=tail_words,
            SPLIT=split > 1,
            DEQ=deq,
            MAGIC=0x6400 if x.dtype == torch.float16 else 0x4300,
            SWAP_AB=cfg.swap_ab,
            USE_ASM=use_asm,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
        ),
        cfg.num_warps,
        cfg.num_stages,
    )
    return out if x.ndim == 2 else out.reshape(*x.shape[:-1], n)


def _launch_w8(x, weight: W8Weight, bias, config: W4A16Config | None) -> torch.Tensor:
    n, k = weight.shape
    x2, out, lead = _prepare(x, bias, n, k)
    if x2 is None:
        return out
    m = x2.shape[0]
    cfg = config or choose_config(m, n, k, sm_count=multiprocessor_count(x.device, DEFAULT_SM_COUNT), bits=8)
    check_config(cfg, 8)
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    split = triton.cdiv(k, k_per_split)  # no empty slice
    target = out if split == 1 else torch.empty((split, m, n), device=x.device, dtype=torch.float32)
    stride_os = target.stride(0) if split > 1 else 0
    w, scales = weight.qweight, weight.scales
    grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n), split)
    _W8.launch(
        grid,
        (
            x2,
            w,
            scales,
            bias if split == 1 else None,
            target,
            m,
            n,
            k_per_split,
            k,
            x2.stride(0),
            x2.stride(1),
            w.stride(0),
            w.stride(1),
            scales.stride(0),
            _bias_stride(bias),
            stride_os,
            target.stride(-2),
            target.stride(-1),
        ),
        dict(
            SPLIT_K=split,
            IS_FP32=x.dtype == torch.float32,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
        ),
        cfg.num_warps,
        cfg.num_stages,
    )
    if split > 1:
        _reduce(target, bias, out, split)
    return out.reshape(*lead, n)


def matmul(
    x: torch.Tensor, weight: W4Weight, bias: torch.Tensor | None = None, *, config: W4A16Config | None = None
) -> torch.Tensor:
    """``x @ dequantize(weight).T (+ bias)`` with the int4 weight dequantised in registers.

    Args:
        x: ``[..., K]`` float16 or bfloat16 (float32: exact IEEE mode, for tests); any leading dims, any M.
        weight: a ``W4Weight`` from ``quantize`` of an ``[N, K]`` weight, on x's device.
        bias: ``[N]`` or None; added in fp32 before the output is rounded.
        config: pin a launch (``choose_config`` otherwise); ``split_k > 1`` splits K, ``scale_after`` places
            the scale after the product.

    Returns: ``[..., N]`` in x's dtype. Tensor-core path with the scale before the product (the GEMM,
    M > 64): the dequantised weight is rounded to x's dtype before the product (fp32 accumulation), as
    ``x @ dequantize(weight, x.dtype).T`` would. With the scale after it (``config.scale_after``, the default
    for M ≤ 64): the weight is not rounded to 16 bits; ``(q − z)·x``
    is exact in fp32, summed per group in fp32 and scaled by the group's scale (no more error than the
    former).
    Split-K is deterministic (fixed summation order) and runs in one launch.
    Raises ``TypeError``/``ValueError`` for unsupported dtypes, devices or shapes.
    """
    if not isinstance(weight, W4Weight):
        raise TypeError(f"weight must be a W4Weight from quantize(), got {type(weight).__name__}")
    if weight.zeros is not None:
        tensors, names = (weight.packed, weight.scales, weight.zeros), ("packed", "scales", "zeros")
    else:
        tensors, names = (weight.packed, weight.scales), ("packed", "scales")
    _check_activations(x, weight.shape, bias, tensors, names)
    with device_guard(x):
        return _launch_w4(x, weight, bias, config)


def matmul_w8(
    x: torch.Tensor, weight: W8Weight, bias: torch.Tensor | None = None, *, config: W4A16Config | None = None
) -> torch.Tensor:
    """``x @ dequantize_w8(weight).T (+ bias)``: the int8 per-channel twin of ``matmul`` (same kernel).

    The codes are exact in 16 bits, so the product is of the codes and the per-channel scale is applied
    to the fp32 sum; arguments and returns as ``matmul``.
    """
    if not isinstance(weight, W8Weight):
        raise TypeError(f"weight must be a W8Weight from quantize_w8(), got {type(weight).__name__}")
    _check_activations(x, weight.shape, bias, (weight.qweight, weight.scales), ("qweight", "scales"))
    with device_guard(x):
        return _launch_w8(x, weight, bias, config)
