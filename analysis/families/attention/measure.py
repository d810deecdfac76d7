"""The attention family's experiments on dense [B, H, N, d] inputs: one shard in, tidy rows out.

A shard is one (experiment, dtype, head_dim, causal, mode, …) combination with its list of sequence
lengths and implementations; ``run(spec)`` measures every (N, implementation) point of it with the
harness and returns one row per point, whatever happened to it. The experiments and their shapes:

- ``fa2-setting`` (FlashAttention-2 paper): batch × seqlen = ``tokens`` (16384), heads = ``hidden`` /
  head_dim (2048 / d), so every point does the same work per token; forward, backward and both. Our
  FlashAttention-3 forward (``ours-fa3``, Hopper only) is measured here too, beside FA-2 and FA-1, and
  FlashAttention's own kernels (``upstream-fa``, where installed: ``analysis.families._shared.peers``).
- ``llama3-70b-heads``: Llama-3.1-70B's attention heads (``batch`` 1, ``heads`` 64 sharing ``heads_kv`` 8, d =
  128), our kernels beside SDPA's cuDNN backend and ``upstream-fa``; forward and backward.
- ``fa1-setting`` (FlashAttention-1 paper, Figure 3): fixed ``batch`` × ``heads`` (8 × 12), d = 64, N
  grows past the point where naive attention runs out of memory; speed-up and memory saving over naive.
- ``gain-surface``: ours against naive over N × d at batch × seqlen = ``tokens`` and fixed ``heads``:
  where the IO-aware kernel's gain over materialising attention grows and where it vanishes.
- ``block-sweep``: our FA-2 forward pinned to each configuration of ``configs`` (FA2Config strings) in
  turn; ``kernel_config`` records the pinned one. Shapes as ``gain-surface``.
- ``rescale-ablation``: lazy rescaling (``ours-fa2``: one division by ℓ at the end) against eager
  (``ours-fa2-eager``: the accumulator normalised at every K/V tile), in the FA-2 setting's shapes.
- ``memory`` (the second article's experiment 1): fixed ``batch`` and ``heads`` (1 × 16), N grows until
  the materialising implementations run out of memory.
- ``decode``: ``seqlens`` query rows (1…16) against ``seqlen_k`` keys with ``heads_kv`` K/V heads
  (grouped-query when fewer than ``heads``); split-KV decoding against the unsplit kernel, FA-2, SDPA
  and naive, and ``copy-kv``: a device copy of the same K/V bytes, the copy bandwidth the others are
  measured against. Rows carry ``model_bytes`` (Q, K, V read and O written once,
  ``analysis.core.models.attention_io_bytes``; copy-kv: the bytes read and written) and ``gbps``.
- ``decode-serving``: one decoding step of a batch of paged requests of mixed lengths
  (``analysis.families.attention.serving``, which measures it).
- ``varlen``: one batch of sequences of different lengths (``seqlens`` lists them), packed with
  cu_seqlens against the same batch padded to its longest sequence (``analysis.families.attention.varlen``).
- ``fa3-ablation``: the FA-3 kernel with each of its techniques switched off in turn
  (``ours-fa3-no-warp-specialize``, ``-no-pingpong``, ``-no-overlap``, ``-no-tma``), FA-2 setting shapes, beside
  FlashAttention's own kernel (``upstream-fa``).
- ``interpreter-check``: tiny, odd shapes run through Triton's interpreter on the CPU to check the
  kernel's output; nothing is timed (``timed`` is False in those rows).

How a point is measured (the modes, the correctness gate before any timing) is the attention-like families'
shared code, ``analysis.families._shared.attention_measure``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from analysis.core import harness
from analysis.core.points import DTYPES, generator, short
from analysis.core.provenance import row_provenance
from analysis.families._shared.attention_measure import Point, base_row, make_row, measure
from analysis.families.attention.plan import Spec

log = logging.getLogger(__name__)


def run_dense(spec: Spec, env: dict, device: str = "cuda", log_line: Callable[[str], None] = log.info) -> list[dict]:
    """Measure every point of a shard of dense [B, H, N, d] attention; returns rows of the attention table."""
    timed = spec.experiment != "interpreter-check"
    dtype = DTYPES[spec.dtype]
    prov = row_provenance(env)
    variants = spec.variants()
    progress = harness.Progress(spec.points(), log_line)
    rows: list[dict] = []
    gen = generator(device, spec.seed)

    for i in range(len(spec.seqlens)):
        b, h, nq, nk = spec.shape(i)
        hk = spec.kv_heads(h)
        base = base_row(spec, prov, timed, "attention", batch=b, heads=h, heads_kv=hk, seqlen_q=nq, seqlen_k=nk)
        shape_text = (
            f"B={b} H={h}"
            + (f" Hkv={hk}" if hk != h else "")
            + f" Nq={nq} Nk={nk} d={spec.head_dim} causal={spec.causal} {spec.dtype} {spec.mode}"
        )
        try:
            point = Point.build(spec, b, h, hk, nq, nk, dtype, device, gen)
        except Exception as exc:  # inputs or the reference itself do not fit: every impl gets the status
            status, message = harness.classify(exc)
            for impl, cfg in variants:
                rows.append(make_row(base, impl, status, f"inputs/reference: {message}", kernel_config=cfg or ""))
                progress.step(f"{impl} {shape_text}", status)
            harness.release_memory()
            continue

        rounds = harness.Rounds(spec.spread_rounds, rows)  # the point's repeat rounds (the harness's step 6)
        for impl, cfg in variants:
            row = measure(spec, impl, cfg, point, base, timed)
            rows.append(row)
            done = row["status"] == "ok" and timed
            extra = f" {row['tflops']:.1f} TFLOP/s" if done and math.isfinite(row["tflops"]) else ""
            extra += f" {row['gbps']:.0f} GB/s" if done and math.isfinite(row["gbps"]) else ""
            label = f"{impl} [{cfg}]" if cfg else impl
            progress.step(f"{label} {shape_text}", row["status"] + extra + short(row["message"]))
            if spec.mode != "fwd":  # the graphs of materialising impls hold N×N tensors
                harness.release_memory()
        rounds.run()
        del point
        harness.release_memory()
    return rows
