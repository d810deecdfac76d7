"""FlashAttention-2 in Triton: the forward kernel, and a backward pass that recomputes P.

What it is: exact softmax attention ``softmax(Q Kᵀ · sm_scale) V`` computed tile by tile, following the
FlashAttention-2 paper's loop order: one program per (block of BLOCK_M query rows, batch·head); the
program keeps its Q tile, an fp32 output accumulator and the running row max ``m`` and row sum ``ℓ`` on
chip, streams K and V through in BLOCK_N-row tiles, and never writes an N×N matrix. The softmax is the
online one: scores are kept in the log2 domain (``exp2`` is the native instruction), the accumulator is
rescaled by ``exp2(m_old - m_new)`` when the max grows, and the division by ℓ is deferred to the very end
("lazy rescaling": no division inside the loop). The row logsumexp (natural log) is written out for a
backward pass.

Causal masking is aligned to the bottom-right corner when seqlen_q ≠ seqlen_k, as in FlashAttention ≥ 2.1:
query row i sees key j iff ``j <= i + seqlen_k - seqlen_q``. K/V tiles that are fully masked for a Q tile
are never loaded; tiles fully visible run an unmasked loop and only the tiles crossing the diagonal or
the sequence end run the masked one. Query rows that see no key at all (possible only when
seqlen_q > seqlen_k) produce zeros and a logsumexp of -inf.

Handles: any seqlen (masked tails), seqlen_q ≠ seqlen_k, head dims 1…256 (padded inside the kernel to a
power of two ≥ 16; the padded lanes are masked, never read from memory), float16 and bfloat16 on the
GPU, float32 as an exact (IEEE, not TF32) teaching/testing mode, ``[batch, heads, seq, head_dim]``
tensors with arbitrary strides. Backward (``backward``, and autograd through ``attention``): the FA-2
paper's recomputation from the saved logsumexp, as two deterministic passes (dK/dV per key block, dQ
per query block, no atomics), with one fixed tile configuration so far (not yet tuned or timed on a
GPU). Grouped-query and multi-query attention: K/V may have fewer heads than Q, as long as they divide
them (query head h reads K/V head h // (H / H_kv)). Does not handle: dropout, attention bias, packed
varlen.

Tested: in Triton's interpreter on CPU (float16, float32; odd shapes: tests/kernels/test_fa2_forward.py)
and on an NVIDIA H200 with Triton 3.6 (float16, bfloat16, d = 64 … 256, N = 512 … 65536: every benchmark
point of the pipeline is checked against float64 before it is timed).

Layers: the ``@triton.jit`` kernels (forward, then backward) are in ``fa2_kernels.py``; here, top to
bottom: configuration (dataclass, factory, pruning, env pin); the launchers ``forward`` and ``backward``
(checks, allocation, grid); the ``autograd.Function``; the public function ``attention``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

import torch
import triton

from kernels._runtime import INTERPRET, check_device, softmax_scale
from kernels.attention.fa2_kernels import (
    _attn_bwd_dkdv_kernel,
    _attn_bwd_dq_kernel,
    _attn_fwd_inner,  # noqa: F401  (decode.py imports it from here)
    _attn_fwd_kernel,
    _fwd_heuristic_kernel,
)

__all__ = ["FA2Config", "attention", "forward", "backward", "default_configs", "last_config", "MAX_HEAD_DIM"]

MAX_HEAD_DIM = 256
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_LOG2E = 1.4426950408889634


# ---------------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------------

CONFIG_ENV = "KERNELS_FA2_CONFIG"


@dataclasses.dataclass(frozen=True)
class FA2Config:
    """One launch configuration: tile sizes and the compiler's warps and pipeline depth."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def to_triton(self) -> triton.Config:
        return triton.Config(
            {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n},
            num_warps=self.num_warps,
            num_stages=self.num_stages,
        )

    def __str__(self) -> str:
        return f"BLOCK_M={self.block_m},BLOCK_N={self.block_n},num_warps={self.num_warps},num_stages={self.num_stages}"

    @classmethod
    def parse(cls, text: str) -> FA2Config:
        """Parse ``BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=3`` (the form ``str`` prints)."""
        fields = {"BLOCK_M": "block_m", "BLOCK_N": "block_n", "num_warps": "num_warps", "num_stages": "num_stages"}
        values = {}
        for part in text.split(","):
            name, _, value = part.strip().partition("=")
            if name not in fields or not value.strip().isdigit():
                raise ValueError(f"cannot parse FA-2 config {text!r}: expected {str(cls(128, 64, 8, 3))!r}")
            values[fields[name]] = int(value)
        if set(values) != set(fields.values()):
            raise ValueError(f"FA-2 config {text!r} must set all of {list(fields)}")
        return cls(**values)

    @classmethod
    def from_triton(cls, cfg: triton.Config) -> FA2Config:
        return cls(cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.num_warps, cfg.num_stages)


def default_configs() -> list[FA2Config]:
    """The autotuning space.

    On a GPU: 128-row Q tiles with 8 warps (two warpgroups, Hopper's wgmma shape) won at head dim 128
    on an H200 (block sweep, Triton 3.6: 128×64 or 128×128 with 3–4 stages, 4 warps at half speed);
    at head dim 64 four warps also do; 64-row tiles keep head dim 256 within registers and shared
    memory and suit GPUs with less shared memory. The pruning filter drops what cannot fit the shape
    or the device. Triton's automatic warp specialisation gave no gain there and failed to compile
    with 4 warps, so it is not in the space.
    In the interpreter, small tiles keep the CPU run short while still crossing several tiles.
    """
    if INTERPRET:
        return [FA2Config(32, 16, 4, 1)]
    return [
        FA2Config(128, 128, 8, 3),
        FA2Config(128, 64, 8, 3),
        FA2Config(128, 64, 8, 4),
        FA2Config(128, 64, 4, 3),
        FA2Config(128, 128, 4, 3),
        FA2Config(64, 64, 4, 3),
        FA2Config(64, 32, 4, 2),
    ]


def _shared_mem_limit(device: torch.device) -> int:
    if device.type != "cuda":
        return 1 << 30
    props = triton.runtime.driver.active.utils.get_device_properties(device.index or 0)
    return int(props["max_shared_mem"])


def _fits(cfg: FA2Config, block_d: int, elem_bytes: int, smem_limit: int) -> bool:
    # Q tile once, K and V tiles once per pipeline stage; registers: the fp32 accumulator
    # (BLOCK_M × BLOCK_D) spread over the program's threads must leave room for Q, P and addresses.
    smem = (cfg.block_m * block_d + 2 * cfg.num_stages * cfg.block_n * block_d) * elem_bytes
    acc_regs_per_thread = cfg.block_m * block_d // (32 * cfg.num_warps)
    return smem <= smem_limit and acc_regs_per_thread <= 128


def _prune(configs, named_args, **kwargs):
    q = named_args["Q"]
    block_d = kwargs.get("BLOCK_D", named_args.get("BLOCK_D"))
    limit = _shared_mem_limit(q.device)
    seq_cap = max(16, triton.next_power_of_2(named_args["seqlen_q"]))
    kept = []
    for c in configs:
        cfg = FA2Config.from_triton(c)
        if cfg.block_m > seq_cap and cfg.block_m > 64:
            continue
        if _fits(cfg, block_d, q.element_size(), limit):
            kept.append(c)
    # never leave the tuner empty: the smallest tile always compiles
    return kept or [min(configs, key=lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"])]


def _bench_for_tuning(fn, quantiles):
    # shorter than do_bench's defaults: tuning is a ranking, the harness does the careful timing
    return triton.testing.do_bench(fn, warmup=10, rep=40, quantiles=quantiles)


_TUNERS: dict[tuple, object] = {}
_CHOSEN: dict[tuple, FA2Config] = {}  # (configs, device, dtype, shape, causal) -> tuned choice
_LAST_CONFIG: list[FA2Config | None] = [None]


def _tuner(configs: tuple[FA2Config, ...]):
    """An autotuned kernel over ``configs`` (cached: each tuner keeps its own per-shape choices)."""
    if configs not in _TUNERS:
        _TUNERS[configs] = triton.autotune(
            configs=[c.to_triton() for c in configs],
            key=["seqlen_q", "seqlen_k", "HEAD_DIM", "IS_CAUSAL"],  # dtypes are part of the key too
            prune_configs_by={"early_config_prune": _prune},
            do_bench=_bench_for_tuning,
        )(_fwd_heuristic_kernel)
    return _TUNERS[configs]


def _configs_in_effect(config: FA2Config | None) -> tuple[FA2Config, ...]:
    if config is not None:
        return (config,)
    pinned = os.environ.get(CONFIG_ENV, "").strip()
    if pinned:
        return (FA2Config.parse(pinned),)
    return tuple(default_configs())


def last_config() -> FA2Config | None:
    """The configuration the most recent ``forward`` call ran with (chosen by the tuner or pinned)."""
    return _LAST_CONFIG[0]


# ---------------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------------


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be [batch, heads, seq, head_dim], got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; supported: float16, bfloat16, float32")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    check_device(q, k, v, names=("q", "k", "v"))
    b, h, _, d = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k/v shape {tuple(k.shape)} does not match q {tuple(q.shape)} in batch or head_dim")
    if (k.shape[1] == 0 and h != 0) or (k.shape[1] and h % k.shape[1]):
        raise ValueError(
            f"k/v have {k.shape[1]} heads, which must divide q's {h} (grouped-query / multi-query attention)"
        )
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim {d} is not supported: this kernel handles 1 to {MAX_HEAD_DIM}")
    if q.dtype == torch.bfloat16 and q.device.type == "cpu":
        # Triton's interpreter mis-computes tl.dot on bfloat16 (triton-lang/triton#11584)
        raise TypeError("bfloat16 is not supported in Triton's interpreter (wrong tl.dot results); use float16")
    if q.dtype == torch.bfloat16 and q.device.type == "cuda" and torch.cuda.get_device_capability(q.device)[0] < 8:
        raise TypeError("bfloat16 needs a GPU of compute capability 8.0 or newer")


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    *,
    config: FA2Config | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward kernel. Returns ``(out [B, H, Nq, d], lse [B, H, Nq] float32)``.

    ``config`` pins one configuration (as does the environment variable ``KERNELS_FA2_CONFIG``);
    otherwise the autotuner picks per shape and dtype. ``last_config()`` reports what ran.
    """
    _check_inputs(q, k, v)
    b, h, seqlen_q, d = q.shape
    seqlen_k = k.shape[2]
    sm_scale = softmax_scale(d, sm_scale)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((b, h, seqlen_q), device=q.device, dtype=torch.float32)
    if out.numel() == 0:
        lse.fill_(float("-inf"))
        return out.zero_(), lse
    if seqlen_k == 0:  # no keys: every row sees nothing
        lse.fill_(float("-inf"))
        return out.zero_(), lse

    block_d = max(16, triton.next_power_of_2(d))
    args = (
        q, k, v, out, lse,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        h, h // k.shape[1], seqlen_q, seqlen_k, float(sm_scale),
    )  # fmt: skip
    constants = dict(HEAD_DIM=d, BLOCK_D=block_d, IS_CAUSAL=bool(causal), IS_FP32=q.dtype == torch.float32,
                     EVEN_D=d == block_d)  # fmt: skip
    configs = _configs_in_effect(config)
    key = (configs, q.device, q.dtype, seqlen_q, seqlen_k, d, bool(causal))
    chosen = _CHOSEN.get(key) or (configs[0] if len(configs) == 1 else None)
    switch = q.device.type == "cuda" and q.device.index not in (None, torch.cuda.current_device())
    with torch.cuda.device(q.device) if switch else contextlib.nullcontext():
        if chosen is None:
            # first call for this shape: Triton's autotuner times the candidates, then runs the best
            tuner = _tuner(configs)
            tuner[lambda meta: (triton.cdiv(seqlen_q, meta["BLOCK_M"]), b * h)](*args, **constants)
            chosen = _CHOSEN[key] = FA2Config.from_triton(tuner.best_config)
        else:
            # later calls launch the chosen configuration directly: the autotuner's per-call
            # bookkeeping cost tens of microseconds, as much as the kernel itself at small sizes
            _attn_fwd_kernel[(triton.cdiv(seqlen_q, chosen.block_m), b * h)](
                *args, **constants,
                EVEN_M=seqlen_q % chosen.block_m == 0, EVEN_N=seqlen_k % chosen.block_n == 0,
                BLOCK_M=chosen.block_m, BLOCK_N=chosen.block_n,
                num_warps=chosen.num_warps, num_stages=chosen.num_stages,
            )  # fmt: skip
    _LAST_CONFIG[0] = chosen
    return out, lse


BWD_CONFIG_INTERPRET = FA2Config(16, 16, 4, 1)
BWD_CONFIG = FA2Config(64, 64, 4, 2)


def backward(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    *,
    dkdv_config: FA2Config | None = None,
    dq_config: FA2Config | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of ``attention`` from the forward's output and logsumexp.

    P is recomputed tile by tile from Q, K and the logsumexp (no N×N tensor is stored or written).
    Two deterministic passes: one program per key block accumulates dK and dV over the query blocks
    that see it, one program per query block accumulates dQ; no atomics. One fixed tile configuration
    for now (64×64, 4 warps; 16×16 in the interpreter): correctness first, tuning comes with its benchmark.
    """
    _check_inputs(q, k, v)
    b, h, seqlen_q, d = q.shape
    seqlen_k = k.shape[2]
    if do.shape != q.shape:
        raise ValueError(f"grad_out has shape {tuple(do.shape)}, expected {tuple(q.shape)}")
    sm_scale = softmax_scale(d, sm_scale)
    dq = torch.zeros(q.shape, device=q.device, dtype=q.dtype)
    dk = torch.zeros(k.shape, device=k.device, dtype=k.dtype)
    dv = torch.zeros(v.shape, device=v.device, dtype=v.dtype)
    if q.numel() == 0 or k.numel() == 0:
        return dq, dk, dv
    do = do.to(q.dtype)
    # Δ_i = Σ_j dO_ij · O_ij (= Σ_j P_ij dP_ij): one O(N·d) pass, done in fp32
    delta = (do.float() * out.float()).sum(-1).contiguous()
    lse = lse.contiguous()
    default = BWD_CONFIG_INTERPRET if INTERPRET else BWD_CONFIG
    c1, c2 = dkdv_config or default, dq_config or default
    block_d = max(16, triton.next_power_of_2(d))
    common = (
        *q.stride(), *k.stride(), *v.stride(), *do.stride(),
    )  # fmt: skip
    constants = dict(HEAD_DIM=d, BLOCK_D=block_d, IS_CAUSAL=bool(causal), IS_FP32=q.dtype == torch.float32)
    switch = q.device.type == "cuda" and q.device.index not in (None, torch.cuda.current_device())
    with torch.cuda.device(q.device) if switch else contextlib.nullcontext():
        hk = k.shape[1]
        _attn_bwd_dkdv_kernel[(triton.cdiv(seqlen_k, c1.block_n), b * hk)](
            q, k, v, do, lse, delta, dk, dv, *common, *dk.stride(),
            h, hk, h // hk, seqlen_q, seqlen_k, float(sm_scale), **constants,
            BLOCK_M=c1.block_m, BLOCK_N=c1.block_n, num_warps=c1.num_warps, num_stages=c1.num_stages,
        )  # fmt: skip
        _attn_bwd_dq_kernel[(triton.cdiv(seqlen_q, c2.block_m), b * h)](
            q, k, v, do, lse, delta, dq, *common, *dq.stride(),
            h, h // hk, seqlen_q, seqlen_k, float(sm_scale), **constants,
            BLOCK_M=c2.block_m, BLOCK_N=c2.block_n, num_warps=c2.num_warps, num_stages=c2.num_stages,
        )  # fmt: skip
    return dq, dk, dv


class _FlashAttention2(torch.autograd.Function):
    """Forward with the tuned kernel; backward recomputes P from the saved logsumexp."""

    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale):
        out, lse = forward(q, k, v, causal=causal, sm_scale=sm_scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.sm_scale = causal, sm_scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = backward(grad_out, q, k, v, out, lse, ctx.causal, ctx.sm_scale)
        return dq, dk, dv, None, None


# ---------------------------------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------------------------------


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """FlashAttention-2 forward: ``softmax(q kᵀ · sm_scale [+ causal mask]) v``.

    Args:
        q: ``[B, H, Nq, d]``; k, v: ``[B, H_kv, Nk, d]`` with H_kv dividing H (grouped-query);
            float16 or bfloat16 (float32 runs in exact IEEE mode, slowly). Any strides. 1 ≤ d ≤ 256.
        causal: mask keys after the query, aligned to the bottom-right corner when Nq ≠ Nk.
        sm_scale: score scale, default ``1/sqrt(d)``.

    Returns: ``[B, H, Nq, d]`` in the input dtype.

    Differentiable: the backward pass (``backward``) recomputes P from the saved logsumexp.
    Raises ``TypeError``/``ValueError`` for unsupported dtypes, devices, shapes or head dims.
    """
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v)):
        return _FlashAttention2.apply(q, k, v, causal, sm_scale)
    out, _ = forward(q, k, v, causal=causal, sm_scale=sm_scale)
    return out
