"""FP8 attention experiments: the speed of the FP8 kernel and what FP8 costs in accuracy.

The FP8 family's experiments (``analysis.families.fp8.plan``), on the attention family's points and with the
attention-like families' measuring parts (``analysis.families._shared.attention_measure``) for the 16-bit
implementations:

- ``fp8-speed``: forward TFLOP/s of our FP8 kernel (``ours-fp8-tensor``, ``ours-fp8-block``; inputs
  quantised before timing, as FlashAttention-3 reports its kernel) against our bf16 FA-2 and SDPA's
  backends on the same bf16 inputs, in the FA-2 setting's shapes (batch × N = ``tokens``, heads = hidden /
  d), and this run's GEMM ceilings at every point: ``fp8-mm`` (``torch._scaled_mm``, e4m3 in, bf16 out)
  and ``bf16-mm`` (``torch.matmul``), both 8192 × 8192 × 8192 (their rows keep the point's shape columns;
  the message names the GEMM). Our FP8 rows are gated against float64 attention of the dequantised inputs,
  bounded by a float64 replica of P's e4m3 rounding on the same rows
  (``reference.p_rounded_attention_rows``); the others by the attention grid's usual gate. Also the fused
  quantiser alone (``fp8-quantize-<granularity>``: ``fp8.quantize_qkv`` as ``fp8.attention`` calls it,
  ``model_bytes`` its byte floor, ``gbps``) and ``copy-qkv``, a device copy of the same Q, K, V bytes:
  the copy bandwidth the floor is taken at (``analysis.families.fp8.summary``). Where the peers are installed,
  ``cudnn-fp8``: cuDNN's FP8 attention forward (``analysis.families._shared.peers``) on the per-tensor e4m3
  inputs of ``ours-fp8-tensor`` (quantised before timing, by the same ``fp8.quantize``), its e4m3 output
  dequantised for the gate: float64 attention of the dequantised inputs, bounded by the same replica of P's
  rounding with the output rounded to e4m3 at cuDNN's output scale too, and the 16-bit inputs' floor (FP8's
  tolerance, as our rows get it); not installed, an ``absent`` row.
- ``fp8-accuracy``: nothing timed; for each input distribution (``inputs``: ``normal``, N(0, 1);
  ``outliers``, FlashAttention-3's setting, N(0, 1) plus N(0, 100) on a 0.1 % Bernoulli mask, for Q, K
  and V; ``large``, V × 1000, past e4m3's ±448; ``small``, Q, K, V × 1/1000, below its smallest normal),
  the error of every implementation against float64 attention of the very same (un-quantised) inputs on
  ``check_rows`` sampled query rows of every head: ``rms_err`` and ``max_abs_err``, no gate (the error
  is the measurement). Our FP8 rows also get ``p_underflow``, the fraction of the visible entries of
  P = exp(S − rowmax) that e4m3 flushes to zero after P's scale (below half the smallest subnormal,
  2⁻¹⁰), and ``p_mass_lost``, their share of the row sums; computed in float64 on the sampled rows with
  the final row maximum, an upper bound on the kernel's (whose running maximum is never above the final
  one, so its P entries are never smaller).
- ``fp8-ablation``: FA-3's ablation on e4m3: forward TFLOP/s of the FP8 kernel on FA-3's full schedule
  (``ours-fp8-block-fa3``) and with each of its techniques switched off (``ours-fp8-block-<switch>``, the
  switches of ``fa3-ablation``), inputs quantised before timing, beside our bf16 FA-3 (and its variants) on
  the same bf16 inputs; gated as ``fp8-speed``'s rows.

Implementation names ``ours-fp8-<granularity>[-rot][-p1][-<schedule>][-triton][-e2e]``: the scales'
granularity (``none``: cast without scaling, saturating), ``-rot`` incoherent processing (Q and K times one
random Hadamard-based orthogonal matrix before quantising), ``-p1`` P cast to e4m3 without its scale of 256,
``-<schedule>`` the FA-3 kernel on that schedule of ``fa3.SCHEDULES``, ``fa3`` (FA-3's full one) or a
technique off from it (``no-warp-specialize``, ``no-pingpong``, ``no-overlap``, ``no-tma``; without one,
FP8's default ``fa3.FP8_SCHEDULE``), ``-triton`` the portable Triton kernel (else the FA-3 kernel on
Hopper), ``-e2e`` ``fp8.attention`` on the 16-bit inputs with the fused quantiser timed (``FP8Impl``).
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable

import torch

from analysis.core import harness
from analysis.core.flops import attention_flops, gemm_flops, tflops
from analysis.core.points import DTYPES, generator, sample_rows, short
from analysis.families._shared import attention_measure as att
from analysis.families._shared import peers
from analysis.families._shared.fa3_ablation import FA3_ABLATIONS
from analysis.families.fp8.plan import COPY_IMPL, FP8_GRANULARITIES, Fp8Spec
from kernels import tolerance
from kernels.attention import reference

# an FP8 row's metrics: an attention row's and, for fp8-accuracy, how much of P e4m3 flushes to zero
METRICS = att.METRICS + ("p_underflow", "p_mass_lost")
CEILING_N = 8192  # the ceiling GEMMs are CEILING_N³
_GEMM_REL_BOUND = 2.0**-7  # the ceiling GEMMs' gate: about the bf16 output's rounding; a wrong GEMM is far beyond
OUTLIER_RATE = 1e-3  # FlashAttention-3's outlier features: a 0.1 % Bernoulli mask ...
OUTLIER_STD = 10.0  # ... of N(0, 100)
LARGE_V = 1000.0  # large: V × 1000, past e4m3's ±448 (Q and K stay N(0, 1): a well-conditioned softmax)
SMALL = 1e-3  # small: Q, K, V × 1/1000, mostly below e4m3's smallest normal 2⁻⁶ (the softmax is near uniform)


class FP8Impl(typing.NamedTuple):
    """What an ``ours-fp8-…`` name asks for (``analysis.families.fp8.plan``)."""

    granularity: str
    rotate: bool
    p_scale: float
    kernel: str  # fp8.KERNELS: "auto" (FA-3 on Hopper) or "triton"
    e2e: bool  # fp8.attention on the 16-bit inputs, quantisation timed
    # the FA-3 kernel's schedule: None for FP8's default (fa3.FP8_SCHEDULE), else a name of fa3.SCHEDULES:
    # "fa3" (FA-3's full schedule) or one technique switched off from it
    schedule: str | None = None


def parse_impl(name: str) -> FP8Impl:
    """``ours-fp8-<granularity>[-rot][-p1][-<schedule>][-triton][-e2e]`` → its ``FP8Impl``."""
    from kernels.attention import fp8

    rest = name.removeprefix("ours-fp8-")
    e2e = rest.endswith("-e2e")
    rest = rest.removesuffix("-e2e")
    kernel = "triton" if rest.endswith("-triton") else "auto"
    rest = rest.removesuffix("-triton")
    schedule = next((a for a in ("fa3", *FA3_ABLATIONS) if rest.endswith(f"-{a}")), None)
    if schedule is not None:
        if kernel == "triton":
            raise ValueError(f"{name!r}: a schedule ({schedule}) is the FA-3 kernel's, not Triton's")
        rest = rest.removesuffix(f"-{schedule}")
    p_scale = fp8.P_SCALE
    if rest.endswith("-p1"):
        rest, p_scale = rest.removesuffix("-p1"), 1.0
    rotate = rest.endswith("-rot")
    rest = rest.removesuffix("-rot")
    if not name.startswith("ours-fp8-") or rest not in FP8_GRANULARITIES:
        raise ValueError(f"not an FP8 implementation name: {name!r}")
    return FP8Impl(rest, rotate, p_scale, kernel, e2e, schedule)


def make_inputs(kind: str, shapes, dtype: torch.dtype, device, gen: torch.Generator) -> list[torch.Tensor]:
    """Q, K, V of the given shapes drawn from the ``kind`` distribution (module docstring), in ``dtype``."""
    out = []
    for shape in shapes:
        x = torch.randn(shape, generator=gen, dtype=torch.float32, device=device)
        if kind == "outliers":
            mask = torch.rand(shape, generator=gen, device=device) < OUTLIER_RATE
            x = x + mask * torch.randn(shape, generator=gen, dtype=torch.float32, device=device) * OUTLIER_STD
        elif kind == "large" and len(out) == 2:  # V only
            x = x * LARGE_V
        elif kind == "small":
            x = x * SMALL
        elif kind not in ("normal", "large"):
            raise ValueError(f"unknown inputs {kind!r}")
        out.append(x.to(dtype))
    return out


class Quantised:
    """One FP8 implementation: its inputs quantised once (untimed) and its call: the kernel on them, or with
    ``-e2e`` ``fp8.attention`` on the 16-bit inputs (the same quantisation and kernel, timed together)."""

    def __init__(self, name: str, q, k, v, causal: bool):
        from kernels.attention import fp8

        impl = parse_impl(name)
        self.granularity, self.rotate, self.p_scale, self.e2e = impl.granularity, impl.rotate, impl.p_scale, impl.e2e
        self.kernel = fp8.kernel_for(q.device, q.shape[-1], impl.kernel)
        self.schedule = impl.schedule  # (forward_quantized refuses a switch off the FA-3 kernel)
        self.blocks = fp8.blocks(self.kernel, q.shape[-1])
        self.causal = causal
        self.inputs = (q, k, v)
        # the FA-3 kernel's V straight from the quantiser, in its own layout (as fp8.attention makes it)
        self.tensors = fp8.quantize_qkv(
            q, k, v, self.granularity, blocks=self.blocks, rotate=self.rotate, fa3_layout=self.kernel == "fa3"
        )
        self.out_dtype = q.dtype

    def __call__(self) -> torch.Tensor:
        from kernels.attention import fp8

        if self.e2e:
            return fp8.attention(
                *self.inputs,
                self.causal,
                granularity=self.granularity,
                rotate=self.rotate,
                p_scale=self.p_scale,
                kernel=self.kernel,
                schedule=self.schedule,
            )
        q8, k8, v8, qs, ks, vs = self.tensors
        q_block, kv_block = self.blocks
        return fp8.forward_quantized(
            q8,
            k8,
            v8,
            qs,
            ks,
            vs,
            self.causal,
            q_block=q_block,
            kv_block=kv_block,
            out_dtype=self.out_dtype,
            check_scale_values=False,
            p_scale=self.p_scale,
            kernel=self.kernel,
            schedule=self.schedule,
        )

    def dequantised(self, batch: slice = slice(0, 1)) -> tuple[torch.Tensor, ...]:
        """Q, K, V as the kernel sees them (rotated Q, K where rotated), float32, for ``batch``."""
        from kernels.attention import fp8

        q8, k8, v8, qs, ks, vs = self.tensors
        v8 = v8 if isinstance(v8, torch.Tensor) else v8.rows()  # (fa3.FP8Values: back in key order)
        q_block, kv_block = self.blocks
        return tuple(
            fp8.dequantize(t[batch], s[batch] if s.dim() else s, b)
            for t, s, b in zip((q8, k8, v8), (qs, ks, vs), (q_block, kv_block, kv_block), strict=True)
        )

    def config_text(self) -> str:
        from kernels.attention import fa3, fp8

        d = self.inputs[0].shape[-1]
        tiles = fa3.config_in_effect(d, fp8=True) if self.kernel == "fa3" else fp8.config_in_effect(d)
        rot = ", rotated" if self.rotate else ""
        rot += f", schedule={self.schedule or fa3.FP8_SCHEDULE}" if self.kernel == "fa3" else ""
        e2e = ", quantised in the call (fused quantiser)" if self.e2e else ""
        return f"{self.kernel}: {tiles}, granularity={self.granularity}{rot}, p_scale={self.p_scale:g}{e2e}"


def make_row(base: dict, impl: str, status: str, message: str, **metrics) -> dict:
    return att.make_row(base, impl, status, message, METRICS, **metrics)


def run(spec: Fp8Spec, env: dict, device: str, log_line: Callable[[str], None], files=None) -> list[dict]:
    """Measure every point of an ``fp8-speed``, ``fp8-ablation`` or ``fp8-accuracy`` shard (rows of the
    attention table; ``files`` is not used)."""
    from analysis.core.provenance import row_provenance

    timed = spec.experiment != "fp8-accuracy" and device != "cpu"
    dtype = DTYPES[spec.dtype]
    prov = row_provenance(env)
    progress = harness.Progress(spec.points(), log_line)
    gen = generator(device, spec.seed)
    rows: list[dict] = []
    for i in range(len(spec.seqlens)):
        b, h, nq, nk = spec.shape(i)
        hk = spec.kv_heads(h)
        base = att.base_row(spec, prov, timed, "fp8", batch=b, heads=h, heads_kv=hk, seqlen_q=nq, seqlen_k=nk)
        text = f"B={b} H={h} N={nq} d={spec.head_dim} causal={spec.causal} {spec.dtype} inputs={spec.inputs}"
        try:
            q, k, v = make_inputs(
                spec.inputs,
                [(b, h, nq, spec.head_dim), (b, hk, nk, spec.head_dim), (b, hk, nk, spec.head_dim)],
                dtype,
                device,
                gen,
            )
            sample = sample_rows(nq, spec.check_rows).to(device)
            ref = reference.reference_attention(q[:1], k[:1], v[:1], spec.causal, rows=sample)
        except Exception as exc:
            status, message = harness.classify(exc)
            for impl in spec.impls:
                rows.append(make_row(base, impl, status, f"inputs/reference: {message}"))
                progress.step(f"{impl} {text}", status)
            harness.release_memory()
            continue
        point = None  # the attention grid's point (same-precision reference) for the 16-bit impls, built once
        rounds = harness.Rounds(spec.spread_rounds, rows)  # the point's repeat rounds (the harness's step 6)
        for impl in spec.impls:
            if spec.experiment == "fp8-accuracy":
                row = _accuracy(spec, impl, q, k, v, sample, ref, base)
            elif impl in ("fp8-mm", "bf16-mm"):
                row = _ceiling(spec, impl, base, device, timed)
            elif impl.startswith("fp8-quantize-"):
                row = _quantizer(spec, impl, q, k, v, base, timed)
            elif impl == COPY_IMPL:  # the copy bandwidth the quantiser's byte floor is taken at
                row = att.measure_copy(
                    spec,
                    (q, k, v),
                    base,
                    timed,
                    COPY_IMPL,
                    "a device copy of the point's Q, K and V bytes (the copy bandwidth)",
                    METRICS,
                )
            elif impl.startswith("ours-fp8-"):
                row = _speed_fp8(spec, impl, q, k, v, sample, base, timed)
            elif impl in peers.PEERS and spec.experiment == "fp8-speed":  # cudnn-fp8
                row = _speed_cudnn(spec, impl, q, k, v, sample, base, timed)
            else:
                if point is None:  # kv (copy-kv's tensor) is not needed: no copy-kv here
                    same = reference.naive_attention_rows(q[:1], k[:1], v[:1], sample, spec.causal)
                    point = att.Point(q, k, v, None, sample, ref, same)
                row = att.measure(spec, impl, None, point, base, timed)
            rows.append(row)
            done = row["status"] == "ok" and math.isfinite(row["tflops"])
            extra = f" {row['tflops']:.1f} TFLOP/s" if done else ""
            extra += f" rms {row['rms_err']:.2e}" if spec.experiment == "fp8-accuracy" else ""
            progress.step(f"{impl} {text}", row["status"] + extra + short(row["message"]))
        rounds.run()
        del q, k, v, point
        harness.release_memory()
    return rows


def _speed_fp8(spec: Fp8Spec, impl: str, q, k, v, sample, base: dict, timed: bool) -> dict:
    metrics: dict = {}
    try:
        call = Quantised(impl, q, k, v, spec.causal)
        metrics["kernel_config"] = call.config_text()
        out = call()
        qd, kd, vd = call.dequantised()
        exact = reference.reference_attention(qd, kd, vd, spec.causal, rows=sample)
        same = reference.p_rounded_attention_rows(qd, kd, vd, sample, spec.causal, p_scale=call.p_scale)
        check = tolerance.check(f"{impl} output", out[:1].index_select(2, sample), exact, same, out.dtype)
        del out, qd, kd, vd
        metrics.update(max_abs_err=check.max_abs, rms_err=check.rms, ref_err=check.ref_err, err_bound=check.bound)
        if not check.ok:
            return make_row(base, impl, "mismatch", check.describe(), **metrics)
        timing = (
            "end to end: quantisation and kernel timed together"
            if call.e2e
            else "inputs quantised before timing (the kernel alone)"
        )
        note = timing + "; error against float64 of the dequantised inputs"
        return _gated_row(spec, impl, call, base, note, metrics, timed)
    except Exception as exc:
        status, message = harness.classify(exc)
        harness.release_memory()
        return make_row(base, impl, status, message, **metrics)


def _gated_row(spec: Fp8Spec, impl: str, call, base: dict, note: str, metrics: dict, timed: bool) -> dict:
    """The ok row of a forward point that passed its gate: timed, with the forward's TFLOP/s, unless untimed."""
    if not timed:
        return make_row(base, impl, "ok", note, **metrics)
    metrics.update(att.time_call(call, spec))
    flops = attention_flops(
        base["batch"], base["heads"], base["seqlen_q"], base["seqlen_k"], spec.head_dim, spec.causal, "fwd"
    )
    metrics["tflops"] = tflops(flops, metrics["ms_median"])
    return make_row(base, impl, "ok", note, **metrics)


def _speed_cudnn(spec: Fp8Spec, impl: str, q, k, v, sample, base: dict, timed: bool) -> dict:
    """cuDNN's FP8 attention (``peers.CudnnFP8``) on Q, K, V quantised per tensor before timing, as
    ``ours-fp8-tensor``'s; gated like our FP8 rows, its e4m3 output's rounding in the replica (module
    docstring)."""
    why = peers.absent(impl)
    if why:
        return make_row(base, impl, "absent", why)
    from kernels.attention import fp8

    metrics: dict = {"kernel_config": peers.kernel_config(impl)}
    try:
        (q8, qs), (k8, ks), (v8, vs) = (fp8.quantize(x, "tensor") for x in (q, k, v))
        call = peers.CudnnFP8(q8, k8, v8, qs, ks, vs, spec.causal)
        metrics["kernel_config"] += f", per-tensor descales, P scale {peers.P_SCALE:g}, e4m3 output ×{call.out_scale:g}"
        out = call()[:1].index_select(2, sample).double() / call.out_scale  # (graph built above, untimed)
        qd, kd, vd = (fp8.dequantize(x8[:1], s) for x8, s in ((q8, qs), (k8, ks), (v8, vs)))
        exact = reference.reference_attention(qd, kd, vd, spec.causal, rows=sample)
        same = reference.p_rounded_attention_rows(qd, kd, vd, sample, spec.causal, p_scale=peers.P_SCALE)
        same = reference.round_p(same, call.out_scale)  # the output's e4m3 rounding, at cuDNN's output scale
        check = tolerance.check(f"{impl} output", out, exact, same, q.dtype)
        del out, qd, kd, vd
        metrics.update(max_abs_err=check.max_abs, rms_err=check.rms, ref_err=check.ref_err, err_bound=check.bound)
        if not check.ok:
            return make_row(base, impl, "mismatch", check.describe(), **metrics)
        note = (
            "inputs quantised per tensor before timing (the kernel alone), e4m3 output; error against float64 of "
            "the dequantised inputs"
        )
        return _gated_row(spec, impl, call, base, note, metrics, timed)
    except Exception as exc:
        status, message = harness.classify(exc)
        harness.release_memory()
        return make_row(base, impl, status, message, **metrics)


def _ceiling(spec: Fp8Spec, impl: str, base: dict, device, timed: bool) -> dict:
    """One GEMM of CEILING_N³: the FP8 (``torch._scaled_mm``) or bf16 (``torch.matmul``) tensor-core rate."""
    n = CEILING_N if device != "cpu" else 64
    what = "torch._scaled_mm e4m3 × e4m3 → bf16" if impl == "fp8-mm" else "torch.matmul bf16"
    message = f"{what}, {n}×{n}×{n}: this run's GEMM ceiling (the shape columns are the point's)"
    metrics: dict = {}
    try:
        if impl == "fp8-mm" and device != "cpu":  # no FP8 tensor cores: TypeError, an unsupported row
            from kernels.attention.fp8 import require_fp8_tensor_cores

            require_fp8_tensor_cores(torch.cuda.get_device_capability(device), str(device))
        gen = torch.Generator(device=device).manual_seed(1)
        a = torch.randn((n, n), generator=gen, device=device)
        b = torch.randn((n, n), generator=gen, device=device)
        if impl == "fp8-mm":
            a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t().contiguous().t()  # B column-major
            one = torch.ones((), device=device)

            def call():
                return torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16)

            exact = a8[:64].double() @ b8.double()
        else:
            a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)

            def call():
                return a16 @ b16

            exact = a16[:64].double() @ b16.double()
        got = call()[:64].double()
        rel = ((got - exact).norm() / exact.norm()).item()
        metrics.update(rms_err=rel, err_bound=_GEMM_REL_BOUND)
        if not rel <= _GEMM_REL_BOUND:
            return make_row(base, impl, "mismatch", f"{message}; relative error {rel:.2e}", **metrics)
        if not timed:
            return make_row(base, impl, "ok", message, **metrics)
        metrics.update(att.time_call(call, spec))
        metrics["tflops"] = tflops(gemm_flops(n, n, n), metrics["ms_median"])
        return make_row(base, impl, "ok", message, **metrics)
    except Exception as exc:
        status, msg = harness.classify(exc)
        harness.release_memory()
        return make_row(base, impl, status, f"{message}: {msg}", **metrics)


# e4m3 rounds to nearest: within half a step of the value, 2⁻⁴ of it for normals, 2⁻¹⁰ (of the scale) below;
# the slack covers the fp32 roundings of dividing by the scale and of the dequantised product at a tie
_E4M3_HALF_STEP, _E4M3_HALF_SUBNORMAL, _SLACK = 2.0**-4, 2.0**-10, 1 + 2.0**-10


def _quantizer(spec: Fp8Spec, impl: str, q, k, v, base: dict, timed: bool) -> dict:
    """``fp8.quantize_qkv`` as ``fp8.attention`` calls it before its kernel (the kernel's blocks, V straight
    into its layout), timed alone. Gate, on batch 0 of each tensor: every dequantised value within e4m3's
    rounding of its input (half a step), and every descale that of ``fp8.quantize`` (the torch reference:
    group amax / 448) to fp32 rounding. ``model_bytes``: its byte floor, the 16-bit inputs read once and the
    e4m3 outputs (V's padding included) and descales written once."""
    from kernels.attention import fp8

    granularity = impl.removeprefix("fp8-quantize-")
    metrics: dict = {}
    try:
        kernel = fp8.kernel_for(q.device, q.shape[-1])
        blocks = fp8.blocks(kernel, q.shape[-1])
        layout = "the FA-3 kernel's V layout" if kernel == "fa3" else "V transposed"
        metrics["kernel_config"] = (
            f"fused quantiser, granularity={granularity}, blocks={blocks[0]}/{blocks[1]}, {layout}"
        )

        def call():
            return fp8.quantize_qkv(q, k, v, granularity, blocks=blocks, fa3_layout=kernel == "fa3")

        q8, k8, v8, qs, ks, vs = call()
        v_stored = v8.data if kernel == "fa3" else v8
        v8 = v8.rows() if kernel == "fa3" else v8
        metrics["model_bytes"] = float(
            sum(x.numel() * x.element_size() for x in (q, k, v))
            + sum(x.numel() * x.element_size() for x in (q8, k8, qs, ks, vs))
            + v_stored.numel() * v_stored.element_size()
        )
        worst, sq, count = 0.0, 0.0, 0
        for name, x, x8, scale, block in (
            ("q", q, q8, qs, blocks[0]),
            ("k", k, k8, ks, blocks[1]),
            ("v", v, v8, vs, blocks[1]),
        ):
            _, want = fp8.quantize(x, granularity, block)
            if not torch.allclose(scale, want, rtol=2.0**-23, atol=0.0):
                return make_row(
                    base,
                    impl,
                    "mismatch",
                    f"{impl}: {name}'s descales differ from fp8.quantize's (group amax / 448)",
                    **metrics,
                )
            xf, own = x[:1].float(), scale[:1] if scale.dim() else scale
            err = (xf - fp8.dequantize(x8[:1], own, block)).abs()
            unit = fp8.dequantize(torch.ones(xf.shape, device=xf.device).to(x8.dtype), own, block)  # each scale
            half_step = torch.maximum(xf.abs() * _E4M3_HALF_STEP, _E4M3_HALF_SUBNORMAL * unit) * _SLACK
            bad = int((err > half_step).sum())
            if bad:
                return make_row(
                    base,
                    impl,
                    "mismatch",
                    f"{impl}: {bad} of {name}'s values (batch 0) are further from their input than e4m3's rounding",
                    **metrics,
                )
            worst, sq, count = max(worst, float(err.max())), sq + float((err.double() ** 2).sum()), count + err.numel()
        metrics.update(max_abs_err=worst, rms_err=math.sqrt(sq / max(count, 1)))
        del q8, k8, v8, v_stored, qs, ks, vs
        if timed:
            metrics.update(att.time_call(call, spec))
            metrics["gbps"] = metrics["model_bytes"] / (metrics["ms_median"] * 1e-3) / 1e9
        message = "fp8.attention's quantisation alone (Q, K, V); model_bytes: read once, written once"
        return make_row(base, impl, "ok", message, **metrics)
    except Exception as exc:
        status, msg = harness.classify(exc)
        harness.release_memory()
        return make_row(base, impl, status, f"{impl}: {msg}", **metrics)


def _accuracy(spec: Fp8Spec, impl: str, q, k, v, sample, ref, base: dict) -> dict:
    """Error of one implementation against float64 attention of the same inputs (nothing timed)."""
    metrics: dict = {}
    message = "error against float64 attention of the same inputs, sampled rows of every head"
    try:
        if impl.startswith("ours-fp8-"):
            call = Quantised(impl, q, k, v, spec.causal)
            metrics["kernel_config"] = call.config_text()
            out = call()
            qd, kd, _ = call.dequantised()
            under, mass = reference.p_underflow_rows(qd, kd, sample, spec.causal, p_scale=call.p_scale)
            metrics.update(p_underflow=under, p_mass_lost=mass)
        else:
            out = att.implementation(impl)(q, k, v, spec.causal)
            metrics["kernel_config"] = att.kernel_config(impl, "fwd", None, q, k)
        max_abs, rms = tolerance.error_stats(out[:1].index_select(2, sample), ref)
        metrics.update(max_abs_err=max_abs, rms_err=rms)
        del out
        return make_row(base, impl, "ok", message, **metrics)
    except Exception as exc:
        status, msg = harness.classify(exc)
        harness.release_memory()
        return make_row(base, impl, status, msg, **metrics)
