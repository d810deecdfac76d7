"""The official kernels measured beside ours where they are installed: optional peers, pinned in
``pyproject.toml``'s ``peers`` extra to the versions checked on an H200 (``./suite run`` does not need them).

- ``upstream-fa``: FlashAttention's own kernels, ``flash_attn.cute.flash_attn_func`` of flash-attn-4 (Python on
  NVIDIA's CuTe DSL, by FlashAttention's authors; on Hopper its sm_90 kernels, the successor of FlashAttention-3's
  Hopper build): forward, and backward through autograd, with grouped-query heads and the causal mask (aligned
  bottom-right, as ours). It returns ``(out, lse)``; ``upstream_fa`` keeps the output. It takes [B, N, H, d]
  tensors (``BNHD``): the measuring code copies a point's inputs into that layout once, before anything is
  timed, and reads its output and gradients back as [B, H, N, d] views. fp16 and bf16, head dims 8–256 in
  multiples of 8 (refused before the call otherwise, an ``unsupported`` row; so is its backward below
  sm_90). Its kernels are compiled by the CuTe DSL on their first call, which the correctness gate makes,
  before any timing; they are kept on disk (``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED``, switched on here
  unless the environment sets it) so that a later job or run of the same kernel loads it instead.
- ``cudnn-fp8``: cuDNN's FP8 attention forward, through its frontend (``nvidia-cudnn-frontend``: the ``cudnn``
  module's ``sdpa_fp8`` graph, built once per shape and kept, ``_GRAPHS``), on e4m3 Q, K, V with one descale
  each, P multiplied by ``P_SCALE`` into e4m3 as our FP8 kernel does, and an e4m3 output (on Hopper cuDNN
  writes no 16-bit FP8-attention output) at a power-of-two scale that keeps it inside e4m3's range
  (``CudnnFP8``).

A peer that cannot be imported is ``absent``: ``absent(impl)`` says why, its rows carry that status and the
reason, and nothing runs. ``versions()``: the installed version of each peer's packages, for the result set's
``environment.json``. Nothing here imports a peer (or starts CUDA) until a point measures it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import os
from importlib import metadata

# the persistent CuTe DSL cache of flash-attn-4 (read when flash_attn.cute is imported)
CUTE_CACHE_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"
INSTALL = "pip install '.[peers]'"


@dataclasses.dataclass(frozen=True)
class Peer:
    impl: str  # the implementation name its rows carry
    title: str  # what it is, in words
    module: str  # what must import for it to run
    call: str  # what runs, in its rows' kernel_config
    packages: tuple[str, ...]  # its distributions (the first its own), whose versions the provenance records


PEERS = {
    p.impl: p
    for p in (
        Peer(
            "upstream-fa",
            "FlashAttention's own kernels (flash-attn-4, CuTe DSL)",
            "flash_attn.cute",
            "flash_attn.cute.flash_attn_func",
            ("flash-attn-4", "nvidia-cutlass-dsl", "quack-kernels", "apache-tvm-ffi"),
        ),
        Peer(
            "cudnn-fp8",
            "cuDNN's FP8 attention (cuDNN frontend, sdpa_fp8)",
            "cudnn",
            "cudnn sdpa_fp8 graph",
            ("nvidia-cudnn-frontend",),
        ),
    )
}
BNHD = ("upstream-fa",)  # peers that take [B, N, H, d] tensors
P_SCALE = 256.0  # cuDNN's scale_s: P's scale into e4m3 (kernels.attention.reference.P_SCALE, ours)


def versions() -> dict[str, dict[str, str | None]]:
    """Each peer's packages and their installed versions (None: not installed), read from the installed
    distributions' metadata (nothing is imported)."""
    out = {}
    for impl, peer in PEERS.items():
        found = {}
        for name in peer.packages:
            try:
                found[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                found[name] = None
        out[impl] = found
    return out


def version_text(found: dict[str, str | None]) -> str:
    """One peer's ``versions()`` entry in words: ``flash-attn-4 4.0.0b40, ...``, or that it is not installed."""
    have = [f"{name} {v}" for name, v in found.items() if v]
    return ", ".join(have) if have else "not installed"


@functools.cache
def absent(impl: str) -> str:
    """Why the peer ``impl`` cannot run here (it does not import), or "" when it can (and for any other
    implementation). Imports it: called when a point measures it, after the job has its GPU."""
    peer = PEERS.get(impl)
    if peer is None:
        return ""
    if peer.impl == "upstream-fa":
        os.environ.setdefault(CUTE_CACHE_ENV, "1")
    try:
        _import(peer.module)
    except Exception as exc:  # not installed (ImportError), or installed without a library it loads
        why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        return f"{peer.title} is not installed here ({INSTALL}): {why}"[:300]
    return ""


def _import(module: str):
    return importlib.import_module(module)


def kernel_config(impl: str) -> str:
    """What ran under a peer's name, for its rows' ``kernel_config``: the function and the versions."""
    return f"{PEERS[impl].call} ({version_text(versions()[impl])})"


# --- upstream-fa --------------------------------------------------------------------------------------------


def to_bnhd(t):
    """A [B, H, N, d] tensor copied into [B, N, H, d] (contiguous): the layout of ``BNHD`` peers."""
    return t.transpose(1, 2).contiguous()


def from_bnhd(t):
    """A [B, N, H, d] result seen as [B, H, N, d] (a view)."""
    return t.transpose(1, 2)


def upstream_fa(q, k, v, causal: bool):
    """FlashAttention's own forward on [B, N, H, d] tensors (grouped-query K/V: fewer heads); its output. The
    backward is its own too, through autograd. Raises ``TypeError``/``ValueError``/``NotImplementedError`` for
    what it does not run (module docstring), before calling it."""
    import torch

    if q.dtype not in (torch.float16, torch.bfloat16) or not q.dtype == k.dtype == v.dtype:
        raise TypeError(
            f"upstream-fa runs float16 or bfloat16 inputs of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    d = q.shape[-1]
    if not (8 <= d <= 256 and d % 8 == 0):
        raise ValueError(f"upstream-fa runs head dims 8-256 in multiples of 8, got {d}")
    if q.device.type != "cuda":
        raise ValueError(f"upstream-fa runs on CUDA GPUs, got device {q.device}")
    major, _ = torch.cuda.get_device_capability(q.device)
    if major < 8:
        raise NotImplementedError(f"upstream-fa runs on sm_80 and newer, this GPU is sm_{major}x")
    if major < 9 and any(t.requires_grad for t in (q, k, v)):
        raise NotImplementedError("upstream-fa's backward runs on sm_90 and newer")
    from flash_attn.cute import flash_attn_func

    out = flash_attn_func(q, k, v, causal=causal)
    return out[0] if isinstance(out, tuple) else out


# --- cudnn-fp8 ----------------------------------------------------------------------------------------------

_SCALARS = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")
_GRAPHS: dict[tuple, tuple] = {}  # (Q shape, K shape, causal, device) → (graph, its tensors, workspace)
_HANDLES: dict[int, object] = {}  # device index → cuDNN handle


def _strides(shape) -> tuple[int, ...]:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


def _handle(device):
    import cudnn
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _HANDLES:
        _HANDLES[index] = cudnn.create_handle()
    handle = _HANDLES[index]
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(device).cuda_stream)
    return handle


def _graph(q_shape, k_shape, causal: bool, device) -> tuple:
    """The ``sdpa_fp8`` graph of one shape, built and planned once (as cuDNN's own tests build it: e4m3 Q, K,
    V and O in [B, H, N, d], fp32 scalars, Amax_S left virtual, Amax_O an output)."""
    import cudnn
    import torch

    key = (tuple(q_shape), tuple(k_shape), bool(causal), str(device))
    if key in _GRAPHS:
        return _GRAPHS[key]
    e4m3, fp32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
    graph = cudnn.pygraph(
        io_data_type=e4m3, intermediate_data_type=fp32, compute_data_type=fp32, handle=_handle(device)
    )
    q = graph.tensor(name="q", dim=tuple(q_shape), stride=_strides(q_shape), data_type=e4m3)
    k = graph.tensor(name="k", dim=tuple(k_shape), stride=_strides(k_shape), data_type=e4m3)
    v = graph.tensor(name="v", dim=tuple(k_shape), stride=_strides(k_shape), data_type=e4m3)
    scalar = dict(dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=fp32)
    s = {name: graph.tensor(name=name, **scalar) for name in _SCALARS}
    o, _, _, amax_o = graph.sdpa_fp8(
        q=q,
        k=k,
        v=v,
        **s,
        generate_stats=False,
        attn_scale=1.0 / math.sqrt(q_shape[-1]),
        use_causal_mask=bool(causal),
    )
    o.set_output(True).set_dim(tuple(q_shape)).set_stride(_strides(q_shape)).set_data_type(e4m3)
    amax_o.set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(fp32)
    try:
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans()
    except cudnn.cudnnGraphNotSupportedError as exc:  # this GPU or shape: an unsupported row, not an error
        raise NotImplementedError(f"cuDNN does not support this FP8 attention graph: {exc}") from None
    workspace = torch.empty(max(1, graph.get_workspace_size()), dtype=torch.uint8, device=device)
    _GRAPHS[key] = (graph, {"q": q, "k": k, "v": v, "o": o, "amax_o": amax_o, **s}, workspace)
    return _GRAPHS[key]


def output_scale(v_descale: float) -> float:
    """The e4m3 output's scale: the largest power of two that keeps |O| ≤ max|V| (O is a convex combination
    of V's rows) inside e4m3's ±448: 2^⌊log2(448 / max|V|)⌋ with max|V| = 448 · V's per-tensor descale."""
    return 2.0 ** math.floor(math.log2(1.0 / v_descale)) if v_descale > 0 else 1.0


class CudnnFP8:
    """cuDNN's FP8 attention forward on e4m3 [B, H, N, d] Q, K, V and their per-tensor descales (0-dim float32
    tensors, ``x ≈ x8 · descale``); calling it runs the graph and returns the e4m3 output, which is
    ``O · scale_o`` (``out_scale``). Raises ``TypeError`` on a GPU without FP8 tensor cores and
    ``NotImplementedError`` for a graph cuDNN does not support (both: ``unsupported`` rows)."""

    def __init__(self, q8, k8, v8, q_descale, k_descale, v_descale, causal: bool):
        import torch

        major, minor = torch.cuda.get_device_capability(q8.device)
        if (major, minor) < (8, 9):
            raise TypeError(f"cudnn-fp8 needs FP8 tensor cores (sm_89 and newer), this GPU is sm_{major}{minor}")
        if q8.dtype != torch.float8_e4m3fn or k8.dtype != q8.dtype or v8.dtype != q8.dtype:
            raise TypeError(f"cudnn-fp8 takes e4m3 Q, K, V, got {q8.dtype}, {k8.dtype}, {v8.dtype}")
        self.graph, self.tensors, self.workspace = _graph(q8.shape, k8.shape, causal, q8.device)
        self.handle = _handle(q8.device)
        self.out_scale = output_scale(float(v_descale))
        self.out = torch.empty_like(q8)
        one = lambda x: torch.full((1, 1, 1, 1), float(x), dtype=torch.float32, device=q8.device)  # noqa: E731
        t = self.tensors
        self.pack = {
            t["q"]: q8.contiguous(),
            t["k"]: k8.contiguous(),
            t["v"]: v8.contiguous(),
            t["descale_q"]: one(q_descale),
            t["descale_k"]: one(k_descale),
            t["descale_v"]: one(v_descale),
            t["descale_s"]: one(1.0 / P_SCALE),
            t["scale_s"]: one(P_SCALE),
            t["scale_o"]: one(self.out_scale),
            t["o"]: self.out,
            t["amax_o"]: one(0.0),
        }

    def __call__(self):
        self.graph.execute(self.pack, self.workspace, handle=self.handle)
        return self.out
