"""Prepared launches: the host side of a kernel launch worked out once, then repeated at little host cost.

A ``Prepared`` is one launch of a ``@triton.jit`` kernel whose grid, constexprs and warps its caller worked
out once, for arguments of one kind (the W4A16 layers' per-weight launch plans, ``kernels.w4a16``; the
persistent grouped GEMM, ``kernels.moe``). Its first call goes through Triton's JIT, which binds and
specialises the arguments, compiles if needed and launches; later calls pass the argument tuple straight to
the compiled kernel's launcher. That skips Triton's per-call binding and specialisation of every argument
and, when no launch hook is registered (profilers register them; Triton 3.6 keeps an empty hook chain
otherwise), the launch metadata built for the hooks and the two hook calls. The caller keeps one
``Prepared`` per kind of arguments: everything Triton specialises on (each int's value, each tensor's
dtype and 16-byte alignment) must be the same at every call, which its cache key guarantees.

Kernels that make tensor descriptors on the device (``tl.make_tensor_descriptor``: TMA on Hopper) need a
global scratch buffer per launch (128 bytes a descriptor and program), which Triton's launcher asks an
allocator for. ``Prepared`` hands it a buffer cached per (device, stream), set for the call only (a context
variable), never process-wide: no allocation per call, and a CUDA graph captured with the buffer keeps
pointing at live memory (outgrown buffers are kept). In the interpreter every call goes through Triton and
descriptors need no scratch.
"""

from __future__ import annotations

import contextlib

import torch
from triton import knobs

from kernels._runtime import INTERPRET

__all__ = ["Prepared", "descriptor_scratch", "hooks_idle"]

_SCRATCH: dict[tuple[int, int], torch.Tensor] = {}
_RETIRED: list[torch.Tensor] = []


def _descriptor_scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Triton's allocator protocol: at least ``size`` bytes on the current device, cached per stream (a
    launch's descriptors are written by that launch before use, and launches on one stream run in order)."""
    device = torch.cuda.current_device()
    key = (device, stream or 0)
    buf = _SCRATCH.get(key)
    if buf is None or buf.numel() < size:
        if buf is not None:
            _RETIRED.append(buf)
            size = max(size, 2 * buf.numel())
        buf = torch.empty(max(size, 1 << 14), dtype=torch.uint8, device=device)  # 256-byte aligned
        if buf.data_ptr() % alignment:
            raise RuntimeError(f"descriptor scratch at {buf.data_ptr():#x} is not {alignment}-byte aligned")
        _SCRATCH[key] = buf
    return buf


def _allocator_var():
    """Triton's allocator context variable (``triton.set_allocator`` sets it for the whole context)."""
    from triton.runtime import _allocation

    return _allocation._allocator


@contextlib.contextmanager
def descriptor_scratch():
    """Within the block, a launch of a kernel that makes tensor descriptors gets its scratch from the cached
    buffers above (Triton's allocator context variable, set for the block only; nothing in the interpreter)."""
    if INTERPRET:
        yield
        return
    var = _allocator_var()
    token = var.set(_descriptor_scratch)
    try:
        yield
    finally:
        var.reset(token)


def hooks_idle(enter, leave) -> bool:
    """No launch hook to call: both None, or Triton 3.6's hook chains with nothing registered (a hook of
    another kind counts as one to call)."""
    return (enter is None or not getattr(enter, "calls", True)) and (leave is None or not getattr(leave, "calls", True))


class Prepared:
    """One kernel launch, its grid, constexprs, warps and stages fixed (the module docstring says when a
    caller may reuse it). ``prepared(args, stream)`` launches with the runtime arguments ``args`` (the
    kernel's runtime parameters in signature order, the constexprs after them) on ``stream``, the raw
    stream handle of ``device`` (ignored in the interpreter)."""

    __slots__ = ("fn", "grid", "constexprs", "num_warps", "num_stages", "compiled", "_tail", "_scratch")

    def __init__(self, fn, grid: tuple[int, int, int], constexprs: dict, num_warps: int, num_stages: int):
        self.fn = fn
        self.grid = grid
        self.constexprs = constexprs
        self.num_warps = num_warps
        self.num_stages = num_stages
        self.compiled = None
        self._tail: tuple = ()
        self._scratch = False

    def __call__(self, args: tuple, stream: int = 0) -> None:
        if INTERPRET:
            self.fn[self.grid](*args, **self.constexprs, num_warps=self.num_warps, num_stages=self.num_stages)
            return
        compiled = self.compiled
        if compiled is None:
            self._first(args)
            return
        enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        full = args + self._tail
        if hooks_idle(enter, leave):
            meta = enter = leave = None
        else:
            meta = compiled.launch_metadata(self.grid, stream, *full)
        g0, g1, g2 = self.grid
        if not self._scratch:
            compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata, meta, enter, leave, *full)
            return
        var = _allocator_var()
        token = var.set(_descriptor_scratch)
        try:
            compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata, meta, enter, leave, *full)
        finally:
            var.reset(token)

    def _first(self, args: tuple) -> None:
        """The first launch, through Triton's JIT (descriptor scratch from the cache above)."""
        names = self.fn.arg_names[len(args) :]
        if set(names) != set(self.constexprs):
            raise TypeError(f"{self.fn.__name__}: runtime arguments first, then the constexprs {names}")
        with descriptor_scratch():
            compiled = self.fn[self.grid](
                *args, **self.constexprs, num_warps=self.num_warps, num_stages=self.num_stages
            )
        self._tail = tuple(self.constexprs[n] for n in names)
        self._scratch = compiled.metadata.global_scratch_size > 0
        self.compiled = compiled
