"""Runtime facts shared by every kernel launcher: interpreter mode and input checks.

Triton decides at import time whether ``@triton.jit`` functions run compiled or in the interpreter
(``TRITON_INTERPRET=1``), so the same switch is read here once and the launchers agree with it.
"""

from __future__ import annotations

import functools
import math
import os

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


def softmax_scale(head_dim: int, sm_scale: float | None) -> float:
    """The score scale: 1/sqrt(d) by default; anything else must be a positive finite number."""
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"sm_scale must be a positive finite number, got {sm_scale}")
    return scale


@functools.cache
def multiprocessor_count(device: torch.device, without_gpu: int) -> int:
    """The GPU's multiprocessor count (cached per device), or ``without_gpu`` for a CPU tensor (the
    interpreter), for launch heuristics that size grids to the machine."""
    if device.type != "cuda":
        return without_gpu
    index = torch.cuda.current_device() if device.index is None else device.index
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.cache
def compute_capability(device: torch.device) -> tuple[int, int]:
    """The GPU's compute capability (cached per device); (0, 0) for a CPU tensor (the interpreter)."""
    if device.type != "cuda":
        return (0, 0)
    index = torch.cuda.current_device() if device.index is None else device.index
    return torch.cuda.get_device_capability(index)
