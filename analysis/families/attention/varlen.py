"""Variable-length batches: packed attention (cu_seqlens) against the same batch padded to its longest sequence.

One shard measures one batch, given by its sequence lengths (``Spec.seqlens``), with ``Spec.heads`` heads
of ``Spec.head_dim``, in one mode. Implementations:

- ``ours-varlen``: ``kernels.attention.fa2.attention_varlen`` on the packed tokens ``[total, H, d]`` with
  int32 ``cu_seqlens``; no work on padding.
- ``ours-fa2-padded``: our FA-2 kernel on the batch padded with zeros to ``[B, H, max_len, d]``: what
  padding costs. Without a causal mask its real queries also attend to the zero padding keys, so it does
  not compute the real batch's attention; its correctness gate checks the padded problem it solves, and
  its ``message`` says it measures the padded cost.
- ``sdpa-efficient-padded``: SDPA's memory-efficient backend on the padded batch with a boolean
  key-padding mask (combined with the causal mask when causal), which it supports; checked on the real
  tokens.

Padding and packing are done before anything is timed: the timed region is the attention call (and its
gradients) on inputs already in each layout. TFLOP/s of every implementation are computed from the
*useful* FLOPs, Σ over sequences of ``attention_flops`` of that sequence, so padding shows as lower
effective throughput; ``pad_waste`` = 1 − useful / padded FLOPs of the batch (the same on every row).
Rows: ``batch`` = number of sequences, ``seqlen_q`` = ``seqlen_k`` = the longest, ``tokens`` = total.

Correctness: the output on sampled rows of every sequence (the first and last few, ``check_rows`` in
all) against float64 attention of that sequence alone; in the gradient modes dq, dk, dv of the first
sequence's first head against float64 autograd of that slice (the padded problem's slice for
``ours-fa2-padded``), as in ``analysis.families._shared.attention_measure``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from analysis.core import harness
from analysis.core.flops import attention_flops, tflops
from analysis.core.points import DTYPES, generator, randn, sample_rows, short
from analysis.core.provenance import row_provenance
from analysis.families._shared import attention_measure as att
from analysis.families.attention.plan import Spec
from kernels import tolerance
from kernels.attention import reference

# SDPA's backend for the padded batch with its mask (a module constant so that the CPU tests, where this
# backend does not exist, can check the masking through the math backend).
PADDED_SDPA_BACKEND = "EFFICIENT_ATTENTION"

PADDED_NOTE = {
    "ours-fa2-padded": (
        "measures the cost of padding: the batch padded to its longest sequence"
        "{keys}; checked against the padded problem it solves"
    ),
    "sdpa-efficient-padded": (
        "the batch padded to its longest sequence with a key-padding mask; checked on the real tokens"
    ),
}


def useful_and_padded_flops(lengths, heads: int, d: int, causal: bool, mode: str) -> tuple[float, float]:
    useful = sum(attention_flops(1, heads, n, n, d, causal, mode) for n in lengths)
    return useful, attention_flops(len(lengths), heads, max(lengths), max(lengths), d, causal, mode)


class _Batch:
    """The batch in both layouts, the offsets, and the references every implementation is checked against."""

    def __init__(self, spec: Spec, dtype, device, gen):
        lengths = [int(n) for n in spec.seqlens]
        self.lengths, self.b, self.h, self.d = lengths, len(lengths), spec.heads, spec.head_dim
        self.nmax, self.total = max(lengths), sum(lengths)
        self.causal = spec.causal
        starts = [0]
        for n in lengths:
            starts.append(starts[-1] + n)
        self.starts = starts
        self.cu = torch.tensor(starts, dtype=torch.int32, device=device)
        shape = (self.total, self.h, self.d)
        self.q, self.k, self.v = (randn(shape, gen, dtype, device) for _ in range(3))
        self.do = randn(shape, gen, dtype, device) if spec.mode != "fwd" else None
        # padded copies, [B, H, max_len, d] (zeros beyond each sequence), and the key-padding mask
        self.qp, self.kp, self.vp = (self.pad(t) for t in (self.q, self.k, self.v))
        self.dop = self.pad(self.do) if self.do is not None else None
        self.key_valid = torch.zeros((self.b, self.nmax), dtype=torch.bool, device=device)
        for i, n in enumerate(lengths):
            self.key_valid[i, :n] = True
        # sampled rows per sequence, and the float64 / same-precision references of the real sequences
        per_seq = max(1, spec.check_rows // len(lengths))
        self.rows = [sample_rows(n, per_seq).to(device) for n in lengths]
        self.ref, self.same = self._references(self.seq)
        self.padded_ref = None  # the padded problem's references, made on demand (ours-fa2-padded)
        self.gate = self.padded_gate = None
        if self.do is not None:
            self.gate = att.grad_gate(*self.seq(0), self.seq_do(0), self.causal, 1)

    def pad(self, t: torch.Tensor) -> torch.Tensor:
        out = torch.zeros((self.b, self.nmax, self.h, self.d), dtype=t.dtype, device=t.device)
        for i, n in enumerate(self.lengths):
            out[i, :n] = t[self.starts[i] : self.starts[i] + n]
        return out.transpose(1, 2)  # [B, H, max_len, d], strided like a model's activations

    def seq(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sequence i of the real batch as [1, H, n, d] views."""
        s, e = self.starts[i], self.starts[i + 1]
        return tuple(t[s:e].transpose(0, 1)[None] for t in (self.q, self.k, self.v))

    def seq_do(self, i: int) -> torch.Tensor:
        s, e = self.starts[i], self.starts[i + 1]
        return self.do[s:e].transpose(0, 1)[None]

    def padded_seq(self, i: int):
        return tuple(t[i : i + 1] for t in (self.qp, self.kp, self.vp))

    def _references(self, seq: Callable[[int], tuple]) -> tuple[torch.Tensor, torch.Tensor]:
        refs, sames = [], []
        for i in range(self.b):
            q, k, v = seq(i)
            refs.append(reference.reference_attention(q, k, v, self.causal, rows=self.rows[i]))
            sames.append(reference.naive_attention_rows(q, k, v, self.rows[i], self.causal))
        return torch.cat(refs, dim=2), torch.cat(sames, dim=2)

    def padded_references(self):
        if self.padded_ref is None:
            self.padded_ref = self._references(self.padded_seq)
            if self.dop is not None:
                self.padded_gate = att.grad_gate(self.qp, self.kp, self.vp, self.dop, self.causal, 1)
        return self.padded_ref

    def sampled_packed(self, out: torch.Tensor) -> torch.Tensor:
        """Sampled rows of a packed output [total, H, d] as [1, H, rows, d], sequence after sequence."""
        idx = torch.cat([self.starts[i] + r for i, r in enumerate(self.rows)])
        return out.index_select(0, idx).transpose(0, 1)[None]

    def sampled_padded(self, out: torch.Tensor) -> torch.Tensor:
        """Sampled rows of a padded output [B, H, max_len, d] as [1, H, rows, d]."""
        return torch.cat([out[i : i + 1].index_select(2, r) for i, r in enumerate(self.rows)], dim=2)

    def mask(self) -> torch.Tensor:
        """SDPA's boolean mask (True = attend): key padding, and the causal triangle when causal."""
        m = self.key_valid[:, None, None, :]
        if self.causal:
            tri = torch.ones((self.nmax, self.nmax), dtype=torch.bool, device=m.device).tril()
            m = m & tri[None, None]
        return m


def _implementation(impl: str, batch: _Batch):
    """(inputs, fn(q, k, v) -> out, sampled-rows extractor, gradient-slice extractor) of one impl."""
    causal = batch.causal
    if impl == "ours-varlen":
        from kernels.attention import fa2

        def fn(q, k, v):
            return fa2.attention_varlen(q, k, v, batch.cu, batch.cu, batch.nmax, batch.nmax, causal=causal)

        n0 = batch.lengths[0]
        return (
            (batch.q, batch.k, batch.v, batch.do),
            fn,
            batch.sampled_packed,
            lambda g: tuple(t[:n0, :1].transpose(0, 1)[None] for t in g),
        )
    padded = (batch.qp, batch.kp, batch.vp, batch.dop)
    if impl == "ours-fa2-padded":
        from kernels.attention import fa2

        def fn(q, k, v):
            return fa2.attention(q, k, v, causal=causal)

        return padded, fn, batch.sampled_padded, lambda g: tuple(t[:1, :1] for t in g)
    if impl == "sdpa-efficient-padded":
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        mask = batch.mask()

        def fn(q, k, v):
            with sdpa_kernel([getattr(SDPBackend, PADDED_SDPA_BACKEND)]):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        n0 = batch.lengths[0]
        return padded, fn, batch.sampled_padded, lambda g: tuple(t[:1, :1, :n0] for t in g)
    raise ValueError(f"unknown varlen implementation {impl!r}")


def run(spec: Spec, env: dict, device: str, log_line: Callable[[str], None]) -> list[dict]:
    """Measure every implementation of ``spec`` on its one batch; rows of the attention table."""
    dtype = DTYPES[spec.dtype]
    lengths = [int(n) for n in spec.seqlens]
    useful, padded = useful_and_padded_flops(lengths, spec.heads, spec.head_dim, spec.causal, spec.mode)
    base = att.base_row(
        spec,
        row_provenance(env),
        True,
        "attention",
        batch=len(lengths),
        heads=spec.heads,
        heads_kv=spec.heads,
        seqlen_q=max(lengths),
        seqlen_k=max(lengths),
    )
    base.update(tokens=sum(lengths), pad_waste=1.0 - useful / padded)
    text = (
        f"{len(lengths)} sequences, {sum(lengths)} tokens (longest {max(lengths)}) H={spec.heads} "
        f"d={spec.head_dim} causal={spec.causal} {spec.dtype} {spec.mode}"
    )
    progress = harness.Progress(spec.points(), log_line)
    rows = []
    try:
        batch = _Batch(spec, dtype, device, generator(device, spec.seed))
    except Exception as exc:
        status, message = harness.classify(exc)
        for impl in spec.impls:
            rows.append(att.make_row(base, impl, status, f"inputs/reference: {message}", pad_waste=base["pad_waste"]))
            progress.step(f"{impl} {text}", status)
        harness.release_memory()
        return rows
    rounds = harness.Rounds(spec.spread_rounds, rows)  # the batch's repeat rounds (the harness's step 6)
    for impl in spec.impls:
        row = _measure(spec, impl, batch, base, useful, dtype)
        rows.append(row)
        extra = f" {row['tflops']:.1f} useful TFLOP/s" if row["status"] == "ok" else ""
        progress.step(f"{impl} {text}", row["status"] + extra + short(row["message"]))
        harness.release_memory()
    rounds.run()
    return rows


def _measure(spec: Spec, impl: str, batch: _Batch, base: dict, useful: float, dtype) -> dict:
    metrics: dict = {"pad_waste": base["pad_waste"]}
    try:
        (q, k, v, do), fn, sampled, grad_slice = _implementation(impl, batch)
        ref, same, gate = batch.ref, batch.same, batch.gate
        if impl == "ours-fa2-padded":
            ref, same = batch.padded_references()
            gate = batch.padded_gate
        if spec.mode == "fwd":
            out = fn(q, k, v)  # compiles and tunes outside the timed region
            checks = [tolerance.check(f"{impl} output", sampled(out), ref, same, dtype)]
            del out

            def call():
                return fn(q, k, v)

        else:
            leaves = tuple(t.detach().requires_grad_(True) for t in (q, k, v))
            out = fn(*leaves)
            grads = torch.autograd.grad(out, leaves, do, retain_graph=spec.mode == "bwd")
            checks = [tolerance.check(f"{impl} output", sampled(out.detach()), ref, same, dtype)]
            checks += att.grad_checks(impl, grad_slice(grads), gate, dtype)
            del grads
            if spec.mode == "bwd":

                def call():
                    return torch.autograd.grad(out, leaves, do, retain_graph=True)

            else:
                del out

                def call():
                    return torch.autograd.grad(fn(*leaves), leaves, do)

        if impl in ("ours-varlen", "ours-fa2-padded"):  # the same FA-2 kernels, packed or padded
            metrics["kernel_config"] = att.kernel_config("ours-fa2", spec.mode, None, q, k)
        errors, failed = att.gate_metrics(checks)
        metrics.update(errors)
        if failed:
            return att.make_row(base, impl, "mismatch", "; ".join(c.describe() for c in failed), **metrics)
        notes = []
        if impl in PADDED_NOTE:
            keys = "" if spec.causal else " (its real queries also attend to the zero padding keys)"
            notes.append(PADDED_NOTE[impl].format(keys=keys))
        if gate is not None and gate.skipped:
            notes.append(gate.skipped)
        metrics.update(att.time_call(call, spec))
        metrics["tflops"] = tflops(useful, metrics["ms_median"])
        return att.make_row(base, impl, "ok", "; ".join(notes), **metrics)
    except Exception as exc:
        status, message = harness.classify(exc)
        harness.release_memory()
        return att.make_row(base, impl, status, message, **metrics)
