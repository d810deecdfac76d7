"""FlashAttention-2 in Triton: exact attention computed tile by tile, and a backward pass that recomputes P.

The FA-2 paper's loop order: one program per (BLOCK_M query rows, batch·head) keeps its Q tile, an fp32
accumulator and the running row max and sum on chip while K and V stream through in BLOCK_N-row tiles, so
no N×N matrix is ever written. The online softmax runs in the log2 domain and divides by ℓ once, at the end
(``rescale="eager"``: FA-1's division at every tile, for the ablation); the row logsumexp is written for the
backward, which recomputes P from it in two deterministic passes (dK/dV per key block, dQ per query block).
Causal masks are aligned bottom-right (query i sees key j iff j <= i + Nk - Nq): tiles hidden from a whole
Q tile are skipped, and only tiles crossing the diagonal or a sequence end run the masked loop.

Handles: any lengths, Nq ≠ Nk, head dims 1…256, float16 and bfloat16 on a GPU, exact float32, any strides,
grouped-query K/V heads, variable-length batches packed end to end (``attention_varlen``). Does not handle:
dropout, attention bias, paged KV. Tested in the interpreter (tests/kernels/test_fa2_*.py) and on an H200
(the pipeline checks every point against float64 before timing it). Kernels in ``fa2_kernels.py``, tiles
and the tuner in ``fa2_config.py``; here the launchers, the ``autograd.Function``s and the public functions.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch
import triton

from kernels._runtime import check_bf16, check_flag, check_int, device_guard, host_values, softmax_scale
from kernels.attention import fa2_config
from kernels.attention.common import MAX_HEAD_DIM, check_dense, check_grad_shapes, check_tensors
from kernels.attention.fa2_config import (  # noqa: F401  (part of fa2's interface: fa2.FA2Config, fa2.CONFIG_ENV, ...)
    BWD_CONFIG_ENV,
    CONFIG_ENV,
    FA2BwdConfig,
    FA2Config,
    bwd_configs_in_effect,
    configs_in_effect,
    default_bwd_configs,
    default_configs,
    gpu_bwd_configs,
)
from kernels.attention.fa2_kernels import (
    _attn_bwd_delta_kernel,
    _attn_bwd_dkdv_kernel,
    _attn_bwd_dq_kernel,
    _attn_fwd_kernel,
)

__all__ = [
    "FA2Config",
    "FA2BwdConfig",
    "attention",
    "attention_varlen",
    "forward",
    "forward_kernel",
    "forward_varlen",
    "backward",
    "backward_varlen",
    "default_configs",
    "default_bwd_configs",
    "gpu_bwd_configs",
    "last_config",
    "last_bwd_config",
    "MAX_HEAD_DIM",
]


# ---------------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------------


# What the launchers ran: the tuner's choice per shape (launched directly after the first call) and the
# configurations of the most recent forward and backward.
_CHOSEN: dict[tuple, FA2Config] = {}  # (configs, device, dtype, shape, causal, eager, varlen) -> tuned choice
_LAST_CONFIG: list[FA2Config | None] = [None]
_LAST_BWD_CONFIG: list[FA2BwdConfig | None] = [None]


def last_config() -> FA2Config | None:
    """The configuration the most recent ``forward`` call ran with (chosen by the tuner or pinned)."""
    return _LAST_CONFIG[0]


def last_bwd_config() -> FA2BwdConfig | None:
    """The (dK/dV, dQ) configurations the most recent ``backward`` ran with; ``str`` gives the env form."""
    return _LAST_BWD_CONFIG[0]


RESCALE_MODES = ("lazy", "eager")


def _eager_rescale(rescale: str) -> bool:
    if rescale not in RESCALE_MODES:
        raise ValueError(f"rescale must be one of {RESCALE_MODES}, got {rescale!r}")
    return rescale == "eager"


@dataclasses.dataclass(frozen=True)
class _Packing:
    """A validated variable-length batch: offsets (int32, contiguous, on q's device) and longest lengths."""

    cu_q: torch.Tensor
    cu_k: torch.Tensor
    batch: int
    max_q: int
    max_k: int


def _check_offsets(name: str, cu, total: int, tokens: str, device: torch.device) -> tuple[int, ...]:
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int32 offsets, got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must have dtype torch.int32, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() == 0:
        raise ValueError(f"{name} must be 1-D with batch + 1 entries, got shape {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"{name} is on {cu.device} but q is on {device}; put the offsets on q's device")
    values = host_values(cu)
    if values[0] != 0:
        raise ValueError(f"{name} must start at 0, got {values[0]}")
    for i in range(1, len(values)):
        if values[i] < values[i - 1]:
            raise ValueError(
                f"{name} must be non-decreasing: {name}[{i}] = {values[i]} < {name}[{i - 1}] = {values[i - 1]}"
            )
    if values[-1] != total:
        raise ValueError(f"{name} ends at {values[-1]}, but {tokens} has {total} tokens (its dim 0)")
    return values


def _check_max(name: str, given, longest: int, total: int) -> int:
    """The longest sequence the grid is sized for: ``longest`` by default; a given bound must be an int of at
    least ``longest``, and is used up to ``total`` only: no sequence is longer than all the tokens, and the
    programs past them would only return at once (a static bound of 10**7 for 10 tokens launched 10**7 rows'
    worth, minutes in the interpreter)."""
    if given is None:
        return longest
    try:
        given = check_int(name, given)
    except TypeError:
        raise TypeError(f"{name} must be an int or None, got {type(given).__name__}") from None
    if given < longest:
        raise ValueError(f"{name}={given} is shorter than the longest sequence in the batch ({longest})")
    return min(given, total)


def _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) -> _Packing:
    check_tensors(q, k, v, 3, "[total_tokens, heads, head_dim]")
    check_bf16(q.dtype, q.device, "q")
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"k/v shape {tuple(k.shape)} does not match q {tuple(q.shape)} in head_dim")
    offs_q = _check_offsets("cu_seqlens_q", cu_seqlens_q, q.shape[0], "q", q.device)
    offs_k = _check_offsets("cu_seqlens_k", cu_seqlens_k, k.shape[0], "k", q.device)
    if len(offs_q) != len(offs_k):
        raise ValueError(
            f"cu_seqlens_q and cu_seqlens_k must both have batch + 1 entries, got {len(offs_q)} and {len(offs_k)}"
        )
    longest_q = max((b - a for a, b in itertools.pairwise(offs_q)), default=0)
    longest_k = max((b - a for a, b in itertools.pairwise(offs_k)), default=0)
    return _Packing(
        cu_seqlens_q.contiguous(),
        cu_seqlens_k.contiguous(),
        len(offs_q) - 1,
        _check_max("max_seqlen_q", max_seqlen_q, longest_q, q.shape[0]),
        _check_max("max_seqlen_k", max_seqlen_k, longest_k, k.shape[0]),
    )


def _packed_strides(t: torch.Tensor) -> tuple[int, int, int, int]:
    """A packed ``[tokens, heads, d]`` tensor's strides in the kernels' (batch, head, row, dim) order:
    the batch stride is 0, each program finds its sequence's first token from cu_seqlens."""
    return 0, t.stride(1), t.stride(0), t.stride(2)


def _launch_forward(
    q,
    k,
    v,
    out,
    lse,
    cu_q,
    cu_k,
    *,
    strides,
    batch,
    heads,
    kv_heads,
    seqlen_q,
    seqlen_k,
    head_dim,
    causal,
    sm_scale,
    config,
    eager,
    varlen,
) -> FA2Config:
    """The forward kernel, tuned on a shape's first call and launched directly after. ``strides``: of q, k,
    v and out in (batch, head, row, dim) order; varlen: ``seqlen_q``/``seqlen_k`` are the longest, and
    ``lse`` is ``[H, total_q]`` (dense: ``[B, H, Nq]``, both contiguous)."""
    lse_strides = (0, lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1))
    block_d = max(16, triton.next_power_of_2(head_dim))
    args = (
        q,
        k,
        v,
        out,
        lse,
        cu_q,
        cu_k,
        *(s for t in strides for s in t),
        *lse_strides,
        heads,
        heads // kv_heads,
        seqlen_q,
        seqlen_k,
        float(sm_scale),
    )
    constants = dict(
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        IS_CAUSAL=causal,
        IS_FP32=q.dtype == torch.float32,
        IS_VARLEN=varlen,
        EAGER_RESCALE=eager,
        EVEN_D=head_dim == block_d,
    )
    configs = configs_in_effect(config)
    key = (configs, q.device, q.dtype, seqlen_q, seqlen_k, head_dim, causal, eager, varlen)
    chosen = _CHOSEN.get(key) or (configs[0] if len(configs) == 1 else None)
    with device_guard(q):
        if chosen is None:
            # first call for this shape: Triton's autotuner times the candidates, then runs the best
            tuner = fa2_config.tuner(configs)
            tuner[lambda meta: (triton.cdiv(seqlen_q, meta["BLOCK_M"]), batch * heads)](*args, **constants)
            chosen = _CHOSEN[key] = FA2Config.from_triton(tuner.best_config)
        else:
            # later calls launch the chosen configuration directly: the autotuner's per-call
            # bookkeeping cost tens of microseconds, as much as the kernel itself at small sizes
            _attn_fwd_kernel[(triton.cdiv(seqlen_q, chosen.block_m), batch * heads)](
                *args,
                **constants,
                EVEN_M=not varlen and seqlen_q % chosen.block_m == 0,
                EVEN_N=not varlen and seqlen_k % chosen.block_n == 0,
                BLOCK_M=chosen.block_m,
                BLOCK_N=chosen.block_n,
                num_warps=chosen.num_warps,
                num_stages=chosen.num_stages,
            )
    return chosen


def forward_kernel():
    """The ``@triton.jit`` forward kernel the launcher runs (the tuner wraps it), also for compiling it for a
    target without a GPU (the compiled family)."""
    return _attn_fwd_kernel


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    *,
    config: FA2Config | None = None,
    rescale: str = "lazy",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward kernel. Returns ``(out [B, H, Nq, d], lse [B, H, Nq] float32)``.

    ``config`` pins one configuration (as does the environment variable ``KERNELS_FA2_CONFIG``);
    otherwise the autotuner picks per shape and dtype. ``last_config()`` reports what ran.

    ``rescale``: ``"lazy"`` (FA-2, the default) keeps the output accumulator unnormalised and divides by
    the row sum ℓ once at the end; ``"eager"`` (the ablation) divides the running output by ℓ after every
    K/V tile, un-normalising it before the next tile's P·V is added, as FlashAttention-1 does. Both give
    the same attention up to rounding; eager costs an extra multiply and a division per tile.

    A query row that sees no key (causal, Nq > Nk) gives zeros and a logsumexp of -inf.
    """
    eager = _eager_rescale(rescale)
    causal = check_flag("causal", causal)
    check_dense(q, k, v)
    b, h, seqlen_q, d = q.shape
    seqlen_k = k.shape[2]
    sm_scale = softmax_scale(d, sm_scale)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((b, h, seqlen_q), device=q.device, dtype=torch.float32)
    if out.numel() == 0 or seqlen_k == 0:  # nothing to compute, or no keys: every row sees nothing
        lse.fill_(float("-inf"))
        return out.zero_(), lse
    _LAST_CONFIG[0] = _launch_forward(
        q,
        k,
        v,
        out,
        lse,
        None,
        None,
        strides=(q.stride(), k.stride(), v.stride(), out.stride()),
        batch=b,
        heads=h,
        kv_heads=k.shape[1],
        seqlen_q=seqlen_q,
        seqlen_k=seqlen_k,
        head_dim=d,
        causal=bool(causal),
        sm_scale=sm_scale,
        config=config,
        eager=eager,
        varlen=False,
    )
    return out, lse


def _forward_packed(q, k, v, packing: _Packing, causal, sm_scale, config, eager):
    total_q, h, d = q.shape
    out = torch.empty((total_q, h, d), device=q.device, dtype=q.dtype)
    lse = torch.empty((h, total_q), device=q.device, dtype=torch.float32)
    if out.numel() == 0 or k.shape[0] == 0:  # no query token, or no key in any sequence
        lse.fill_(float("-inf"))
        return out.zero_(), lse
    _LAST_CONFIG[0] = _launch_forward(
        q,
        k,
        v,
        out,
        lse,
        packing.cu_q,
        packing.cu_k,
        strides=[_packed_strides(t) for t in (q, k, v, out)],
        batch=packing.batch,
        heads=h,
        kv_heads=k.shape[1],
        seqlen_q=packing.max_q,
        seqlen_k=packing.max_k,
        head_dim=d,
        causal=bool(causal),
        sm_scale=sm_scale,
        config=config,
        eager=eager,
        varlen=True,
    )
    return out, lse


def forward_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    causal: bool = False,
    sm_scale: float | None = None,
    *,
    config: FA2Config | None = None,
    rescale: str = "lazy",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward kernel on packed sequences. Returns ``(out [total_q, H, d], lse [H, total_q] float32)``.

    Arguments as ``attention_varlen``; ``config`` and ``rescale`` as ``forward``. A sequence with no key
    gives zeros and a logsumexp of -inf, as a row that sees no key does in the dense layout.
    """
    eager = _eager_rescale(rescale)
    causal = check_flag("causal", causal)
    packing = _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    sm_scale = softmax_scale(q.shape[2], sm_scale)
    return _forward_packed(q, k, v, packing, causal, sm_scale, config, eager)


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

    Deterministic: two passes and no atomics. A small preprocess kernel computes Δ_i = Σ_j dO_ij·O_ij
    (fp32 accumulation, no fp32 copies of O or dO); then one program per key block accumulates dK and dV
    over the query tiles that see it (summing a K/V head's query-head group in a fixed order), and one
    program per query block accumulates dQ. P is recomputed tile by tile from Q, K and the logsumexp: no
    N×N tensor is stored. In both passes tiles that every row sees whole run a loop without masks; only
    tiles crossing the causal diagonal or a sequence end run the masked one.

    Tiles: ``dkdv_config`` / ``dq_config`` pin a pass; otherwise ``KERNELS_FA2_BWD_CONFIG``
    (``FA2BwdConfig`` form), otherwise ``default_bwd_configs`` (an H200 sweep's best per head dim, with
    smaller tiles where they do not fit). ``last_bwd_config()`` reports what ran. Returns tensors in the
    input dtype, contiguous, shaped like q, k, v.
    """
    causal = check_flag("causal", causal)
    check_dense(q, k, v)
    b, h, seqlen_q, d = q.shape
    check_grad_shapes(do, out, lse, q.shape, (b, h, seqlen_q), q)
    sm_scale = softmax_scale(d, sm_scale)
    configs = bwd_configs_in_effect(d, causal, q, dkdv_config, dq_config)
    _LAST_BWD_CONFIG[0] = configs
    if q.numel() == 0 or k.numel() == 0:
        # nothing to launch: the gradients of an empty side, or of rows that see no key, are zeros
        return tuple(torch.zeros(t.shape, device=t.device, dtype=t.dtype) for t in (q, k, v))
    do = do.to(q.dtype)
    # the kernels write every element of these (a query row that sees no key gets an explicit 0)
    dq, dk, dv = (torch.empty(t.shape, device=t.device, dtype=t.dtype) for t in (q, k, v))
    lse = lse.contiguous()
    _launch_backward(
        do,
        q,
        k,
        v,
        out,
        lse,
        dq,
        dk,
        dv,
        None,
        None,
        strides=[t.stride() for t in (q, k, v, do, out, dq, dk)],
        lse_strides=(lse.stride(0), lse.stride(1)),
        delta_rows=(b, seqlen_q),
        batch=b,
        heads=h,
        kv_heads=k.shape[1],
        seqlen_q=seqlen_q,
        seqlen_k=k.shape[2],
        head_dim=d,
        causal=bool(causal),
        sm_scale=sm_scale,
        configs=configs,
        varlen=False,
    )
    return dq, dk, dv


def _backward_packed(do, q, k, v, out, lse, packing: _Packing, causal, sm_scale, dkdv_config, dq_config):
    total_q, h, d = q.shape
    configs = bwd_configs_in_effect(d, causal, q, dkdv_config, dq_config)
    _LAST_BWD_CONFIG[0] = configs
    if q.numel() == 0 or k.numel() == 0:
        return tuple(torch.zeros(t.shape, device=t.device, dtype=t.dtype) for t in (q, k, v))
    do = do.to(q.dtype)
    # every token belongs to a sequence whose programs write its rows (zeros where nothing is seen)
    dq, dk, dv = (torch.empty(t.shape, device=t.device, dtype=t.dtype) for t in (q, k, v))
    lse = lse.contiguous()
    _launch_backward(
        do,
        q,
        k,
        v,
        out,
        lse,
        dq,
        dk,
        dv,
        packing.cu_q,
        packing.cu_k,
        strides=[_packed_strides(t) for t in (q, k, v, do, out, dq, dk)],
        lse_strides=(0, lse.stride(0)),
        delta_rows=(1, total_q),
        batch=packing.batch,
        heads=h,
        kv_heads=k.shape[1],
        seqlen_q=packing.max_q,
        seqlen_k=packing.max_k,
        head_dim=d,
        causal=bool(causal),
        sm_scale=sm_scale,
        configs=configs,
        varlen=True,
    )
    return dq, dk, dv


def backward_varlen(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    causal: bool = False,
    sm_scale: float | None = None,
    *,
    dkdv_config: FA2Config | None = None,
    dq_config: FA2Config | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of ``attention_varlen``, from ``forward_varlen``'s out and lse ``[H, total_q]``.

    The same deterministic two-pass backward as ``backward``, on packed sequences; configurations as there.
    """
    causal = check_flag("causal", causal)
    packing = _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    check_grad_shapes(do, out, lse, q.shape, (q.shape[1], q.shape[0]), q)
    sm_scale = softmax_scale(q.shape[2], sm_scale)
    return _backward_packed(do, q, k, v, out, lse, packing, causal, sm_scale, dkdv_config, dq_config)


def _delta_rows_per_program(block_d: int) -> int:
    # about 8K elements of O and of dO per program: 64 rows at head dim 128
    return max(16, min(128, 8192 // block_d))


def _launch_backward(
    do,
    q,
    k,
    v,
    out,
    lse,
    dq,
    dk,
    dv,
    cu_q,
    cu_k,
    *,
    strides,
    lse_strides,
    delta_rows,
    batch,
    heads,
    kv_heads,
    seqlen_q,
    seqlen_k,
    head_dim,
    causal,
    sm_scale,
    configs: FA2BwdConfig,
    varlen,
) -> None:
    """Δ, then the dK/dV and dQ passes. ``strides``: of q, k, v, do, out, dq and dk (= dv), each in
    (batch, head, row, dim) order; ``lse_strides``: (batch, head) of the logsumexp, and of Δ (allocated
    here like it); ``delta_rows``: (batches, rows per head) as Δ's kernel sees them (a packed batch is one
    batch of total_q rows); varlen: ``seqlen_q``/``seqlen_k`` are the longest."""
    s_q, s_k, s_v, s_do, s_o, s_dq, s_dk = strides
    delta = torch.empty_like(lse)
    block_d = max(16, triton.next_power_of_2(head_dim))
    c1, c2 = configs
    constants = dict(
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        IS_CAUSAL=causal,
        IS_FP32=q.dtype == torch.float32,
        IS_VARLEN=varlen,
        EVEN_D=head_dim == block_d,
    )
    common = (*s_q, *s_k, *s_v, *s_do)
    with device_guard(q):
        delta_batch, rows = delta_rows
        block_rows = _delta_rows_per_program(block_d)
        _attn_bwd_delta_kernel[(triton.cdiv(rows, block_rows), delta_batch * heads)](
            out,
            do,
            delta,
            *s_o,
            *s_do,
            *lse_strides,
            heads,
            rows,
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            BLOCK_M=block_rows,
        )
        _attn_bwd_dkdv_kernel[(triton.cdiv(seqlen_k, c1.block_n), batch * kv_heads)](
            q,
            k,
            v,
            do,
            lse,
            delta,
            dk,
            dv,
            cu_q,
            cu_k,
            *common,
            *s_dk,
            *lse_strides,
            heads,
            kv_heads,
            heads // kv_heads,
            seqlen_q,
            seqlen_k,
            float(sm_scale),
            **constants,
            BLOCK_M=c1.block_m,
            BLOCK_N=c1.block_n,
            num_warps=c1.num_warps,
            num_stages=c1.num_stages,
        )
        _attn_bwd_dq_kernel[(triton.cdiv(seqlen_q, c2.block_m), batch * heads)](
            q,
            k,
            v,
            do,
            lse,
            delta,
            dq,
            cu_q,
            cu_k,
            *common,
            *s_dq,
            *lse_strides,
            heads,
            heads // kv_heads,
            seqlen_q,
            seqlen_k,
            float(sm_scale),
            **constants,
            EVEN_N=not varlen and seqlen_k % c2.block_n == 0,
            BLOCK_M=c2.block_m,
            BLOCK_N=c2.block_n,
            num_warps=c2.num_warps,
            num_stages=c2.num_stages,
        )


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


class _FlashAttention2Varlen(torch.autograd.Function):
    """The packed-sequence forward and backward; the offsets are checked once, in the forward."""

    @staticmethod
    def forward(ctx, q, k, v, packing, causal, sm_scale):
        out, lse = _forward_packed(q, k, v, packing, causal, sm_scale, None, False)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.packing, ctx.causal, ctx.sm_scale = packing, causal, sm_scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward_packed(grad_out, q, k, v, out, lse, ctx.packing, ctx.causal, ctx.sm_scale, None, None)
        return dq, dk, dv, None, None, None


# ---------------------------------------------------------------------------------------------------
# Public functions
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


def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    causal: bool = False,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """FlashAttention-2 on a batch of variable-length sequences packed end to end (no padding computed).

    Args:
        q: ``[total_q, H, d]``, the sequences' query tokens one after another; k, v: ``[total_k, H_kv, d]``
            with H_kv dividing H. Dtypes, strides and head dims as ``attention``.
        cu_seqlens_q, cu_seqlens_k: int32 ``[B + 1]`` on q's device: sequence i owns query tokens
            ``cu_seqlens_q[i]:cu_seqlens_q[i+1]`` and keys ``cu_seqlens_k[i]:cu_seqlens_k[i+1]``; they start at
            0, never decrease and end at total_q / total_k. Sequences of length 0 are allowed, and a
            sequence's query and key lengths may differ.
        max_seqlen_q, max_seqlen_k: the longest query / key sequence (they size the grid); computed from
            the offsets when None, refused when shorter than the longest, and a bound above the token count
            (a static bound for a CUDA graph, say) sizes the grid by the token count.
        causal: per sequence, aligned to its bottom-right corner (query i of n_q sees key j iff
            ``j <= i + n_k - n_q``); a query that sees no key gives zeros.
        sm_scale: score scale, default ``1/sqrt(d)``.

    Returns: ``[total_q, H, d]`` in the input dtype.

    Differentiable (deterministic backward, as ``attention``). The offsets are validated on the host: the
    first call with a given cu_seqlens tensor copies it from the GPU (a synchronisation); later calls with
    the same, unmodified tensor reuse that copy. Raises ``TypeError``/``ValueError`` for bad offsets
    (dtype, length, start, order, end, device) and everything ``attention`` refuses.
    """
    causal = check_flag("causal", causal)
    packing = _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    sm_scale = softmax_scale(q.shape[2], sm_scale)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return _FlashAttention2Varlen.apply(q, k, v, packing, bool(causal), sm_scale)
    out, _ = _forward_packed(q, k, v, packing, bool(causal), sm_scale, None, False)
    return out
