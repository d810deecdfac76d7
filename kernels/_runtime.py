"""Runtime facts shared by every kernel launcher: interpreter mode, input checks, host copies of small
device tensors.

Triton decides at import time whether ``@triton.jit`` functions run compiled or in the interpreter
(``TRITON_INTERPRET=1``), so the same switch is read here once and the launchers agree with it.
"""

from __future__ import annotations

import contextlib
import functools
import math
import operator
import os
import weakref

import numpy as np
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_device(*tensors: torch.Tensor, names: tuple[str, ...]) -> None:
    """All tensors on one device, and that device able to run Triton in the current mode."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        listing = ", ".join(f"{n} on {t.device}" for n, t in zip(names, tensors, strict=True))
        raise ValueError(f"inputs must share one device, got {listing}")
    device = tensors[0].device
    if device.type == "cuda":
        if INTERPRET:
            raise ValueError("TRITON_INTERPRET=1 runs kernels on the CPU: pass CPU tensors, or unset TRITON_INTERPRET")
        return
    if device.type == "cpu" and not INTERPRET:
        raise ValueError(
            "CPU tensors need Triton's interpreter: set TRITON_INTERPRET=1 before importing kernels, "
            "or move the tensors to a CUDA device"
        )
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {device}; Triton kernels here run on CUDA GPUs")


def check_flag(name: str, value) -> bool:
    """A boolean argument as a bool: True or False (a NumPy bool too). Anything else is refused, a string
    above all: ``causal="False"`` is truthy and would silently run the causal kernel."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")


def check_int(name: str, value, minimum: int | None = None) -> int:
    """An integer argument as an int (a NumPy or torch integer too, not a bool or a float), at least
    ``minimum`` when given."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def device_guard(t: torch.Tensor):
    """A ``torch.cuda.device`` guard for a launch on t's GPU, only when that is not the current device (the
    guard costs host time); a null context otherwise."""
    switch = t.device.type == "cuda" and t.device.index not in (None, torch.cuda.current_device())
    return torch.cuda.device(t.device) if switch else contextlib.nullcontext()


def softmax_scale(head_dim: int, sm_scale: float | None) -> float:
    """The score scale: 1/sqrt(d) by default; anything else must be a positive finite number."""
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"sm_scale must be a positive finite number, got {sm_scale}")
    return scale


# Host copies of small device tensors already read (offsets that a launcher validates), so that calls
# repeating one tensor (a training step, a timed loop, a CUDA graph's capture after a warm-up call) do not
# synchronise with the GPU again: keyed by the tensor's identity, valid while its version counter (bumped
# by every in-place write through torch, views included) is unchanged. Writes that bypass torch (a Triton
# kernel storing into the tensor, a CUDA graph replaying a copy into it) do not bump the counter: refill such
# a tensor through torch (``copy_``) to have it read again.
_HOST_VALUES: dict[int, tuple[weakref.ref, int, tuple[int, ...]]] = {}


def host_values(t: torch.Tensor) -> tuple[int, ...]:
    """``t.tolist()`` of a 1-D integer tensor, from the cache above when ``t`` is an unmodified GPU tensor
    read before (no synchronisation then); CPU tensors are read every time (nothing to save)."""
    if t.device.type != "cuda":
        return tuple(t.tolist())
    try:
        version = t._version
    except RuntimeError:  # inference tensors keep no version counter: read them every time
        return tuple(t.tolist())
    seen = _HOST_VALUES.get(id(t))
    if seen is not None and seen[0]() is t and seen[1] == version:
        return seen[2]
    values = tuple(t.tolist())  # one device-to-host copy (a synchronisation on a GPU)
    if len(_HOST_VALUES) >= 64:
        _HOST_VALUES.clear()
    _HOST_VALUES[id(t)] = (weakref.ref(t), version, values)
    return values


@functools.cache
def multiprocessor_count(device: torch.device, without_gpu: int) -> int:
    """The GPU's multiprocessor count (cached per device), or ``without_gpu`` for a CPU tensor (the
    interpreter), for launch heuristics that size grids to the machine."""
    if device.type != "cuda":
        return without_gpu
    index = torch.cuda.current_device() if device.index is None else device.index
    return torch.cuda.get_device_properties(index).multi_processor_count


def compute_capability(device: torch.device) -> tuple[int, int]:
    """The GPU's compute capability (cached per device index); (0, 0) for a CPU tensor (the interpreter)."""
    if device.type != "cuda":
        return (0, 0)
    return _capability(torch.cuda.current_device() if device.index is None else device.index)


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def check_bf16(dtype: torch.dtype, device: torch.device, name: str = "") -> None:
    """bfloat16 inputs need a GPU of compute capability 8.0 or newer, and are refused in the interpreter
    (Triton's interpreter mis-computes tl.dot on bfloat16, triton-lang/triton#11584). ``name``: the
    argument, for the message."""
    if dtype != torch.bfloat16:
        return
    what = f"{name} has dtype torch.bfloat16: " if name else ""
    if device.type == "cpu":
        raise TypeError(f"{what}bfloat16 is not supported in Triton's interpreter (wrong tl.dot results); use float16")
    if device.type == "cuda" and compute_capability(device) < (8, 0):
        raise TypeError(f"{what}bfloat16 needs a GPU of compute capability 8.0 or newer")


class LaunchCache:
    """Launch a ``@triton.jit`` kernel with less host time: the first launch for a key goes through Triton's
    JIT (which binds the arguments, specialises, compiles if needed and launches), later launches with the
    same key call that compiled kernel's launcher directly. That skips Triton's per-call binding and
    specialisation of every argument (tens of µs for a kernel with 30 arguments: more than a decode-size
    matmul takes on the GPU).

    The key covers everything Triton specialises a launch on, and more: the device, every int argument's
    value (Triton: 1, divisible by 16), every tensor argument's dtype and whether its address is 16-byte
    aligned, which arguments are None, the constexprs, num_warps and num_stages. Runtime arguments come
    first in the kernel's signature, the constexprs after them. In the interpreter every launch goes
    through Triton (there is nothing compiled to call).
    """

    def __init__(self, fn, maxsize: int = 1024):
        self.fn = fn
        self.maxsize = maxsize
        self._compiled: dict = {}

    def launch(
        self, grid: tuple[int, int, int], args: tuple, constexprs: dict, num_warps: int, num_stages: int
    ) -> None:
        if INTERPRET:
            self.fn[grid](*args, **constexprs, num_warps=num_warps, num_stages=num_stages)
            return
        device = torch.cuda.current_device()
        key = (device, num_warps, num_stages, *constexprs.values(), *map(_arg_key, args))
        entry = self._compiled.get(key)
        if entry is None:
            compiled = self.fn[grid](*args, **constexprs, num_warps=num_warps, num_stages=num_stages)
            if len(self._compiled) >= self.maxsize:
                self._compiled.pop(next(iter(self._compiled)))
            # the launcher takes every argument in signature order, the constexprs' places too
            names = self.fn.arg_names[len(args) :]
            if set(names) != set(constexprs):
                raise TypeError(f"{self.fn.__name__}: runtime arguments first, then the constexprs {names}")
            self._compiled[key] = (compiled, tuple(constexprs[n] for n in names))
            return
        compiled, tail = entry
        full = args + tail
        stream = torch._C._cuda_getCurrentRawStream(device)
        enter, leave = _launch_hooks()
        meta = compiled.launch_metadata(grid, stream, *full) if enter is not None else None
        compiled.run(
            grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata, meta, enter, leave, *full
        )


def _arg_key(a):
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    return (type(a), a)  # True, 1 and 1.0 hash alike but are not the same specialisation


def _launch_hooks():
    """Triton's launch hooks (profilers set them), read at every launch as Triton itself does."""
    from triton import knobs

    return knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
