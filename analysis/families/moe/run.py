"""MoE layers: one MoE shard in, tidy rows out (the operator table, ops.csv).

A shard is one layer shape (experts E, top_k, hidden H, expert FFN width F), one dtype and one routing;
``run`` draws the SwiGLU expert weights once (``w_gate``, ``w_up [E, H, F]``, ``w_down [E, F, H]``, normal,
scaled by 1/√fan-in), then for every token count T draws ``x [T, H]`` and router logits and measures:

op ``moe-layer`` (the whole layer, ``[T, H] → [T, H]``):

- ``ours-moe``: ``kernels.moe.moe_ffn``; its stages are also timed one by one on precomputed inputs
  (rows with ``stage`` = routing: softmax + top-k; dispatch: the sort by expert and the gather of the
  token rows; gemm: the two grouped GEMMs, SwiGLU fused into the first; combine: back to token order,
  weighted sum), the time split of claim ``moe-dense-inside``;
- ``ours-moe-persistent``: ``moe_ffn(..., path="persistent")``, the layer on the candidate grouped GEMM;
- ``loop-moe``: the PyTorch loop over experts (``kernels.moe.reference.moe_ffn_reference``, same dtype);
- ``gather-moe``: per-token gathering of expert weights (``w[expert_ids]``, one copy of its expert's three
  matrices per (token, choice)) and batched products: the scattered access the article describes. Its
  memory is capped by working through the slots in chunks of at most ``gather_chunk_gib``; a point that
  would gather more than ``gather_max_gb`` in all is an ``unsupported`` row, not run;
- ``grouped-mm-moe``: our routing, dispatch and combine around ``torch._grouped_mm`` (bfloat16, CUDA, sm90+;
  elsewhere ``unsupported``);
- ``dense-ffn``: a dense SwiGLU FFN of width top_k·F: the same matrix-product FLOPs with no routing.

op ``grouped-gemm`` (the gate projection alone on the dispatched rows, ``[T·k, H] @ w_gate[e]``):
``ours-grouped`` (``kernels.moe.grouped_gemm``), ``ours-grouped-persistent`` (its ``path="persistent"``),
``torch-grouped-mm``, ``loop-grouped`` (one matmul per expert, ``reference.grouped_gemm_reference``).

Correctness gates speed: a layer's output at a sample of tokens (first and last ``check_rows // 2``) is
compared with ``moe_ffn_reference`` in float64 on those tokens (a token's output depends on that token
only), bounded by the same reference in the input dtype; the stage rows are gated by composing the stages
(that output is compared the same way); grouped GEMMs are gated on sampled rows against float64 products.
A failed gate is a ``mismatch`` row, never timed.

Metrics: TFLOP/s from ``analysis.core.flops.moe_ffn_flops`` (layers, the gemm stage) or ``gemm_flops`` (grouped
GEMM); ``model_bytes`` the expert weights touched (experts with at least one token, each read once,
``analysis.core.models.moe_expert_weight_bytes``; dense-ffn: its weights; gather-moe: the gathered bytes written
and read), ``gbps`` those per median time: the bandwidth view that matters at small token counts.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from analysis.core import harness, models, points
from analysis.core.flops import gemm_flops, moe_ffn_flops
from analysis.core.provenance import row_provenance
from analysis.families._shared.operator_rows import failed_row, make_row
from analysis.families.moe.plan import IMPLS as MOE_IMPLS
from analysis.families.moe.plan import STAGES, MoeSpec

log = logging.getLogger(__name__)


def routing_logits(tokens: int, experts: int, routing: str, zipf_s: float, gen, device) -> torch.Tensor:
    """Router logits ``[tokens, experts]`` (float32) whose top-k choice follows the routing law.

    logits = log p + Gumbel noise, so that the top-1 choice is a draw from p and the top-k a draw of k
    experts without replacement (the Gumbel-top-k trick). ``uniform``: p equal; ``zipf``: the expert of
    rank r (ranks in a seeded random order) has p ∝ r^(-zipf_s).
    """
    u = torch.rand((tokens, experts), generator=gen, device=device, dtype=torch.float32)
    gumbel = -torch.log(-torch.log(u.clamp(1e-12, 1 - 1e-7)))
    if routing == "uniform":
        return gumbel
    if routing != "zipf":
        raise ValueError(f"unknown routing {routing!r}")
    rank = torch.randperm(experts, generator=gen, device=device).to(torch.float32) + 1
    logp = -zipf_s * torch.log(rank)
    return (logp - torch.logsumexp(logp, 0)) + gumbel


def _grouped_mm(a, b, offsets):
    if not hasattr(torch, "_grouped_mm"):
        raise NotImplementedError("this PyTorch has no torch._grouped_mm")
    if a.device.type != "cuda" or a.dtype != torch.bfloat16:
        raise NotImplementedError("torch._grouped_mm is measured with bfloat16 on a CUDA GPU only")
    return torch._grouped_mm(a, b, offs=offsets)


class _Layer:
    """The expert weights of a shard and every implementation of the layer over them."""

    def __init__(self, spec: MoeSpec, dtype, device, gen):
        e, h, f = spec.experts, spec.hidden, spec.ffn
        self.spec, self.dtype = spec, dtype
        self.wg = points.randn((e, h, f), gen, dtype, device, scale=h**-0.5)
        self.wu = points.randn((e, h, f), gen, dtype, device, scale=h**-0.5)
        self.wd = points.randn((e, f, h), gen, dtype, device, scale=f**-0.5)
        self.dense = None
        if "dense-ffn" in spec.impls:
            kf = spec.top_k * f
            self.dense = (
                points.randn((h, kf), gen, dtype, device, scale=h**-0.5),
                points.randn((h, kf), gen, dtype, device, scale=h**-0.5),
                points.randn((kf, h), gen, dtype, device, scale=kf**-0.5),
            )

    # --- the layer, whole -------------------------------------------------------------------------------
    def ours(self, x, logits, path=None):
        from kernels.moe import moe_ffn

        return moe_ffn(x, logits, self.wg, self.wu, self.wd, self.spec.top_k, path=path)

    def reference(self, x, logits, dtype):
        from kernels.moe import reference

        return reference.moe_ffn_reference(x, logits, self.wg, self.wu, self.wd, self.spec.top_k, dtype=dtype)

    def gather_rows(self) -> int:
        """Slots per chunk of gather-moe: its three gathered matrices stay under gather_chunk_gib."""
        per = 3 * self.spec.hidden * self.spec.ffn * self.wg.element_size()
        return max(1, int(self.spec.gather_chunk_gib * 2**30 // per))

    def gather(self, x, logits):
        from kernels.moe import routing

        s = self.spec
        need = models.gather_moe_bytes(x.shape[0], s.top_k, s.hidden, s.ffn, self.wg.element_size())
        if need > s.gather_max_gb * 1e9:
            raise NotImplementedError(
                f"gather-moe would gather {need / 1e9:.0f} GB of expert weights (written and read), above "
                f"moe.gather_max_gb = {s.gather_max_gb:g}: not run"
            )
        weights, ids = routing.route(logits, s.top_k)
        flat = ids.reshape(-1)
        xr = x.repeat_interleave(s.top_k, 0).unsqueeze(1)  # slot t·k + j, [T·k, 1, H]
        ys = torch.empty((flat.numel(), s.hidden), dtype=x.dtype, device=x.device)
        step = self.gather_rows()
        for i in range(0, flat.numel(), step):
            e, xc = flat[i : i + step], xr[i : i + step]
            hidden = F.silu(torch.bmm(xc, self.wg[e])) * torch.bmm(xc, self.wu[e])
            ys[i : i + step] = torch.bmm(hidden, self.wd[e]).squeeze(1)
        return (ys.view(x.shape[0], s.top_k, s.hidden).float() * weights.unsqueeze(-1)).sum(1).to(x.dtype)

    def grouped_mm(self, x, logits):
        from kernels.moe import routing

        weights, ids = routing.route(logits, self.spec.top_k)
        plan = routing.dispatch(ids, self.spec.experts)
        xs = routing.gather(x, plan)
        off = plan.expert_offsets
        hidden = F.silu(_grouped_mm(xs, self.wg, off)) * _grouped_mm(xs, self.wu, off)
        return routing.combine(_grouped_mm(hidden, self.wd, off), weights, plan)

    def dense_ffn(self, x, dtype=None):
        a, b, c = (w if dtype is None else w.to(dtype) for w in self.dense)
        x = x if dtype is None else x.to(dtype)
        return (F.silu(x @ a) * (x @ b)) @ c

    # --- the stages of ours -----------------------------------------------------------------------------
    def gemms(self, xs, plan):
        from kernels.moe.ffn import expert_ffn  # the very step moe_ffn runs, timed alone

        return expert_ffn(xs, plan, self.wg, self.wu, self.wd)


def run(
    spec: MoeSpec,
    env: dict,
    device: str = "cuda",
    log_line: Callable[[str], None] = log.info,
    files=None,
    timed: bool = True,
) -> list[dict]:
    """Measure every (tokens, implementation) point of ``spec``; rows of the operator table (ops.csv)."""
    dtype = points.DTYPES[spec.dtype]
    prov = row_provenance(env)
    base = dict(
        experiment=spec.experiment,
        family="moe",
        dtype=spec.dtype,
        model=spec.model,
        n=spec.ffn,
        k=spec.hidden,
        group_size=math.nan,
        experts=spec.experts,
        top_k=spec.top_k,
        routing=spec.routing,
        stage="total",
        timed=timed,
        **prov,
    )
    progress = harness.Progress(spec.points(), log_line)
    gen = points.generator(device, spec.seed)
    rows: list[dict] = []

    def fail_all(t_base: dict, status: str, message: str) -> None:
        for impl in spec.impls:
            stages = STAGES if impl == "ours-moe" else ()
            for stage in (*stages, "total"):
                rows.append(make_row({**t_base, "op": MOE_IMPLS[impl], "stage": stage}, impl, status, message))
                progress.step(f"{impl} {stage} T={t_base['tokens']}", status)

    try:
        layer = _Layer(spec, dtype, device, gen)
    except Exception as exc:
        status, message = harness.classify(exc)
        for t in spec.tokens:
            fail_all({**base, "tokens": t, "m": t * spec.top_k}, status, f"weights: {message}")
        harness.release_memory()
        return rows

    for t in spec.tokens:
        tbase = {**base, "tokens": t, "m": t * spec.top_k}
        try:
            point = _Point.build(layer, spec, t, dtype, device, gen)
        except Exception as exc:
            status, message = harness.classify(exc)
            fail_all(tbase, status, f"inputs/reference: {message}")
            harness.release_memory()
            continue
        rounds = harness.Rounds(spec.spread_rounds, rows)  # the point's repeat rounds (the harness's step 6)
        for impl in spec.impls:
            new = _measure(layer, point, impl, {**tbase, "op": MOE_IMPLS[impl]}, timed)
            for row in new:
                rows.append(row)
                extra = ""
                if row["status"] == "ok" and timed:
                    extra = f" {row['ms_median']:.3f} ms {row['tflops']:.1f} TFLOP/s"
                progress.step(
                    f"{impl} {row['stage']} T={t} {spec.routing}", row["status"] + extra + points.short(row["message"])
                )
        rounds.run()
        del point
        harness.release_memory()
    return rows


class _Point:
    """Inputs and references of one token count, built before anything is measured."""

    @classmethod
    def build(cls, layer: _Layer, spec: MoeSpec, t: int, dtype, device, gen) -> _Point:
        from kernels.moe import routing

        p = cls()
        p.x = points.randn((t, spec.hidden), gen, dtype, device)
        p.logits = routing_logits(t, spec.experts, spec.routing, spec.zipf_s, gen, device)
        p.sample = points.sample_rows(t, spec.check_rows).to(device)
        xs, ls = p.x.index_select(0, p.sample), p.logits.index_select(0, p.sample)
        p.ref = layer.reference(xs, ls, torch.float64)
        p.same = layer.reference(xs, ls, dtype)
        # the stages' inputs, computed once, and the grouped GEMM's rows
        p.weights, p.ids = routing.route(p.logits, spec.top_k)
        p.plan = routing.dispatch(p.ids, spec.experts)
        p.xs = routing.gather(p.x, p.plan)
        p.touched = int((p.plan.counts > 0).sum().item())
        p.row_sample = points.sample_rows(p.xs.shape[0], spec.check_rows).to(device)
        p.grouped_ref, p.grouped_same = _grouped_refs(layer, p, dtype)
        if layer.dense is not None:
            p.dense_ref = layer.dense_ffn(xs.double(), torch.float64)
            p.dense_same = layer.dense_ffn(xs)
        return p


def _grouped_refs(layer: _Layer, p: _Point, dtype):
    """Float64 and same-precision ``xs[r] @ w_gate[e(r)]`` at the sampled rows (``reference``'s per-expert
    products on the sampled rows, whose expert segments end where the sorted sample crosses each offset)."""
    from kernels.moe import reference

    rows = p.xs.index_select(0, p.row_sample)
    ends = torch.searchsorted(p.row_sample, p.plan.expert_offsets.long())
    return (
        reference.grouped_gemm_reference(rows, layer.wg, ends, torch.float64),
        reference.grouped_gemm_reference(rows, layer.wg, ends, dtype),
    )


def _measure(layer: _Layer, p: _Point, impl: str, base: dict, timed: bool) -> list[dict]:
    spec, dtype = layer.spec, layer.dtype
    elem = layer.wg.element_size()
    t = base["tokens"]
    layer_flops = moe_ffn_flops(t, spec.top_k, spec.hidden, spec.ffn)
    expert_bytes = models.moe_expert_weight_bytes(p.touched, spec.hidden, spec.ffn, elem)
    metrics: dict = {}
    if MOE_IMPLS[impl] == "grouped-gemm":
        return [_measure_grouped(layer, p, impl, base, timed)]
    calls = {
        "ours-moe": lambda: layer.ours(p.x, p.logits),
        "ours-moe-persistent": lambda: layer.ours(p.x, p.logits, "persistent"),
        "loop-moe": lambda: layer.reference(p.x, p.logits, None),  # the per-expert loop in x's dtype
        "gather-moe": lambda: layer.gather(p.x, p.logits),
        "grouped-mm-moe": lambda: layer.grouped_mm(p.x, p.logits),
        "dense-ffn": lambda: layer.dense_ffn(p.x),
    }
    if impl == "dense-ffn":
        metrics["model_bytes"] = 3 * models.dense_weight_bytes(spec.top_k * spec.ffn, spec.hidden, elem)
        ref, same = p.dense_ref, p.dense_same
    else:
        metrics["model_bytes"] = expert_bytes
        if impl == "gather-moe":
            metrics["model_bytes"] = models.gather_moe_bytes(t, spec.top_k, spec.hidden, spec.ffn, elem)
            metrics["kernel_config"] = f"chunk={layer.gather_rows()} slots"
        ref, same = p.ref, p.same
    call = calls[impl]
    stage_rows: list[dict] = []
    try:
        out = call()  # first call: compiles outside any timed region
        errors, failure = points.gate(f"{impl} output", out.index_select(0, p.sample), ref, same, dtype)
        metrics.update(errors)
        del out
        if impl == "ours-moe":
            stage_rows = _stages(layer, p, base, timed, ref, same, layer_flops, expert_bytes)
        if failure:
            return [*stage_rows, make_row(base, impl, "mismatch", failure, **metrics)]
        if timed:
            metrics.update(harness.measure(call, spec.warmup_ms, spec.rep_ms))
            metrics["tflops"] = points.rate(layer_flops, metrics["ms_median"], 1e12)
            metrics["gbps"] = points.rate(metrics["model_bytes"], metrics["ms_median"], 1e9)
        return [*stage_rows, make_row(base, impl, "ok", "", **metrics)]
    except Exception as exc:
        status, message = harness.classify(exc)
        harness.release_memory()
        if impl == "ours-moe" and not stage_rows:
            stage_rows = [make_row({**base, "stage": s}, impl, status, message) for s in STAGES]
        return [*stage_rows, make_row(base, impl, status, message, **metrics)]


def _stages(layer: _Layer, p: _Point, base: dict, timed: bool, ref, same, flops, gemm_bytes) -> list[dict]:
    """Rows of ours-moe's stages, each timed alone on inputs computed beforehand; gated by composing them
    (the stored route, dispatch and gather that the stage timings use, not moe_ffn's own)."""
    from kernels.moe import routing

    spec = layer.spec
    ys = layer.gemms(p.xs, p.plan)
    composed = routing.combine(ys, p.weights, p.plan)
    errors, failure = points.gate(
        "ours-moe stages composed", composed.index_select(0, p.sample), ref, same, layer.dtype
    )
    calls = {
        "routing": lambda: routing.route(p.logits, spec.top_k),
        "dispatch": lambda: routing.gather(p.x, routing.dispatch(p.ids, spec.experts)),
        "gemm": lambda: layer.gemms(p.xs, p.plan),
        "combine": lambda: routing.combine(ys, p.weights, p.plan),
    }
    rows = []
    for stage, call in calls.items():
        sbase = {**base, "stage": stage}
        metrics = dict(errors)
        if stage == "gemm":
            metrics["model_bytes"] = gemm_bytes
        if failure:
            rows.append(make_row(sbase, "ours-moe", "mismatch", failure, **metrics))
            continue
        try:
            if timed:
                metrics.update(harness.measure(call, spec.warmup_ms, spec.rep_ms))
                if stage == "gemm":
                    metrics["tflops"] = points.rate(flops, metrics["ms_median"], 1e12)
                    metrics["gbps"] = points.rate(gemm_bytes, metrics["ms_median"], 1e9)
            rows.append(make_row(sbase, "ours-moe", "ok", "", **metrics))
        except Exception as exc:
            rows.append(failed_row(sbase, "ours-moe", exc, **metrics))
    return rows


def _measure_grouped(layer: _Layer, p: _Point, impl: str, base: dict, timed: bool) -> dict:
    from kernels.moe import grouped_gemm, reference

    spec = layer.spec
    off = p.plan.expert_offsets
    calls = {
        "ours-grouped": lambda: grouped_gemm(p.xs, layer.wg, off, check_offsets=False),
        "ours-grouped-persistent": lambda: grouped_gemm(p.xs, layer.wg, off, check_offsets=False, path="persistent"),
        "torch-grouped-mm": lambda: _grouped_mm(p.xs, layer.wg, off),
        "loop-grouped": lambda: reference.grouped_gemm_reference(p.xs, layer.wg, off),
    }
    call = calls[impl]
    nbytes = models.moe_expert_weight_bytes(p.touched, spec.hidden, spec.ffn, layer.wg.element_size(), matrices=1)
    metrics: dict = {"model_bytes": nbytes}
    try:
        out = call()
        errors, failure = points.gate(
            f"{impl} output", out.index_select(0, p.row_sample), p.grouped_ref, p.grouped_same, layer.dtype
        )
        metrics.update(errors)
        del out
        if failure:
            return make_row(base, impl, "mismatch", failure, **metrics)
        if timed:
            metrics.update(harness.measure(call, spec.warmup_ms, spec.rep_ms))
            flops = gemm_flops(p.xs.shape[0], spec.ffn, spec.hidden)
            metrics["tflops"] = points.rate(flops, metrics["ms_median"], 1e12)
            metrics["gbps"] = points.rate(nbytes, metrics["ms_median"], 1e9)
        return make_row(base, impl, "ok", "", **metrics)
    except Exception as exc:
        return failed_row(base, impl, exc, **metrics)
