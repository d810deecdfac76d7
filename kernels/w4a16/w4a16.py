"""W4A16 and W8A16 linear layers in Triton: weights quantised offline, dequantised in registers.

``y = x @ dequant(W)ᵀ (+ bias)`` for an ``nn.Linear``-style weight ``W [N, K]`` in a format of
``kernels.w4a16.formats`` and 16-bit activations ``x [..., K]``. The kernels dequantise the packed integers in
registers, so the 16-bit weight never exists in memory: a decode step is bound by reading the weights, and
int4 reads a quarter of their 16-bit bytes. Three paths (``path=``): ``"tiled"``, the default
(``w4a16_kernels``: one output tile per program, split-K in one launch where the grid is short), and two
candidates not yet measured on a GPU, ``"tc"`` (``tc_kernels``, persistent tensor-core GEMM for M ≥ 64) and
``"streamk"`` (``streamk_kernels``, decoding); ``"auto"`` asks the unadopted heuristic
``w4a16_config.choose_path``. Here: the checks and the default path's launch plans; a call's host work is
done once per weight and kind of call (``plans``: a repeated call allocates its output and launches).

Handles: any M (0 included) and leading dims, any N, K a multiple of the group size (int4) or any K (int8),
float16 and bfloat16 activations on a GPU, exact float32. Does not handle: activation quantisation,
act-order (GPTQ's permuted groups), a backward pass. Tested in the interpreter, compiled for sm_90, and on an
H200 (bf16 included; the default path): tests/kernels/test_w4a16.py, test_w4a16_paths.py.
"""

from __future__ import annotations

import functools

import torch
import triton

from kernels._launch import Prepared
from kernels._runtime import INTERPRET, check_bf16, check_device, multiprocessor_count
from kernels.w4a16.formats import PACK_BLOCK, W4Weight, W8Weight, block_split
from kernels.w4a16.plans import (
    LaunchPlan,
    bias_stride,
    check_weight_type,
    plan_key,
    remember,
    streamk_plan,
    tc_plan,
    use_asm,
    w4_operands,
)
from kernels.w4a16.w4a16_config import (
    DEFAULT_SM_COUNT,
    PATHS,
    W4A16Config,
    check_config,
    choose_config,
    config_for,
)
from kernels.w4a16.w4a16_kernels import _splitk_reduce_kernel, _w4a16_kernel, _w8a16_matmul_kernel

ACTIVATION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_activations(x: torch.Tensor, shape: tuple[int, int], bias: torch.Tensor | None, tensors, names) -> None:
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
    check_device(x, *tensors, names=("x", *names))


def _empty_product(x, bias, m, n, k, lead):
    """The output when there is nothing to multiply (M, N or K zero)."""
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    if k == 0 and m and n:
        out.zero_()
        if bias is not None:
            out += bias.to(out.dtype)
    return out.reshape(*lead, n)


def _config(config, path, m: int, n: int, k: int, device: torch.device, bits: int) -> W4A16Config:
    """The configuration of a call: the pinned one (its path), or the chosen one for ``path``."""
    if path is not None and path not in (*PATHS, "auto"):
        raise ValueError(f"path must be one of {[*PATHS, 'auto']} or None (the default, 'tiled'), got {path!r}")
    if config is not None:
        if not isinstance(config, W4A16Config):
            raise TypeError(f"config must be a W4A16Config or None, got {type(config).__name__}")
        if path is not None and path != config.path:
            raise ValueError(f"path={path!r} disagrees with config.path={config.path!r}: pass one of them")
        return config
    sms = multiprocessor_count(device, DEFAULT_SM_COUNT)
    if path in (None, "tiled"):
        return config_for(m, n, k, sms, INTERPRET, bits)
    return choose_config(m, n, k, sm_count=sms, bits=bits, path=path)


@functools.lru_cache(maxsize=4096)
def _plan_w4(cfg: W4A16Config, m: int, n: int, k: int) -> tuple[tuple[int, int, int], int, int, int, int]:
    """(grid, split, blocks per split, k_main, tail words) of a tiled int4 launch; slices are whole loop steps
    of block_k inputs (the kernels mask the blocks of a last, partial step) and none is empty."""
    k_main, tail_words = block_split(k)
    per_step = cfg.block_k // PACK_BLOCK
    blocks = k_main // PACK_BLOCK
    steps = triton.cdiv(blocks, per_step)
    blocks_per_split = triton.cdiv(steps, min(cfg.split_k, max(steps, 1))) * per_step
    split = max(1, triton.cdiv(blocks, blocks_per_split)) if blocks else 1
    grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n), split)
    return grid, split, blocks_per_split, k_main, tail_words


def _tiled_w4_plan(x, x2, weight: W4Weight, bias, cfg: W4A16Config) -> LaunchPlan:
    """The default int4 kernel: one launch, split-K partials reduced by each tile's last program."""
    m, k = x2.shape
    n = weight.shape[0]
    grid, split, blocks_per_split, k_main, tail_words = _plan_w4(cfg, m, n, k)
    deq, s, z, ssn, ssg, szn, szg = w4_operands(weight, x.dtype, cfg.scale_after)
    consts = dict(
        GROUP=weight.group_size,
        SYMMETRIC=weight.symmetric,
        TAIL_WORDS=tail_words,
        SPLIT=split > 1,
        DEQ=deq,
        MAGIC=0x6400 if x.dtype == torch.float16 else 0x4300,
        SWAP_AB=cfg.swap_ab,
        USE_ASM=use_asm(cfg, deq, x.device),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
    )
    tail = (m, n, k_main, blocks_per_split, split, *x2.stride(), *weight.packed.stride(), ssn, ssg, szn, szg)
    main = Prepared(_w4a16_kernel, grid, consts, cfg.num_warps, cfg.num_stages)
    head = (weight.packed, s, z)
    if split == 1:  # no workspace: Part and Cnt are None
        return LaunchPlan(main, head, (None, None, *tail, bias_stride(bias)), x, n)
    tiles = grid[0] * grid[1]
    return LaunchPlan(main, head, (*tail, bias_stride(bias)), x, n, workspace=(split * m * n, tiles))


def _tiled_w8_plan(x, x2, weight: W8Weight, bias, cfg: W4A16Config) -> LaunchPlan:
    """The default int8 kernel; with split-K its fp32 slices go to the workspace and a second kernel adds them
    in a fixed order (with the bias)."""
    m, k = x2.shape
    n = weight.shape[0]
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    split = triton.cdiv(k, k_per_split)  # no empty slice
    w, scales = weight.qweight, weight.scales
    grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n), split)
    consts = dict(
        SPLIT_K=split,
        IS_FP32=x.dtype == torch.float32,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
    )
    main = Prepared(_w8a16_matmul_kernel, grid, consts, cfg.num_warps, cfg.num_stages)
    tail = (m, n, k_per_split, k, *x2.stride(), *w.stride(), scales.stride(0), bias_stride(bias))
    if split == 1:
        return LaunchPlan(main, (w, scales), (*tail, 0, n, 1), x, n)
    block_m, block_n = 16, 64
    reduce = Prepared(
        _splitk_reduce_kernel,
        (triton.cdiv(m, block_m), triton.cdiv(n, block_n), 1),
        dict(SPLIT_K=split, BLOCK_M=block_m, BLOCK_N=block_n),
        4,
        1,
    )
    reduce_tail = (m, n, m * n, n, 1, n, 1, bias_stride(bias))
    return LaunchPlan(
        main,
        (w, scales),
        (*tail, m * n, n, 1),
        x,
        n,
        workspace=(split * m * n, 0),
        reduce=reduce,
        reduce_tail=reduce_tail,
    )


_BUILDERS = {
    (4, "tiled"): _tiled_w4_plan,
    (8, "tiled"): _tiled_w8_plan,
    (4, "tc"): tc_plan,
    (8, "tc"): tc_plan,
    (4, "streamk"): streamk_plan,
    (8, "streamk"): streamk_plan,
}


def _first_call(x, weight, bias, config, path, key, bits: int) -> torch.Tensor:
    """A call whose kind this weight has not served: the checks in full, then a launch plan, kept."""
    if bits == 4:
        if weight.zeros is not None:
            tensors, names = (weight.packed, weight.scales, weight.zeros), ("packed", "scales", "zeros")
        else:
            tensors, names = (weight.packed, weight.scales), ("packed", "scales")
    else:
        tensors, names = (weight.qweight, weight.scales), ("qweight", "scales")
    _check_activations(x, weight.shape, bias, tensors, names)
    n, k = weight.shape
    x2 = x if x.ndim == 2 else x.reshape(-1, k)
    m = x2.shape[0]
    cfg = _config(config, path, m, n, k, x.device, bits)
    check_config(cfg, bits)
    if m == 0 or n == 0 or k == 0:
        return _empty_product(x, bias, m, n, k, x.shape[:-1])
    plan = _BUILDERS[bits, cfg.path](x, x2, weight, bias, cfg)
    return remember(weight.plans, key, plan)(x, bias)


def matmul(
    x: torch.Tensor,
    weight: W4Weight,
    bias: torch.Tensor | None = None,
    *,
    config: W4A16Config | None = None,
    path: str | None = None,
) -> torch.Tensor:
    """``x @ dequantize(weight).T (+ bias)`` with the int4 weight dequantised in registers.

    Args:
        x: ``[..., K]`` float16 or bfloat16 (float32: exact IEEE mode, for tests); any leading dims, any M.
        weight: a ``W4Weight`` from ``quantize`` of an ``[N, K]`` weight, on x's device.
        bias: ``[N]`` or None; added in fp32 before the output is rounded.
        config: pin a launch (``choose_config`` otherwise); its ``path`` names the kernel; on the tiled path
            ``split_k > 1`` splits K, ``scale_after`` places the scale after the product.
        path: the kernel when no config is pinned: None or ``"tiled"`` (the default), ``"tc"``, ``"streamk"``
            (candidates, not yet measured), ``"auto"`` (``choose_path``'s unadopted choice).

    Returns: ``[..., N]`` in x's dtype. With the scale before the product (the tiled GEMM at M > 64, the tc
    path): the dequantised weight is rounded to x's dtype before the product (fp32 accumulation), as
    ``x @ dequantize(weight, x.dtype).T`` would. With the scale after it (``config.scale_after``, the default
    for M ≤ 64 and on the streamk path): the weight is not rounded to 16 bits; ``(q − z)·x`` is exact in
    fp32, summed per group in fp32 and scaled by the group's scale (no more error than the former).
    Split-K and stream-K are deterministic (fixed summation order) and run in one launch.
    Raises ``TypeError``/``ValueError`` for unsupported dtypes, devices, shapes, configs or paths.
    """
    check_weight_type(weight, 4)
    key = plan_key(x, bias, config, path)
    plan = weight.plans.get(key)
    if plan is None:
        return _first_call(x, weight, bias, config, path, key, 4)
    return plan(x, bias)


def matmul_w8(
    x: torch.Tensor,
    weight: W8Weight,
    bias: torch.Tensor | None = None,
    *,
    config: W4A16Config | None = None,
    path: str | None = None,
) -> torch.Tensor:
    """``x @ dequantize_w8(weight).T (+ bias)``: the int8 per-channel twin of ``matmul`` (the same paths).

    The codes are exact in 16 bits, so the product is of the codes and the per-channel scale is applied
    to the fp32 sum; arguments and returns as ``matmul``.
    """
    check_weight_type(weight, 8)
    key = plan_key(x, bias, config, path)
    plan = weight.plans.get(key)
    if plan is None:
        return _first_call(x, weight, bias, config, path, key, 8)
    return plan(x, bias)
