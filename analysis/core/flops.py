"""FLOP models of attention, GEMMs and MoE layers, defined once and used by benchmarks, audit and figures alike.

Forward: two matrix products (Q Kᵀ and P V) of 2·Nq·Nk·d FLOPs each per batch and head, so
4·B·H·Nq·Nk·d; causal attention is counted as half of that (the convention of the FlashAttention papers
and their benchmarks, so that TFLOP/s figures compare with theirs; the exact visible fraction is
(N+1)/(2N), 0.1% more at N = 512). The softmax's exponentials and sums are not counted. Backward is 2.5×
forward (five matrix products instead of two), again as the papers count.
"""

from __future__ import annotations

BACKWARD_FACTOR = 2.5
MODES = {"fwd": 1.0, "bwd": BACKWARD_FACTOR, "fwd+bwd": 1.0 + BACKWARD_FACTOR}


def attention_flops(
    batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int, causal: bool = False, mode: str = "fwd"
) -> float:
    """FLOPs of attention: 4·B·H·Nq·Nk·d forward, halved if causal, ×2.5 backward, ×3.5 fwd+bwd."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    fwd = 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim
    if causal:
        fwd *= 0.5
    return fwd * MODES[mode]


def decode_batch_flops(context_lens, heads: int, seqlen_q: int, head_dim: int) -> float:
    """FLOPs of one decoding step of a batch of requests with ``context_lens`` keys each: Σ over requests of the
    forward's 4·H·Nq·L·d (every new token against every key: with Nq ≤ 16 new tokens against thousands of
    keys the causal mask hides at most Nq − 1 keys of a row, so it is not discounted)."""
    return 4.0 * heads * seqlen_q * head_dim * sum(max(0, int(n)) for n in context_lens)


def tflops(flops: float, ms: float) -> float:
    """Throughput in TFLOP/s of ``flops`` done in ``ms`` milliseconds."""
    return flops / (ms * 1e-3) / 1e12


def gemm_flops(m: int, n: int, k: int) -> float:
    """FLOPs of an ``[m, k] @ [k, n]`` product: 2·m·n·k (one multiply and one add per term; a linear layer
    ``x @ Wᵀ`` with ``W [n, k]`` and ``x [m, k]`` is the same count; dequantisation is not counted)."""
    return 2.0 * m * n * k


def moe_ffn_flops(tokens: int, top_k: int, hidden: int, ffn: int) -> float:
    """FLOPs of a routed SwiGLU expert layer's matrix products: each of the ``tokens · top_k`` (token, expert)
    pairs does gate and up (``hidden → ffn``) and down (``ffn → hidden``), 3 · 2·hidden·ffn. Routing, the
    activation and the weighted combine are not counted. A dense SwiGLU FFN of width ``top_k · ffn`` does
    the same FLOPs: ``moe_ffn_flops(tokens, 1, hidden, top_k * ffn)``."""
    return 3 * gemm_flops(tokens * top_k, ffn, hidden)
