"""W4A16 / W8A16 linear layers: one quant shard in, tidy rows out (the operator table, ops.csv).

A shard is one layer shape ``W [n, k]`` (out × in features), one dtype and one int4 group size; ``run``
draws W once (normal, scaled by 1/√k so that outputs are O(1)), quantises it, then for every M of
``spec.ms`` draws ``x [M, k]`` and measures each implementation of ``y = x Wᵀ``:

- ``ours-w4a16``: ``kernels.w4a16.matmul`` (int4 dequantised in registers; the default path: split-K for
  M ≤ 16);
- ``ours-w8a16``: ``w4a16.matmul_w8`` on the int8 per-channel weight;
- ``ours-w4a16-tc``, ``ours-w8a16-tc``, ``ours-w4a16-streamk``, ``ours-w8a16-streamk``: the same calls on a
  candidate path (``path="tc"``: the persistent tensor-core kernel, at M ≥ 64; ``"streamk"``: stream-K
  decoding, at M ≤ 64: ``plan.PATH_MS``), measured beside the default, which they do not replace;
- ``torch-linear``: ``F.linear`` on the unquantised 16-bit weight (cuBLAS);
- ``dequant-linear``: ``w4a16.dequantize`` to a 16-bit weight in memory (on a GPU one Triton kernel at
  memory speed, ``w4a16.unpack_to_memory``), then ``F.linear`` (the unfused path, both timed together);
- ``torch-int4pack``: PyTorch's int4 weight-only kernel ``torch._weight_int4pack_mm`` on the same codes
  (bfloat16 on CUDA only; elsewhere an ``unsupported`` row);
- ``copy-weight``: a device copy of the packed int4 codes, once per shard (``m`` empty): the copy
  bandwidth the weight-streaming kernels are compared with.

Correctness gates speed: the output rows of a sample of x's rows (first and last ``check_rows // 2``) are
compared with a float64 product using the weights that implementation multiplies by (the dequantised int4
or int8 weight, the bf16-rounded scales and zeros of int4pack, the unquantised weight for F.linear),
bounded by the same product in the input precision (``kernels.tolerance``): a failed gate is a
``mismatch`` row, never timed. ``quant_err`` is the relative RMS error of a quantised layer's output
against the float64 product with the *unquantised* weight: the quantisation's own error.

``model_bytes`` is the weight bytes the implementation reads (``analysis.core.models``; copy-weight: the
packed codes read and written), ``gbps`` those bytes per median time; TFLOP/s count 2·M·N·K.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from analysis.core import harness, models, points
from analysis.core.flops import gemm_flops
from analysis.core.provenance import row_provenance
from analysis.families._shared.operator_rows import failed_row, make_row
from analysis.families.w4a16.plan import PATHS, W4A16Spec

log = logging.getLogger(__name__)


def _weights(spec: W4A16Spec, dtype, device, gen):
    from kernels import w4a16

    w = points.randn((spec.n, spec.k), gen, dtype, device, scale=spec.k**-0.5)
    pw = w4a16.quantize(w, spec.group_size, spec.symmetric)
    pw8 = w4a16.quantize_w8(w)
    return w, pw, pw8


class _Int4Pack:
    """PyTorch's int4 weight-only format of the same codes, and the weight it multiplies by."""

    def __init__(self, pw, spec: W4A16Spec, dtype, device):
        from kernels import w4a16

        if not hasattr(torch, "_weight_int4pack_mm"):
            raise NotImplementedError("this PyTorch has no torch._weight_int4pack_mm")
        if torch.device(device).type != "cuda" or dtype != torch.bfloat16:
            raise NotImplementedError("torch._weight_int4pack_mm is measured with bfloat16 on a CUDA GPU only")
        n, k = spec.n, spec.k
        qi = w4a16.unpack_codes(pw.packed).to(torch.uint8)  # [N, K] codes 0..15
        self.wt = torch._convert_weight_to_int4pack((qi[:, ::2] << 4 | qi[:, 1::2]).contiguous(), 8)
        s = pw.scales.to(torch.bfloat16)
        z = torch.full_like(pw.scales, 8.0) if pw.symmetric else pw.zeros.to(pw.scales.dtype)
        zero = ((8 - z) * pw.scales).to(torch.bfloat16)  # w = (q - 8)·s + (8 - z)·s, both stored in bf16
        self.sz = torch.stack([s, zero], -1).transpose(0, 1).contiguous()
        self.group = spec.group_size
        g = spec.group_size
        codes = qi.to(torch.float64).reshape(n, k // g, g)
        self.w64 = ((codes - 8) * s.double()[..., None] + zero.double()[..., None]).reshape(n, k)
        self.w16 = self.w64.to(dtype)

    def __call__(self, x):
        return torch._weight_int4pack_mm(x, self.wt, self.group, self.sz)


def _config_text(m: int, spec: W4A16Spec, device, impl: str) -> str:
    from kernels import w4a16
    from kernels._runtime import multiprocessor_count

    sms = multiprocessor_count(torch.device(device), 132)
    bits = 8 if impl.startswith("ours-w8a16") else 4
    return str(w4a16.choose_config(m, spec.n, spec.k, sm_count=sms, bits=bits, path=PATHS[impl] or "tiled"))


def run(
    spec: W4A16Spec,
    env: dict,
    device: str = "cuda",
    log_line: Callable[[str], None] = log.info,
    files=None,
    timed: bool = True,
) -> list[dict]:
    """Measure every (M, implementation) point of ``spec``; rows of the operator table (ops.csv)."""
    from kernels import w4a16

    dtype = points.DTYPES[spec.dtype]
    prov = row_provenance(env)
    base = dict(
        experiment=spec.experiment,
        family="w4a16",
        op="linear",
        dtype=spec.dtype,
        model=spec.model,
        n=spec.n,
        k=spec.k,
        group_size=spec.group_size,
        experts=math.nan,
        top_k=math.nan,
        tokens=math.nan,
        routing="",
        stage="total",
        timed=timed,
        **prov,
    )
    impls = [i for i in spec.impls if i != "copy-weight"]
    progress = harness.Progress(spec.points(), log_line)
    gen = points.generator(device, spec.seed)
    rows: list[dict] = []
    try:
        w, pw, pw8 = _weights(spec, dtype, device, gen)
        w64 = w.double()
        wd64 = w4a16.dequantize(pw, torch.float64)
        wd16 = w4a16.dequantize(pw, dtype)
        w8d64 = w4a16.dequantize_w8(pw8, torch.float64)
        w8d16 = w4a16.dequantize_w8(pw8, dtype)
    except Exception as exc:  # the weights or their references do not fit: every point gets the status
        status, message = harness.classify(exc)
        for m in spec.ms:
            for impl in spec.impls_at(m):
                rows.append(make_row({**base, "m": m}, impl, status, f"weights: {message}"))
                progress.step(f"{impl} M={m}", status)
        if "copy-weight" in spec.impls:
            rows.append(make_row({**base, "m": math.nan}, "copy-weight", status, f"weights: {message}"))
        harness.release_memory()
        return rows
    int4pack: _Int4Pack | str | None = None
    if "torch-int4pack" in impls:
        try:
            int4pack = _Int4Pack(pw, spec, dtype, device)
        except Exception as exc:
            int4pack = "; ".join(harness.classify(exc))  # "status; message", unpacked per row

    scale_bytes = pw.scales.element_size()
    zero_bytes = 0 if pw.symmetric else pw.zeros.element_size()
    packed_bytes = models.int4_weight_bytes(spec.n, spec.k, spec.group_size, scale_bytes, zero_bytes)
    int8_bytes = models.int8_weight_bytes(spec.n, spec.k, pw8.scales.element_size())
    weight_bytes = {
        **{impl: int8_bytes if impl.startswith("ours-w8a16") else packed_bytes for impl in PATHS},
        "torch-linear": models.dense_weight_bytes(spec.n, spec.k, w.element_size()),
        "dequant-linear": models.unfused_dequant_bytes(spec.n, spec.k, packed_bytes, w.element_size()),
        "torch-int4pack": models.int4pack_weight_bytes(spec.n, spec.k, spec.group_size),
    }
    # impl -> (callable of x, float64 weight of the gate, same-precision weight, weight of quant_err or None)
    fns = {
        "ours-w4a16": (lambda x: w4a16.matmul(x, pw), wd64, wd16, True),
        "ours-w8a16": (lambda x: w4a16.matmul_w8(x, pw8), w8d64, w8d16, True),
        **{
            impl: (functools.partial(w4a16.matmul, weight=pw, path=path), wd64, wd16, True)
            for impl, path in PATHS.items()
            if path and impl.startswith("ours-w4a16")
        },
        **{
            impl: (functools.partial(w4a16.matmul_w8, weight=pw8, path=path), w8d64, w8d16, True)
            for impl, path in PATHS.items()
            if path and impl.startswith("ours-w8a16")
        },
        "torch-linear": (lambda x: F.linear(x, w), w64, w, False),
        "dequant-linear": (lambda x: F.linear(x, w4a16.dequantize(pw, dtype)), wd64, wd16, True),
    }
    if isinstance(int4pack, _Int4Pack):
        fns["torch-int4pack"] = (int4pack, int4pack.w64, int4pack.w16, True)

    for m in spec.ms:
        mbase = {**base, "m": m}
        try:
            x = points.randn((m, spec.k), gen, dtype, device)
            sample = points.sample_rows(m, spec.check_rows).to(device)
            xs = x.index_select(0, sample)
            exact = xs.double() @ w64.T  # the unquantised layer, for quant_err
        except Exception as exc:
            status, message = harness.classify(exc)
            for impl in spec.impls_at(m):
                rows.append(make_row(mbase, impl, status, f"inputs: {message}"))
                progress.step(f"{impl} M={m}", status)
            harness.release_memory()
            continue
        rounds = harness.Rounds(spec.spread_rounds, rows)  # the point's repeat rounds (the harness's step 6)
        for impl in spec.impls_at(m):
            if impl == "torch-int4pack" and isinstance(int4pack, str):
                status, message = int4pack.split("; ", 1)
                row = make_row(mbase, impl, status, message)
            else:
                row = _measure(spec, impl, fns[impl], x, xs, sample, exact, mbase, weight_bytes[impl], device, timed)
            rows.append(row)
            extra = f" {row['gbps']:.0f} GB/s" if row["status"] == "ok" and timed else ""
            progress.step(f"{impl} M={m}", row["status"] + extra + points.short(row["message"]))
        rounds.run()
        del x, xs, exact
        harness.release_memory()
    if "copy-weight" in spec.impls:  # its rounds follow one another: no other implementation at its point
        rounds = harness.Rounds(spec.spread_rounds, rows)
        row = _measure_copy(spec, pw, {**base, "m": math.nan}, timed)
        rows.append(row)
        rounds.run()
        progress.step("copy-weight", row["status"] + points.short(row["message"]))
    return rows


def _measure(spec, impl, entry, x, xs, sample, exact, base, weight_bytes, device, timed) -> dict:
    fn, w_ref, w_same, quantised = entry
    dtype = points.DTYPES[spec.dtype]
    metrics: dict = {"model_bytes": weight_bytes}
    try:
        if impl in PATHS:
            metrics["kernel_config"] = _config_text(x.shape[0], spec, device, impl)
        out = fn(x)  # first call: compiles outside any timed region
        got = out.index_select(0, sample)
        ref = xs.double() @ w_ref.T
        same = F.linear(xs, w_same)
        errors, failure = points.gate(f"{impl} output", got, ref, same, dtype)
        metrics.update(errors)
        if quantised:
            metrics["quant_err"] = ((got.double() - exact).norm() / exact.norm()).item()
        del out
        if failure:
            return make_row(base, impl, "mismatch", failure, **metrics)
        if not timed:
            return make_row(base, impl, "ok", "", **metrics)
        metrics.update(harness.measure(lambda: fn(x), spec.warmup_ms, spec.rep_ms))
        metrics["tflops"] = points.rate(gemm_flops(x.shape[0], spec.n, spec.k), metrics["ms_median"], 1e12)
        metrics["gbps"] = points.rate(weight_bytes, metrics["ms_median"], 1e9)
        return make_row(base, impl, "ok", "", **metrics)
    except Exception as exc:
        return failed_row(base, impl, exc, **metrics)


def _measure_copy(spec: W4A16Spec, pw, base: dict, timed: bool) -> dict:
    """A device copy of the packed int4 codes: read once, written once."""
    src = pw.packed
    metrics: dict = {"model_bytes": 2.0 * src.numel() * src.element_size()}
    try:
        exact = torch.equal(src.clone(), src)
        metrics.update(max_abs_err=0.0 if exact else math.nan, rms_err=0.0 if exact else math.nan)
        if not exact:
            return make_row(base, "copy-weight", "mismatch", "copy-weight: the copy differs from its source", **metrics)
        if timed:
            metrics.update(harness.measure(src.clone, spec.warmup_ms, spec.rep_ms))
            metrics["gbps"] = points.rate(metrics["model_bytes"], metrics["ms_median"], 1e9)
        return make_row(base, "copy-weight", "ok", "", **metrics)
    except Exception as exc:
        return failed_row(base, "copy-weight", exc, **metrics)
