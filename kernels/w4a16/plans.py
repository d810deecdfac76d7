"""Launch plans of the W4A16 / W8A16 layers: the host work of a call done once per weight and kind of call.

An eager decode-size call must cost the host less than its GPU time (tens of µs), and most of what a call
works out depends only on the weight and on the kind of call: the checks, the configuration, the grid, the
weight's tensors and strides, the constexprs, Triton's argument binding. A ``LaunchPlan`` holds all of it,
kept on the weight (``W4Weight.plans``) under ``plan_key``: x's shape, strides, dtype, device and 16-byte
alignment, the same of the bias, the configuration and the path, everything a plan depends on. A call whose
key was seen allocates its output, reshapes x where it has leading dims, looks up the split-K workspace of
its stream and launches (``kernels._launch.Prepared``); nothing else. A new weight, shape, layout or
alignment misses and is checked and planned in full. Plans hold the weight's tensors (never their
addresses), so a plan cannot point at freed memory; they go with the weight (at most ``MAX_PLANS`` a weight,
the oldest dropped first).

Here too: the split-K workspaces, the weight operands each int4 kernel takes (``w4_operands``), and the
builders of the candidate paths' plans (``tc_plan``, ``streamk_plan``); ``kernels.w4a16.w4a16`` builds the
default path's.
"""

from __future__ import annotations

import torch
import triton

from kernels._launch import Prepared
from kernels._runtime import INTERPRET, compute_capability, multiprocessor_count
from kernels.w4a16.formats import PACK_BLOCK, W4Weight, W8Weight, block_split
from kernels.w4a16.streamk_kernels import _wq_streamk_kernel
from kernels.w4a16.tc_kernels import _wq_tc_kernel
from kernels.w4a16.w4a16_config import W4A16Config

MAX_PLANS = 256  # per weight: a serving loop's distinct M values
INTERPRET_SMS = 3  # multiprocessors the candidates' persistent grids assume in the interpreter (odd: uneven runs)


def plan_key(x, bias, config, path) -> tuple | None:
    """What a launch plan depends on besides the weight (module docstring); None when an argument is not of
    its type (the full checks then say what is wrong)."""
    if not isinstance(x, torch.Tensor) or not (config is None or isinstance(config, W4A16Config)):
        return None
    if not (path is None or isinstance(path, str)):
        return None
    if bias is None:
        b = None
    elif isinstance(bias, torch.Tensor):
        b = (bias.shape, bias.stride(), bias.dtype, bias.get_device(), bias.data_ptr() % 16 == 0)
    else:
        return None
    return (x.shape, x.stride(), x.dtype, x.get_device(), x.data_ptr() % 16 == 0, b, config, path)


def remember(plans: dict, key: tuple | None, plan: LaunchPlan) -> LaunchPlan:
    if key is not None:
        if len(plans) >= MAX_PLANS:
            plans.pop(next(iter(plans)))
        plans[key] = plan
    return plan


# Split-K workspaces, per (device, stream): fp32 partial sums and int32 arrival counters. The counters are
# zeroed once, when allocated, and every launch leaves them at 0 (the last program of each tile resets its
# counter), so a launch needs no memset. Per stream, because two launches that run at the same time must
# not share counters. Buffers that were outgrown are kept (in _RETIRED), so that a CUDA graph captured
# with them never points at freed memory. Not safe: one stream used from several host threads at once.
_WORKSPACES: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
_RETIRED: list[tuple[torch.Tensor, torch.Tensor]] = []


def workspace(device: int, stream: int, partials: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 partials, int32 counters) of at least these sizes for ``device`` (an index; −1: the CPU)."""
    key = (device, stream)
    ws = _WORKSPACES.get(key)
    if ws is not None and ws[0].numel() >= partials and ws[1].numel() >= tiles:
        return ws
    if ws is not None:
        _RETIRED.append(ws)
        partials, tiles = max(partials, 2 * ws[0].numel()), max(tiles, 2 * ws[1].numel())
    where = torch.device("cpu") if device < 0 else torch.device("cuda", device)
    ws = (
        torch.empty(max(partials, 1 << 16), device=where, dtype=torch.float32),
        torch.zeros(max(tiles, 1 << 12), device=where, dtype=torch.int32),
    )
    _WORKSPACES[key] = ws
    return ws


class LaunchPlan:
    """One kind of call on one weight: ``plan(x, bias)`` returns ``[..., N]``.

    ``main`` is launched with ``(x2, *head, bias, out, [partials, counters,] *tail)`` (``workspace``: the
    sizes of partials and counters, or None for a kernel that takes none). With ``reduce`` (the int8 tiled
    split-K), ``main`` writes its slices' fp32 sums to the partials in place of ``out`` and without the
    bias, and ``reduce`` is launched with ``(partials, bias, out, *reduce_tail)``."""

    __slots__ = ("main", "head", "tail", "workspace", "reduce", "reduce_tail", "x2_shape", "out_shape", "device")

    def __init__(self, main, head, tail, x, n, workspace=None, reduce=None, reduce_tail=()):
        self.main = main
        self.head = head
        self.tail = tail
        self.workspace = workspace
        self.reduce = reduce
        self.reduce_tail = reduce_tail
        k = x.shape[-1]
        self.x2_shape = None if x.ndim == 2 else (-1, k)
        self.out_shape = (*x.shape[:-1], n)  # contiguous: the kernels' [M, N] rows
        self.device = x.get_device()

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x2 = x if self.x2_shape is None else x.reshape(self.x2_shape)
        out = x.new_empty(self.out_shape)  # x's dtype and device
        device = self.device
        if device < 0:
            self._launch(x2, bias, out, 0)
        elif device == torch.cuda.current_device():
            self._launch(x2, bias, out, torch._C._cuda_getCurrentRawStream(device))
        else:
            with torch.cuda.device(device):
                self._launch(x2, bias, out, torch._C._cuda_getCurrentRawStream(device))
        return out

    def _launch(self, x2, bias, out, stream) -> None:
        if self.workspace is None:
            self.main((x2, *self.head, bias, out, *self.tail), stream)
            return
        part, cnt = workspace(self.device, stream, *self.workspace)
        if self.reduce is None:
            self.main((x2, *self.head, bias, out, part, cnt, *self.tail), stream)
            return
        self.main((x2, *self.head, None, part, *self.tail), stream)
        self.reduce((part, bias, out, *self.reduce_tail), stream)


def w4_operands(weight: W4Weight, x_dtype: torch.dtype, scale_after: bool) -> tuple:
    """(DEQ, scales or scale_zero words, zero points, stride_sn, stride_sg, stride_zn, stride_zg) of an int4
    weight for x of ``x_dtype`` (the kernels' DEQ modes: ``_w4a16_kernel``)."""
    sz = weight.scale_zero
    if x_dtype == torch.float32:
        deq = 2
    elif sz is not None and weight.scales.dtype == x_dtype:
        deq = 3 if scale_after else 0
    else:
        deq = 1
    if deq in (0, 3):  # the combined int32 words, [K // group, N]
        stride_sg, stride_sn = sz.stride()
        return deq, sz, None, stride_sn, stride_sg, 0, 0
    s, z = weight.scales, weight.zeros
    stride_zn, stride_zg = z.stride() if z is not None else (0, 0)
    return (deq, s, z, *s.stride(), stride_zn, stride_zg)


def bias_stride(bias: torch.Tensor | None) -> int:
    """The bias's element stride (0 for an expanded one; 0 when there is none, unused then)."""
    return 0 if bias is None else bias.stride(0)


def use_asm(cfg: W4A16Config, deq: int, device: torch.device) -> bool:
    """The PTX on pairs of 16-bit values (sub/mul .bf16x2 need sm_90); the plain-Triton form gives the same
    bits."""
    return cfg.asm and deq in (0, 3) and not INTERPRET and compute_capability(device) >= (9, 0)


def _programs(cfg: W4A16Config, device: torch.device) -> int:
    return cfg.programs_per_sm * multiprocessor_count(device, INTERPRET_SMS)


def _tma_ok(*tensors: torch.Tensor) -> bool:
    """Every 2-D tensor's rows contiguous, apart (no stride 0, no overlap) and 16-byte aligned, as a tensor
    descriptor needs."""
    return all(
        t.stride(1) == 1
        and t.stride(0) >= t.shape[1]
        and (t.stride(0) * t.element_size()) % 16 == 0
        and t.data_ptr() % 16 == 0
        for t in tensors
    )


def tma_used(cfg: W4A16Config, x2: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether the tc path loads through tensor descriptors: asked for, the layouts allow it, and the GPU has
    TMA (compute capability ≥ 9.0; the interpreter emulates descriptors)."""
    if not cfg.tma or not _tma_ok(x2, w):
        return False
    return INTERPRET or compute_capability(x2.device) >= (9, 0)


def tc_plan(x, x2, weight, bias, cfg: W4A16Config) -> LaunchPlan:
    """The persistent tensor-core kernel (``tc_kernels``) for either format."""
    m, k = x2.shape
    n = weight.shape[0]
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    grid = (max(1, min(tiles, _programs(cfg, x.device))), 1, 1)
    if isinstance(weight, W4Weight):
        deq, s, z, ssn, ssg, szn, szg = w4_operands(weight, x.dtype, False)
        w, k_main, tail_words = weight.packed, *block_split(k)
        consts = dict(BITS=4, GROUP=weight.group_size, SYMMETRIC=weight.symmetric, TAIL_WORDS=tail_words, DEQ=deq)
    else:
        deq, s, z = (2 if x.dtype == torch.float32 else 0), weight.scales, None
        ssn, ssg, szn, szg = s.stride(0), 0, 0, 0
        w, k_main = weight.qweight, k
        consts = dict(BITS=8, GROUP=1, SYMMETRIC=True, TAIL_WORDS=0, DEQ=deq)
    tma = tma_used(cfg, x2, w)
    consts.update(
        MAGIC=0x6400 if x.dtype == torch.float16 else 0x4300,
        USE_ASM=use_asm(cfg, deq, x.device),
        USE_TMA=tma,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k if consts["BITS"] == 8 else PACK_BLOCK,
        GROUP_N=cfg.group_n,
    )
    tail = (m, n, k, k_main, *x2.stride(), *w.stride(), ssn, ssg, szn, szg, bias_stride(bias))
    main = Prepared(_wq_tc_kernel, grid, consts, cfg.num_warps, cfg.num_stages)
    return LaunchPlan(main, (w, s, z), tail, x, n)


def streamk_plan(x, x2, weight, bias, cfg: W4A16Config) -> LaunchPlan:
    """The stream-K decoding kernel (``streamk_kernels``) for either format."""
    m, k = x2.shape
    n = weight.shape[0]
    if isinstance(weight, W4Weight):
        deq, s, z, ssn, ssg, szn, szg = w4_operands(weight, x.dtype, cfg.scale_after)
        w, (k_main, tail_words) = weight.packed, block_split(k)
        steps = max(1, triton.cdiv(k_main, cfg.block_k))
        consts = dict(BITS=4, GROUP=weight.group_size, SYMMETRIC=weight.symmetric, TAIL_WORDS=tail_words, DEQ=deq)
    else:
        deq, s, z, szn, szg = (2 if x.dtype == torch.float32 else 0), weight.scales, None, 0, 0
        ssn, ssg = s.stride(0), 0
        w, k_main = weight.qweight, k
        steps = triton.cdiv(k, cfg.block_k)
        consts = dict(BITS=8, GROUP=1, SYMMETRIC=True, TAIL_WORDS=0, DEQ=deq)
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    units = tiles * steps
    programs = max(1, min(units, _programs(cfg, x.device)))  # no program without a unit (the kernel's rule)
    consts.update(
        MAGIC=0x6400 if x.dtype == torch.float16 else 0x4300,
        USE_ASM=use_asm(cfg, deq, x.device),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
    )
    tail = (m, n, k, k_main, steps, units, *x2.stride(), *w.stride(), ssn, ssg, szn, szg, bias_stride(bias))
    main = Prepared(_wq_streamk_kernel, (programs, 1, 1), consts, cfg.num_warps, cfg.num_stages)
    return LaunchPlan(main, (w, s, z), tail, x, n, workspace=(programs * 2 * cfg.block_n * cfg.block_m, tiles))


def check_weight_type(weight, bits: int) -> None:
    want, maker = (W4Weight, "quantize") if bits == 4 else (W8Weight, "quantize_w8")
    if not isinstance(weight, want):
        raise TypeError(f"weight must be a {want.__name__} from {maker}(), got {type(weight).__name__}")
