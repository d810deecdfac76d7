"""Measuring dense [B, H, N, d] attention, as the attention-like families do it: the implementations' callables
(``implementation``, the names of ``attention_plan.CALLABLE_IMPLS``), the correctness gates, one point
measured (``measure``, ``measure_copy``) and the rows it makes (``base_row``, ``make_row``). The attention
family's ``measure.run_dense`` and the FP8 family's ``run`` measure their shards with these.

Modes. ``fwd`` times the forward call. ``bwd`` builds the forward graph once, outside the timed region,
then times ``torch.autograd.grad(out, (q, k, v), do, retain_graph=True)``: the backward pass alone (its
repeat rounds, the harness's step 6, build a forward graph for each round rather than keep every
implementation's alive until them). ``fwd+bwd`` times the forward call and the gradients together. TFLOP/s
use the FLOPs of the mode (``analysis.core.flops.attention_flops``); peak memory is that of one call of the
timed callable.

The official kernels beside ours (``analysis.families._shared.peers``) are measured the same way, on the
same inputs: a peer that is not installed is an ``absent`` row (nothing runs), and one that takes another
layout ([B, N, H, d]: ``peers.BNHD``) gets the point's tensors copied into it once, before anything is timed.

Correctness gates speed. The output is compared with a float64 reference on a sample of query rows (the
first and last ``check_rows // 2`` of batch 0, every head); in the gradient modes dq, dk and dv of the
first (batch, head) slice (for grouped-query K/V: K/V head 0 and the query heads that share it) are
compared with float64 autograd of that slice. Both are bounded by the error of plain PyTorch at the same
precision (``kernels.tolerance``). Where the float64 slice would not fit in memory, the gradient gate
is skipped and the row's ``message`` says so. A failed gate is a ``mismatch`` row, never timed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from analysis.core import harness
from analysis.core.flops import attention_flops, tflops
from analysis.core.models import attention_io_bytes
from analysis.core.points import DTYPES, randn, sample_rows
from analysis.core.points import make_row as point_row
from analysis.families._shared import peers
from analysis.families._shared.attention_plan import FA3_BWD, AttentionSpec
from analysis.families._shared.fa3_ablation import FA3_IMPLS
from kernels import tolerance
from kernels.attention import reference

# Live N×N tensors of three-step attention's autograd (S, P, dP, dS) when sizing the float64 gradient slice.
_GRAD_REF_TENSORS = 5


def implementation(name: str, config: str | None = None) -> Callable:
    """The callable ``f(q, k, v, causal) -> out`` benchmarked under ``name`` (``config``: a pinned
    FA2Config string for ``ours-fa2``, forward only)."""
    if name == "ours-fa2":
        from kernels.attention import fa2

        if config is not None:
            cfg = fa2.FA2Config.parse(config)
            return lambda q, k, v, causal: fa2.forward(q, k, v, causal, config=cfg)[0]
        return lambda q, k, v, causal: fa2.attention(q, k, v, causal=causal)
    if name == "ours-fa2-eager":
        from kernels.attention import fa2

        return lambda q, k, v, causal: fa2.forward(q, k, v, causal, rescale="eager")[0]
    if name == "ours-fa1":
        from kernels.attention import fa1

        return lambda q, k, v, causal: fa1.attention(q, k, v, causal=causal)
    if name in FA3_IMPLS:
        from kernels.attention import fa3

        schedule = "fa3" if name == "ours-fa3" else name.removeprefix("ours-fa3-")
        return lambda q, k, v, causal: fa3.forward(q, k, v, causal, schedule=schedule)[0]
    if name == FA3_BWD:
        from kernels.attention import fa3

        return lambda q, k, v, causal: fa3.attention(q, k, v, causal=causal, backward="fa3")
    if name in ("ours-decode", "ours-decode-unsplit"):
        from kernels.attention import decode

        splits = 1 if name == "ours-decode-unsplit" else None  # None: the split count from the shape
        return lambda q, k, v, causal: decode.forward(q, k, v, causal, num_splits=splits)[0]
    if name == "upstream-fa":  # takes [B, N, H, d] (peers.BNHD)
        return peers.upstream_fa
    if name == "naive":
        return lambda q, k, v, causal: reference.naive_attention(q, k, v, causal)
    if name.startswith("sdpa-") and name.removeprefix("sdpa-") in reference.SDPA_BACKENDS:
        backend = name.removeprefix("sdpa-")
        return lambda q, k, v, causal: reference.sdpa_attention(q, k, v, causal, backend=backend)
    raise ValueError(f"unknown implementation {name!r}")


def _fa2_bwd_config() -> str:
    from kernels.attention import fa2

    cfg = fa2.last_bwd_config()  # both passes' tiles, in the KERNELS_FA2_BWD_CONFIG form
    return str(cfg) if cfg is not None else ""


def kernel_config(name: str, mode: str, config: str | None, q: torch.Tensor, k: torch.Tensor) -> str:
    if name in ("ours-fa2", "ours-fa2-eager"):
        from kernels.attention import fa2

        fwd = config or str(fa2.last_config() or "")
        if mode == "fwd":
            return fwd
        return f"fwd: {fwd}; bwd: {_fa2_bwd_config() or 'default'}"
    if name == "ours-fa1":
        from kernels.attention import fa1

        return "BLOCK_R={},BLOCK_C={}".format(*fa1.DEFAULT_BLOCKS)
    if name in FA3_IMPLS:
        from kernels.attention import fa3

        tiles, schedule = fa3.last_config()
        switches = ",".join(f"{f.name}={int(getattr(schedule, f.name))}" for f in dataclasses.fields(schedule))
        return f"{tiles},{switches}"
    if name == FA3_BWD:
        from kernels.attention import fa3, fa3_bwd

        fwd, bwd = fa3.last_config()[0], fa3_bwd.last_config()
        return f"fwd: {fwd}; bwd: {bwd[0] if mode != 'fwd' and bwd else 'none'}"
    if name == "ours-decode":
        from kernels.attention import decode

        return f"num_splits={decode.last_splits()}"
    if name == "ours-decode-unsplit":
        return "num_splits=1"
    if name in peers.PEERS:
        return peers.kernel_config(name)
    return ""


@dataclasses.dataclass
class GradGate:
    """Float64 and same-precision gradients of one (batch, head) slice, or why there are none."""

    group: int  # query heads sharing K/V head 0 (1 without grouped-query)
    ref: tuple | None = None  # (out, dq, dk, dv) in float64
    same: tuple | None = None  # the same in the input dtype
    skipped: str = ""


def grad_gate(q, k, v, do, causal: bool, group: int) -> GradGate:
    """Reference gradients of the slice q[:1, :group], k[:1, :1], v[:1, :1], unless it cannot fit."""
    gate = GradGate(group)
    nq, nk = q.shape[2], k.shape[2]
    need = _GRAD_REF_TENSORS * group * nq * nk * 8
    if q.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(q.device)
        if need > 0.9 * free:
            gate.skipped = (
                f"gradient gate skipped: the float64 reference of one (batch, head) slice needs about "
                f"{need / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free; output checked on sampled rows"
            )
            return gate
    sl = (q[:1, :group], k[:1, :1], v[:1, :1], do[:1, :group])
    try:
        gate.ref = reference.attention_grads(*sl, causal, dtype=torch.float64)
        gate.same = reference.attention_grads(*sl, causal, dtype=q.dtype)
    except Exception as exc:
        if not harness.is_oom(exc):
            raise
        gate.ref = gate.same = None
        harness.release_memory()
        gate.skipped = "gradient gate skipped: the float64 reference of one (batch, head) slice ran out of memory"
    return gate


def grad_checks(impl: str, got, gate: GradGate, dtype) -> list[tolerance.ErrorCheck]:
    """``got`` = (dq, dk, dv) of the gate's slice against float64 (nothing when the gate was skipped)."""
    if gate is None or gate.ref is None:
        return []
    return [
        tolerance.check(f"{name} {impl}", g, r, s, dtype)
        for name, g, r, s in zip(("dq", "dk", "dv"), got, gate.ref[1:], gate.same[1:], strict=True)
    ]


def worst(checks: list[tolerance.ErrorCheck]) -> tolerance.ErrorCheck:
    """The check closest to (or furthest past) its bound: the one whose numbers a row reports."""

    def ratio(c):
        return math.inf if c.max_abs != c.max_abs else c.max_abs / c.bound

    return max(checks, key=ratio)


def gate_metrics(checks: list[tolerance.ErrorCheck]) -> tuple[dict, list[tolerance.ErrorCheck]]:
    """(error columns of the worst check, the checks that failed)."""
    w = worst(checks)
    metrics = dict(max_abs_err=w.max_abs, rms_err=w.rms, ref_err=w.ref_err, err_bound=w.bound)
    return metrics, [c for c in checks if not c.ok]


@dataclasses.dataclass
class Point:
    """Inputs and references of one shape, built before anything is measured."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kv: torch.Tensor  # one tensor holding K (kv[0]) and V (kv[1]): what copy-kv copies
    sample: torch.Tensor
    ref: torch.Tensor
    same: torch.Tensor
    do: torch.Tensor | None = None
    gate: GradGate | None = None

    @classmethod
    def build(cls, spec: AttentionSpec, b, h, hk, nq, nk, dtype, device, gen) -> Point:
        d = spec.head_dim
        q = randn((b, h, nq, d), gen, dtype, device)
        kv = randn((2, b, hk, nk, d), gen, dtype, device)
        k, v = kv[0], kv[1]
        sample = sample_rows(nq, spec.check_rows).to(device)
        ref = reference.reference_attention(q[:1], k[:1], v[:1], spec.causal, rows=sample)
        same = reference.naive_attention_rows(q[:1], k[:1], v[:1], sample, spec.causal)
        point = cls(q, k, v, kv, sample, ref, same)
        if spec.mode != "fwd":
            point.do = randn((b, h, nq, d), gen, dtype, device)
            point.gate = grad_gate(q, k, v, point.do, spec.causal, h // hk)
        return point


def h_group(p: Point) -> int:
    return p.gate.group if p.gate else 1


def base_row(spec: AttentionSpec, prov: dict, timed: bool, family: str, **shape) -> dict:
    """The identity and provenance columns every row of one shape of ``spec`` shares."""
    return {
        "experiment": spec.experiment,
        "family": family,
        "op": "attention",
        "dtype": spec.dtype,
        "mode": spec.mode,
        **shape,
        "head_dim": spec.head_dim,
        "causal": bool(spec.causal),
        "inputs": spec.inputs,
        "timed": timed,
        **prov,
    }


# the metric and telemetry columns of an attention row (NaN where a point does not measure one)
METRICS = (
    "ms_median",
    "ms_p20",
    "ms_p80",
    "host_ms",
    "spread_rounds",
    "ms_round_min",
    "ms_round_max",
    "tflops",
    "model_bytes",
    "gbps",
    "pad_waste",
    "peak_mem_mib",
    "max_abs_err",
    "rms_err",
    "ref_err",
    "err_bound",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "temp_c",
    "power_w",
)


def make_row(base: dict, impl: str, status: str, message: str, columns=METRICS, **metrics) -> dict:
    """One row of a point: ``base`` with this implementation's outcome and the ``columns`` of ``metrics``."""
    return point_row({"tokens": math.nan, **base}, impl, status, message, columns, **metrics)


def unbuilt(base: dict, impls, exc: BaseException, progress: harness.Progress, text: str) -> list[dict]:
    """The rows of a point whose inputs or reference could not be built (out of memory, say): every
    implementation gets the status, each a progress line (``text``: the point's shape)."""
    status, message = harness.classify(exc)
    rows = []
    for impl in impls:
        rows.append(make_row(base, impl, status, f"inputs/reference: {message}"))
        progress.step(f"{impl} {text}", status)
    harness.release_memory()
    return rows


def time_call(call: Callable[[], object], spec: AttentionSpec, again: Callable | None = None) -> dict:
    """Peak extra memory of one call, then its timing and telemetry (``harness.measure``; ``again``: the
    callable of each repeat round, where it is not ``call``)."""
    return harness.measure(call, spec.warmup_ms, spec.rep_ms, again)


def native(impl: str, tensors: tuple) -> tuple:
    """The point's [B, H, N, d] tensors as ``impl`` takes them: as they are, or copied once into a peer's
    [B, N, H, d] (``peers.BNHD``; None stays None)."""
    if impl not in peers.BNHD:
        return tensors
    return tuple(None if t is None else peers.to_bnhd(t) for t in tensors)


def as_bhnd(impl: str, t: torch.Tensor) -> torch.Tensor:
    """An output or gradient of ``impl`` seen as [B, H, N, d] (a view)."""
    return peers.from_bnhd(t) if impl in peers.BNHD else t


def measure(spec: AttentionSpec, impl: str, cfg: str | None, p: Point, base: dict, timed: bool) -> dict:
    if impl == "copy-kv":
        return measure_copy(spec, (p.kv,), base, timed)
    why = peers.absent(impl)
    if why:  # an optional peer that is not installed: its row says so, nothing runs
        return make_row(base, impl, "absent", why)
    causal, dtype = spec.causal, DTYPES[spec.dtype]
    metrics: dict = {"kernel_config": cfg or ""}
    again = None  # the callable of each repeat round, where it is not the one timed (harness.measure)
    try:
        fn = implementation(impl, cfg) if cfg else implementation(impl)
        q, k, v, do = native(impl, (p.q, p.k, p.v, p.do))  # (a peer's own layout: copied before timing)
        if spec.mode == "fwd":
            out = fn(q, k, v, causal)  # first call: compiles and autotunes outside any timed region
            metrics["kernel_config"] = kernel_config(impl, spec.mode, cfg, p.q, p.k)
            got = as_bhnd(impl, out)[:1].index_select(2, p.sample)
            checks = [tolerance.check(f"{impl} output", got, p.ref, p.same, dtype)]
            del out, got

            def call():
                return fn(q, k, v, causal)

        else:
            leaves = tuple(t.detach().requires_grad_(True) for t in (q, k, v))
            out = fn(*leaves, causal)  # the forward graph, built once
            grads = torch.autograd.grad(out, leaves, do, retain_graph=spec.mode == "bwd")
            metrics["kernel_config"] = kernel_config(impl, spec.mode, cfg, p.q, p.k)
            got = as_bhnd(impl, out.detach())[:1].index_select(2, p.sample)
            checks = [tolerance.check(f"{impl} output", got, p.ref, p.same, dtype)]
            dq, dk, dv = (as_bhnd(impl, g) for g in grads)
            checks += grad_checks(impl, (dq[:1, : h_group(p)], dk[:1, :1], dv[:1, :1]), p.gate, dtype)
            del dq, dk, dv
            del grads
            if spec.mode == "bwd":

                def call():
                    return torch.autograd.grad(out, leaves, do, retain_graph=True)

                def again():  # a forward graph of its own for each repeat round: none is kept between them
                    graph = fn(*leaves, causal)
                    return lambda: torch.autograd.grad(graph, leaves, p.do, retain_graph=True)

            else:
                del out

                def call():
                    return torch.autograd.grad(fn(*leaves, causal), leaves, do)

        errors, failed = gate_metrics(checks)
        metrics.update(errors)
        if failed:
            return make_row(base, impl, "mismatch", "; ".join(c.describe() for c in failed), **metrics)
        note = p.gate.skipped if p.gate else ""
        if not timed:
            return make_row(base, impl, "ok", note, **metrics)
        metrics.update(time_call(call, spec, again))
        flops = attention_flops(
            base["batch"], base["heads"], base["seqlen_q"], base["seqlen_k"], spec.head_dim, causal, spec.mode
        )
        metrics["tflops"] = tflops(flops, metrics["ms_median"])
        if spec.experiment in spec.IO_BOUND:
            metrics["model_bytes"] = attention_io_bytes(
                base["batch"],
                base["heads"],
                base["heads_kv"],
                base["seqlen_q"],
                base["seqlen_k"],
                spec.head_dim,
                p.q.element_size(),
            )
            metrics["gbps"] = metrics["model_bytes"] / (metrics["ms_median"] * 1e-3) / 1e9
        return make_row(base, impl, "ok", note, **metrics)
    except Exception as exc:
        status, message = harness.classify(exc)
        harness.release_memory()
        return make_row(base, impl, status, message, **metrics)


def measure_copy(
    spec: AttentionSpec,
    parts: tuple[torch.Tensor, ...],
    base: dict,
    timed: bool,
    impl: str = "copy-kv",
    message: str = "",
    columns=METRICS,
) -> dict:
    """A device copy of the bytes of ``parts`` (one tensor holding them all; the point's K/V for ``copy-kv``):
    the copy bandwidth of this GPU. ``columns``: the metric columns of the caller's rows."""
    metrics: dict = {"model_bytes": 2.0 * sum(t.numel() * t.element_size() for t in parts)}  # read, written once
    try:
        src = parts[0] if len(parts) == 1 else torch.cat([t.reshape(-1) for t in parts])
        copy = src.clone()
        exact = torch.equal(copy, src)
        del copy
        metrics.update(max_abs_err=0.0 if exact else math.nan, rms_err=0.0 if exact else math.nan)
        if not exact:
            return make_row(base, impl, "mismatch", f"{impl}: the copy differs from its source", columns, **metrics)
        if timed:
            metrics.update(time_call(src.clone, spec))
            metrics["gbps"] = metrics["model_bytes"] / (metrics["ms_median"] * 1e-3) / 1e9
        return make_row(base, impl, "ok", message, columns, **metrics)
    except Exception as exc:
        status, why = harness.classify(exc)
        harness.release_memory()
        return make_row(base, impl, status, why, columns, **metrics)
