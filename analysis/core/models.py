"""Analytic models of attention's work, memory and HBM traffic, each defined once.

Every function counts per whole problem (all batches and heads) unless it says otherwise, in FLOPs or
bytes (``elem_bytes`` = 2 for fp16/bf16). Shapes are square (N queries, N keys) with head dim d. The
audit, the traffic figures and the tests all use these functions; the FLOP counts of the benchmarks
come from ``analysis.core.flops`` and are re-exported here so there is still one definition.

Conventions follow the papers the claims cite:

- Standard ("materialising") attention is the three-kernel program S = Q Kᵀ, P = softmax(S), O = P V,
  each kernel reading its inputs from HBM and writing its output there.
- FlashAttention-1 is the FA-1 paper's Algorithm 1: on-chip memory of M *elements*, column block
  Bc = ⌈M / 4d⌉, row block Br = min(⌈M / 4d⌉, d); the outer loop runs over the Tc = ⌈N / Bc⌉ K/V
  blocks, and for each, the inner loop reads every Q block and reads *and* writes every O block and the
  row statistics ℓ, m.
- FlashAttention-2's loop order (our kernel): one pass over K/V per Q block of BLOCK_M rows; Q read once,
  O and the logsumexp written once.
"""

from __future__ import annotations

import math

from analysis.core.flops import BACKWARD_FACTOR, attention_flops, decode_batch_flops

__all__ = [
    "attention_flops",
    "decode_batch_flops",
    "backward_flops",
    "recompute_extra_flops",
    "causal_block_fraction",
    "standard_attention_bytes",
    "standard_attention_total_bytes",
    "fa1_block_sizes",
    "fa1_forward_bytes",
    "fa2_forward_bytes",
    "minimum_attention_bytes",
    "attention_io_bytes",
    "decode_batch_bytes",
    "decode_gather_bytes",
    "arithmetic_intensity",
    "ridge_point",
    "score_matrix_bytes",
    "attainable_fraction",
    "dense_weight_bytes",
    "int4_weight_bytes",
    "int8_weight_bytes",
    "int4pack_weight_bytes",
    "unfused_dequant_bytes",
    "moe_expert_weight_bytes",
    "gather_moe_bytes",
]


# --- FLOPs -------------------------------------------------------------------------------------------


def backward_flops(batch: int, heads: int, n: int, d: int, causal: bool = False, recompute: bool = True) -> float:
    """Backward FLOPs: five N×N×d matrix products (2.5× forward) when S and P are recomputed from Q, K
    and the saved logsumexp, four (2× forward) when the forward stored P."""
    fwd = attention_flops(batch, heads, n, n, d, causal)
    return fwd * (BACKWARD_FACTOR if recompute else 2.0)


def recompute_extra_flops(batch: int, heads: int, n: int, d: int, causal: bool = False) -> dict:
    """What recomputing S = Q Kᵀ in the backward pass adds: one N×N×d product, 2·N²·d per head.

    Returns the absolute FLOPs and their share of the backward pass, of forward + backward without
    recomputation, and of forward + backward with it.
    """
    extra = attention_flops(batch, heads, n, n, d, causal) / 2  # one of the forward's two products
    fwd = attention_flops(batch, heads, n, n, d, causal)
    bwd_plain = backward_flops(batch, heads, n, d, causal, recompute=False)
    bwd_recompute = backward_flops(batch, heads, n, d, causal, recompute=True)
    return {
        "extra_flops": extra,
        "share_of_backward": extra / bwd_recompute,
        "increase_over_training_step": extra / (fwd + bwd_plain),
        "share_of_training_step": extra / (fwd + bwd_recompute),
    }


def causal_block_fraction(n_blocks: int) -> float:
    """Fraction of score tiles a causal kernel must compute with an n_blocks × n_blocks tiling.

    Tiles strictly above the diagonal are skipped; the diagonal ones are computed (masked): the fraction
    is (T + 1) / 2T, which tends to 1/2 as T grows.
    """
    if n_blocks < 1:
        raise ValueError("n_blocks must be >= 1")
    return (n_blocks * (n_blocks + 1) / 2) / n_blocks**2


# --- memory ------------------------------------------------------------------------------------------


def score_matrix_bytes(n: int, batch: int = 1, heads: int = 1, elem_bytes: int = 2) -> float:
    """Bytes of one N×N score (or probability) matrix per batch·head, times batch·heads."""
    return float(batch) * heads * n * n * elem_bytes


# --- HBM traffic -------------------------------------------------------------------------------------


def standard_attention_bytes(n: int, d: int, batch: int = 1, heads: int = 1, elem_bytes: int = 2) -> dict:
    """HBM bytes of each kernel of standard attention (no caching between kernels).

    ``qk``: read Q, K (2Nd), write S (N²); ``softmax``: read S, write P (2N²); ``pv``: read P (N²) and
    V (Nd), write O (Nd). Sum: 4N² + 4Nd elements, i.e. 8N² + 8Nd bytes in fp16.
    """
    bh, e = float(batch * heads), elem_bytes
    return {
        "qk": bh * e * (2 * n * d + n * n),
        "softmax": bh * e * (2 * n * n),
        "pv": bh * e * (n * n + 2 * n * d),
    }


def standard_attention_total_bytes(n: int, d: int, batch: int = 1, heads: int = 1, elem_bytes: int = 2) -> float:
    return sum(standard_attention_bytes(n, d, batch, heads, elem_bytes).values())


def minimum_attention_bytes(n: int, d: int, batch: int = 1, heads: int = 1, elem_bytes: int = 2) -> float:
    """Compulsory traffic of attention's forward: read Q, K, V and write O once (4Nd elements)."""
    return float(batch * heads) * elem_bytes * 4 * n * d


def formula_attention_bytes(
    n: int, d: int, n2_coeff: float, batch: int = 1, heads: int = 1, elem_bytes: int = 2
) -> float:
    """The articles' closed form of standard attention's HBM traffic, ``c·N² + 8Nd`` bytes in fp16 (c = 6 in
    S1 §1.2; the per-kernel count of ``standard_attention_bytes`` gives 8): the compulsory Q, K, V, O
    traffic plus c/2 N×N-element passes, scaled to ``elem_bytes``."""
    return (
        minimum_attention_bytes(n, d, batch, heads, elem_bytes)
        + float(batch * heads) * elem_bytes * n2_coeff / 2 * n * n
    )


def attention_io_bytes(
    batch: int, heads: int, heads_kv: int, seqlen_q: int, seqlen_k: int, d: int, elem_bytes: int = 2
) -> float:
    """Compulsory bytes of one attention call of any shape: Q and K, V read once, O written once.
    Grouped-query K/V (``heads_kv`` < ``heads``) are read once per K/V head. For decoding (seqlen_q of
    1…16 against a long K/V cache) this is almost all K and V: the bytes that bound its speed."""
    return float(elem_bytes * batch * d * (2 * heads * seqlen_q + 2 * heads_kv * seqlen_k))


def decode_batch_bytes(
    context_lens,
    heads: int,
    heads_kv: int,
    seqlen_q: int,
    d: int,
    elem_bytes: int = 2,
    page_size: int | None = None,
    index_bytes: int = 4,
) -> float:
    """Compulsory bytes of one decoding step of a batch of requests with ``context_lens`` keys each: every
    request's Q (``seqlen_q`` new tokens × ``heads``) read and O written once, its K and V read once per K/V
    head (the query heads sharing a K/V head read it together), and, for a paged cache (``page_size``), the
    block-table entries of its pages (``index_bytes`` each). A request of length 0 still reads Q and writes
    O. With one request this is ``attention_io_bytes`` (plus the table)."""
    lens = [max(0, int(n)) for n in context_lens]
    qo = 2.0 * len(lens) * heads * seqlen_q * d * elem_bytes
    kv = 2.0 * heads_kv * d * elem_bytes * sum(lens)
    table = float(index_bytes * sum(-(-n // page_size) for n in lens)) if page_size else 0.0
    return qo + kv + table


def decode_gather_bytes(context_lens, heads_kv: int, d: int, elem_bytes: int = 2, length: int | None = None) -> float:
    """Bytes of gathering a paged K/V cache into a contiguous copy padded to ``length`` keys per request
    (default: the longest): every cached K and V row read once, the padded copy written once."""
    lens = [max(0, int(n)) for n in context_lens]
    length = max(lens, default=0) if length is None else length
    row = 2.0 * heads_kv * d * elem_bytes  # one key's K and V
    return row * (sum(lens) + len(lens) * length)


def fa1_block_sizes(m_elements: int, d: int) -> tuple[int, int]:
    """(Br, Bc) of FA-1 Algorithm 1 for on-chip memory of ``m_elements`` elements and head dim d."""
    bc = math.ceil(m_elements / (4 * d))
    return min(bc, d), bc


def fa1_forward_bytes(
    n: int,
    d: int,
    m_elements: int,
    batch: int = 1,
    heads: int = 1,
    elem_bytes: int = 2,
    stat_bytes: int = 4,
    full: bool = True,
) -> dict:
    """HBM bytes of FA-1 Algorithm 1's forward.

    K and V are read once (2Nd). For each of the Tc = ⌈N/Bc⌉ outer iterations the inner loop reads all of
    Q (Nd) and, with ``full`` (what Algorithm 1 does), reads and writes all of O (2Nd) and ℓ, m (4N
    statistics). ``full=False`` counts only the Q re-reads, the accounting some derivations use.
    Returns the parts and the total.
    """
    _, bc = fa1_block_sizes(m_elements, d)
    tc = math.ceil(n / bc)
    bh = float(batch * heads)
    parts = {
        "kv": bh * elem_bytes * 2 * n * d,
        "q_rereads": bh * elem_bytes * tc * n * d,
        "o_read_write": bh * elem_bytes * tc * 2 * n * d if full else 0.0,
        "stats": bh * stat_bytes * tc * 4 * n if full else 0.0,
        "o_final": 0.0 if full else bh * elem_bytes * n * d,
    }
    parts["total"] = sum(parts.values())
    parts["tc"] = tc
    return parts


def fa2_forward_bytes(
    n: int, d: int, block_m: int, batch: int = 1, heads: int = 1, elem_bytes: int = 2, cached_kv: bool = False
) -> float:
    """HBM bytes of the FA-2 forward loop order with Q blocks of ``block_m`` rows.

    Q read once, O written once, the logsumexp written (4 bytes a row); K and V read once per Q block
    (Tr = ⌈N / block_m⌉ times) — unless ``cached_kv``, the limit where the L2 cache serves every re-read
    and K and V come from HBM once.
    """
    tr = 1 if cached_kv else math.ceil(n / block_m)
    bh = float(batch * heads)
    return bh * (elem_bytes * (2 * n * d + 2 * n * d * tr) + 4 * n)


# --- roofline ----------------------------------------------------------------------------------------


def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """FLOP per byte."""
    return flops / bytes_moved


def ridge_point(peak_tflops: float, bandwidth_tbps: float) -> float:
    """Roofline knee: the intensity (FLOP/B) above which a kernel can be compute-bound."""
    return peak_tflops / bandwidth_tbps


def attainable_fraction(intensity: float, ridge: float) -> float:
    """Fraction of peak compute a kernel of this intensity can reach under the roofline: min(1, I / ridge)."""
    return min(1.0, intensity / ridge)


# --- weight-only quantisation and mixture-of-experts layers --------------------------------------------
# Bytes of the weights a linear layer ``x @ Wᵀ`` (``W [n, k]``: out_features × in_features) must read once.
# At small M (decoding) these bytes bound the layer's time; the benchmarks' GB/s are these bytes per time.


def dense_weight_bytes(n: int, k: int, elem_bytes: int = 2) -> float:
    """A 16-bit (or ``elem_bytes``) weight: n·k elements."""
    return float(n) * k * elem_bytes


def int4_weight_bytes(n: int, k: int, group_size: int, scale_bytes: int, zero_bytes: int = 1) -> float:
    """Group-wise int4: n·k/2 bytes of codes, plus per group of ``group_size`` inputs of a row one scale
    (``scale_bytes``) and, if asymmetric, one zero point (``zero_bytes``; 0 for symmetric)."""
    if k % group_size:
        raise ValueError(f"k={k} is not a multiple of group_size={group_size}")
    return float(n) * k / 2 + float(n) * (k // group_size) * (scale_bytes + zero_bytes)


def int8_weight_bytes(n: int, k: int, scale_bytes: int) -> float:
    """Int8 with one scale per output channel: n·k bytes plus n scales."""
    return float(n) * k + float(n) * scale_bytes


def int4pack_weight_bytes(n: int, k: int, group_size: int) -> float:
    """PyTorch's ``_weight_int4pack_mm`` format: n·k/2 bytes of codes and a bf16 (scale, zero) pair per group."""
    return int4_weight_bytes(n, k, group_size, scale_bytes=2, zero_bytes=2)


def unfused_dequant_bytes(n: int, k: int, packed_bytes: float, elem_bytes: int = 2) -> float:
    """Dequantise to memory, then a 16-bit matmul: the packed weight read, the 16-bit weight written and
    read back (the traffic the fused kernel avoids)."""
    return packed_bytes + 2 * dense_weight_bytes(n, k, elem_bytes)


def moe_expert_weight_bytes(
    experts_touched: int, hidden: int, ffn: int, elem_bytes: int = 2, matrices: int = 3
) -> float:
    """Weights of the experts that received at least one token, each read once: ``matrices`` (3 for a SwiGLU
    expert: gate, up, down; 1 for one grouped GEMM) hidden×ffn matrices per expert."""
    return float(experts_touched) * matrices * hidden * ffn * elem_bytes


def gather_moe_bytes(tokens: int, top_k: int, hidden: int, ffn: int, elem_bytes: int = 2, matrices: int = 3) -> float:
    """Per-token gathering of expert weights (``w[expert_ids]``): every (token, expert) pair copies its
    expert's matrices, written once by the gather and read once by the batched product."""
    return 2.0 * tokens * top_k * matrices * hidden * ffn * elem_bytes
