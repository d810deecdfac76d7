"""The host side of the FA-3 kernels (``fa3.py``, ``fa3_bwd.py``): what TMA can read, its descriptors, and a
launcher that skips Triton's per-call argument binding.

TMA reads a tensor whose base and every stride but the last (which must be 1) are multiples of 16 bytes;
anything else (a view at an odd offset, rows of an odd width, a broadcast dim) is copied into fresh memory
first (``tma_ready``). ``GluonLauncher`` launches a ``@gluon.jit`` kernel through Triton's JIT the first time
for each specialisation, then through the compiled kernel's own launcher: the JIT binds and specialises
every argument on every call (tens of microseconds of host time for the FA-3 kernel's 50 arguments), which an eager
training step pays for every launch. The caches hold no tensor and no address: a specialisation is keyed by
what Triton specialises on (dtypes, 16-byte alignment, ints equal to 1 or divisible by 16, descriptor blocks),
a TMA decision by shapes, strides and alignment.
"""

from __future__ import annotations

import functools
import typing

import torch

from kernels._runtime import INTERPRET, compute_capability

__all__ = [
    "Tma",
    "GluonLauncher",
    "check_hopper",
    "tma_strides",
    "tma_ready",
    "tma_arg",
    "smem_layout",
    "gl_dtype",
    "spec_key",
    "cdiv",
]

REQUIRED_CAPABILITY = (9, 0)


def cdiv(a: int, b: int) -> int:
    """⌈a / b⌉ for the launchers' grids. (``triton.cdiv`` is a constexpr function in Triton 3.6: several µs a
    call from Python, twice per eager backward.)"""
    return -(-a // b)


def check_hopper(q: torch.Tensor) -> None:
    """A CUDA tensor on a Hopper GPU, outside the interpreter: what the Gluon kernels need."""
    if INTERPRET or q.device.type != "cuda":
        raise RuntimeError(
            "the FA-3 kernel is written in Gluon, which Triton's interpreter does not run: it needs a CUDA GPU "
            "of compute capability 9.0 (Hopper); kernels.attention.fa2 runs in the interpreter"
        )
    cap = compute_capability(q.device)
    if cap[0] != REQUIRED_CAPABILITY[0]:
        raise RuntimeError(
            f"the FA-3 kernel needs a Hopper GPU (compute capability 9.0, for TMA, WGMMA and setmaxnreg); "
            f"{torch.cuda.get_device_name(q.device)} has {cap[0]}.{cap[1]}: use kernels.attention.fa2"
        )


def gl_dtype(dtype: torch.dtype):
    """The Gluon dtype of a torch dtype the kernels take (16-bit, e4m3, or fp32 for the backward's rows)."""
    from triton.experimental.gluon import language as gl

    return {
        torch.float16: gl.float16,
        torch.bfloat16: gl.bfloat16,
        torch.float8_e4m3fn: gl.float8e4nv,
        torch.float32: gl.float32,
    }[dtype]


@functools.cache
def smem_layout(block: tuple[int, ...], dtype: torch.dtype):
    """The shared-memory layout of a TMA block (a value; made once: it costs about as much host time as the
    rest of a descriptor)."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout.get_default_for(list(block), gl_dtype(dtype))


@functools.lru_cache(maxsize=1024)
def _strides_for_tma(shape: tuple[int, ...], strides: tuple[int, ...], elem: int, aligned: bool) -> tuple | None:
    fixed = list(strides)
    for i in range(len(shape) - 2, -1, -1):
        if shape[i] == 1:  # the stride of a size-1 dim is never used: any legal value will do
            fixed[i] = fixed[i + 1] * shape[i + 1]
    ok = aligned and fixed[-1] == 1 and all(s > 0 and (s * elem) % 16 == 0 for s in fixed[:-1])
    return tuple(fixed) if ok else None


def tma_strides(t: torch.Tensor) -> tuple[int, ...] | None:
    """The strides to describe ``t`` to TMA with, or None if it cannot be: the last dim contiguous, the base
    and every other stride a positive multiple of 16 bytes (strides of size-1 dims do not matter and are
    replaced). Decided once per (shape, strides, element size, alignment)."""
    return _strides_for_tma(tuple(t.shape), t.stride(), t.element_size(), t.data_ptr() % 16 == 0)


def tma_ready(t: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The tensor and its TMA strides, or a copy of it in fresh (aligned, contiguous) memory where TMA cannot
    read it as it is. (Not ``contiguous()``: a contiguous view at an unaligned offset would come back as it
    is, and TMA's descriptor refuses its base: "base must be 16-byte aligned".)"""
    strides = tma_strides(t)
    if strides is not None:
        return t, strides
    t = t.clone(memory_format=torch.contiguous_format)
    return t, tuple(t.stride())


class Tma(typing.NamedTuple):
    """A TMA descriptor's arguments: what Triton's launcher reads of a ``TensorDescriptor`` (base, shape,
    strides, padding) and the block and shared layout the kernel is specialised on. Made per call (it
    holds the tensor); ``descriptor()`` is the ``TensorDescriptor`` Triton's JIT takes."""

    base: torch.Tensor
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    block: tuple[int, ...]
    layout: object
    padding: str = "zero"

    def descriptor(self):
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        return TensorDescriptor(self.base, list(self.shape), list(self.strides), list(self.block), self.layout)


def tma_arg(t: torch.Tensor, tile: list[int] | tuple[int, ...]) -> tuple[torch.Tensor, Tma]:
    """(the tensor, or a TMA-legal copy of it; its descriptor's arguments for ``tile``: the last dims' block,
    1 in the dims before)."""
    t, strides = tma_ready(t)
    block = (1,) * (t.dim() - len(tile)) + tuple(tile)
    return t, Tma(t, tuple(t.shape), strides, block, smem_layout(block, t.dtype))


# ---------------------------------------------------------------------------------------------------
# The launcher
# ---------------------------------------------------------------------------------------------------


def _int_key(v: int) -> tuple:
    # Triton: 1 becomes a constant; 16-divisible values are marked so; outside int32 the type is int64
    return (v == 1, v % 16 == 0, -(2**31) <= v < 2**31)


def _arg_key(a) -> object:
    kind = type(a)
    if kind is int:
        return _int_key(a)
    if kind is Tma:
        return (a.base.dtype, a.block, a.layout)
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if kind is float:
        return float
    if a is None:
        return None
    raise TypeError(f"GluonLauncher: no specialisation key for an argument of type {kind.__name__}")


def spec_key(args: tuple) -> tuple:
    """What Triton's JIT specialises a launch on, per runtime argument: tensors by dtype and 16-byte
    alignment, ints by being 1, divisible by 16 and within int32, descriptors by dtype, block and layout,
    floats by type. Two argument lists with the same key run the same compiled kernel."""
    return tuple(_arg_key(a) for a in args)


class GluonLauncher:
    """Launch a ``@gluon.jit`` kernel: through Triton's JIT the first time for each specialisation (which
    compiles, or finds the compiled kernel in Triton's cache), after that through the compiled kernel's
    launcher with no binding. Runtime arguments come first in the kernel's signature, the constexprs after
    them; descriptors come as ``Tma``. In the interpreter there is nothing compiled: every call goes
    through Triton (Gluon refuses to run there)."""

    def __init__(self, fn, maxsize: int = 256):
        self.fn = fn
        self.maxsize = maxsize
        self._compiled: dict = {}

    def cached(self) -> int:
        """Specialisations launched directly (for the tests)."""
        return len(self._compiled)

    def __call__(self, grid: tuple[int, int, int], args: tuple, constexprs: dict, options: dict) -> None:
        if INTERPRET:
            self._through_jit(grid, args, constexprs, options)
            return
        device = torch.cuda.current_device()
        key = (device, tuple(constexprs.items()), tuple(options.items()), spec_key(args))
        entry = self._compiled.get(key)
        if entry is None:
            compiled = self._through_jit(grid, args, constexprs, options)
            names = self.fn.arg_names[len(args) :]
            if set(names) != set(constexprs):
                raise TypeError(f"{self.fn.__name__}: runtime arguments first, then the constexprs {names}")
            if len(self._compiled) >= self.maxsize:
                self._compiled.pop(next(iter(self._compiled)))
            self._compiled[key] = (compiled, tuple(constexprs[n] for n in names))
            return
        compiled, tail = entry
        full = args + tail
        stream = torch._C._cuda_getCurrentRawStream(device)
        from triton import knobs

        enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        meta = compiled.launch_metadata(grid, stream, *full) if enter is not None else None
        compiled.run(
            grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata, meta, enter, leave, *full
        )

    def _through_jit(self, grid, args, constexprs, options):
        jit_args = tuple(a.descriptor() if type(a) is Tma else a for a in args)
        return self.fn[grid](*jit_args, **constexprs, **options)
