"""Every public kernel entry takes any layout of every tensor argument: the class of bug, not its instances.

A kernel that loads ``Bias + cols`` ignores the bias's stride; one that loads ``Offsets + e`` ignores the
offsets'. Such bugs pass every test with freshly allocated (contiguous) inputs and give wrong numbers, or
read past a tensor's storage, for a slice or an expanded tensor. Here each public entry of ``kernels`` is
called once with contiguous inputs and then, for each tensor argument in turn (side tensors included: bias,
scales, zero points, packed words, expert offsets, cu_seqlens, the backward's out and lse), with that
argument replaced by the same values in another layout:

- ``noncontig``: the dimensions' order reversed in memory (column-major for a matrix; a vector: every third
  element of a longer buffer);
- ``strided``: every other element of a buffer twice as long in the last dimension;
- ``offset``: a view starting 3 elements into its storage (not 16-byte aligned, which Triton specialises on);
- ``stride0``: an expanded tensor, stride 0 along its first dimension longer than 1. An expanded tensor
  holds copies of one slice, so both calls then take those values: the last slice repeated (for expert
  offsets that is a valid routing, every row to the first expert).

The outputs must be the same bits as the contiguous call's (NaN where it has NaN) in the interpreter. On a
GPU, Triton picks each load's register layout from the pointers' contiguity, and a reduction (FA-2
backward's Δ = Σ dO·O over the head dim) sums in the order of that layout: the same values in another
layout may then round differently in fp32. There the outputs must agree to ``GPU_ULPS`` units of the
output dtype's rounding (relative to the output's largest magnitude): far below any stride bug, which
reads other elements. Layouts that cannot hold
valid values are left out with the reason (a stride-0 cu_seqlens cannot start at 0 and end at the token
count). Sizes are tiny and odd so that the interpreter stays quick and crosses tile tails.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

from kernels import w4a16 as wq
from kernels.attention import decode, fa1, fa2, fp8
from kernels.moe import grouped_gemm, moe_ffn, routing

F16, F32 = torch.float16, torch.float32
LAYOUTS = ("noncontig", "strided", "offset", "stride0")
GPU_ULPS = 4  # the GPU's allowance for another fp32 summation order (module docstring)


def relayout(t: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(the values the call must see, contiguous; the same values in ``layout``)."""
    if layout == "noncontig":
        if t.dim() < 2:  # a vector's only other order is itself: every third element of a longer buffer
            buf = torch.zeros(3 * t.numel(), dtype=t.dtype, device=t.device)
            buf[::3] = t
            return t, buf[::3]
        order = tuple(reversed(range(t.dim())))
        return t, t.permute(order).contiguous().permute(order)
    if layout == "strided":
        buf = torch.zeros((*t.shape[:-1], 2 * t.shape[-1]), dtype=t.dtype, device=t.device)
        buf[..., ::2] = t
        return t, buf[..., ::2]
    if layout == "offset":
        buf = torch.zeros(t.numel() + 3, dtype=t.dtype, device=t.device)
        buf[3:] = t.reshape(-1)
        return t, buf[3:].view(t.shape)
    dim = next(i for i, n in enumerate(t.shape) if n > 1)
    one = t.narrow(dim, t.shape[dim] - 1, 1)
    expanded = one.expand(t.shape)
    return expanded.contiguous(), expanded


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, dtype=F16, scale=1.0, seed=0):
    return (scale * torch.randn(*shape, generator=_gen(seed))).to(dtype)


@dataclasses.dataclass
class Case:
    """``build(device)`` gives ``(call, tensors)``: ``call(**tensors)`` is the entry under test, its tensors
    (named ``args``, listed here so that the tests can be collected without running a kernel) made on
    ``device``; ``skip`` maps (argument, layout) to why it is left out."""

    name: str
    args: tuple[str, ...]
    build: Callable[[str], tuple[Callable, dict[str, torch.Tensor]]]
    skip: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)


def _on(device: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: t.to(device) for n, t in tensors.items()}


def _dense_qkv(device, b=1, h=2, hk=1, nq=19, nk=23, d=24):
    return _on(
        device, {"q": _randn(b, h, nq, d, seed=1), "k": _randn(b, hk, nk, d, seed=2), "v": _randn(b, hk, nk, d, seed=3)}
    )


QKV = ("q", "k", "v")


def _dense(name: str, entry: Callable, **shape) -> Case:
    return Case(name, QKV, lambda device: (entry, _dense_qkv(device, **shape)))


def _backward_case(name: str, module) -> Case:
    def build(device):
        t = _dense_qkv(device, hk=2, nq=21, nk=21, d=16)
        out, lse = module.forward(**t, causal=True)
        do = _randn(*out.shape, seed=4).to(device)

        def call(do, q, k, v, out, lse):
            return module.backward(do, q, k, v, out, lse, causal=True)

        return call, {"do": do, **t, "out": out, "lse": lse}

    return Case(name, ("do", *QKV, "out", "lse"), build)


NO_STRIDE0_CU = "a stride-0 cu_seqlens cannot start at 0 and end at the token count"
CU = ("cu_seqlens_q", "cu_seqlens_k")


def _varlen_tensors(device):
    lens = [5, 0, 11]
    total = sum(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    t = _on(
        device,
        {"q": _randn(total, 2, 16, seed=1), "k": _randn(total, 1, 16, seed=2), "v": _randn(total, 1, 16, seed=3)},
    )
    return t, cu


def _varlen_case(which: str) -> Case:
    skip = {(c, "stride0"): NO_STRIDE0_CU for c in CU}
    if which in ("attention_varlen", "forward_varlen"):
        entry = getattr(fa2, which)

        def build(device):
            t, cu = _varlen_tensors(device)

            def call(q, k, v, cu_seqlens_q, cu_seqlens_k):
                return entry(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=True)

            return call, {**t, "cu_seqlens_q": cu, "cu_seqlens_k": cu.clone()}

        return Case(f"fa2.{which}", (*QKV, *CU), build, skip)

    def build_backward(device):
        t, cu = _varlen_tensors(device)
        out, lse = fa2.forward_varlen(**t, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True)
        do = _randn(*out.shape, seed=5).to(device)

        def call(do, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k):
            return fa2.backward_varlen(do, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, causal=True)

        return call, {"do": do, **t, "out": out, "lse": lse, "cu_seqlens_q": cu, "cu_seqlens_k": cu.clone()}

    return Case("fa2.backward_varlen", ("do", *QKV, "out", "lse", *CU), build_backward, skip)


def _paged_tensors(device):
    """Three requests (lengths 19, 0, 6) in pages of 8 of a pool of 7, one page shared."""
    t = {
        "q": _randn(3, 4, 2, 16, seed=1),
        "k_cache": _randn(7, 8, 2, 16, seed=2),
        "v_cache": _randn(7, 8, 2, 16, seed=3),
        "block_table": torch.tensor([[4, 1, 6], [0, 0, 0], [1, 5, 2]], dtype=torch.int32),
        "context_lens": torch.tensor([19, 0, 6], dtype=torch.int32),
    }
    return _on(device, t)


def _paged_case() -> Case:
    def call(**t):
        return decode.paged_forward(*t.values(), causal=True, num_splits=2)

    args = ("q", "k_cache", "v_cache", "block_table", "context_lens")
    return Case("decode.paged_forward", args, lambda device: (call, _paged_tensors(device)))


def _append_case() -> Case:
    """The caches are written in place: each call first refills them, through their layout, with the same
    values; the output is the written caches."""

    def build(device):
        t = _paged_tensors(device)
        new = _on(device, {"k_new": _randn(3, 2, 3, 16, seed=4), "v_new": _randn(3, 2, 3, 16, seed=5)})
        pristine = t["k_cache"].clone(), t["v_cache"].clone()

        def call(k_new, v_new, k_cache, v_cache, block_table, cache_lens):
            k_cache.copy_(pristine[0])
            v_cache.copy_(pristine[1])
            decode.append_kv(k_new, v_new, k_cache, v_cache, block_table, cache_lens)
            return k_cache.clone(), v_cache.clone()

        caches = {"k_cache": t["k_cache"], "v_cache": t["v_cache"]}
        return call, {**new, **caches, "block_table": t["block_table"], "cache_lens": t["context_lens"]}

    written = "an expanded cache cannot be written (its pages alias one another)"
    args = ("k_new", "v_new", "k_cache", "v_cache", "block_table", "cache_lens")
    return Case("decode.append_kv", args, build, {(c, "stride0"): written for c in ("k_cache", "v_cache")})


def _fp8_quantized_case() -> Case:
    def build(device):
        t = _dense_qkv(device, b=2, hk=2, nq=40, nk=36, d=32)  # two of everything: every scale has a layout
        cfg = fp8.config_in_effect(32)
        q8, qs = fp8.quantize(t["q"], "block", cfg.block_m)
        k8, ks = fp8.quantize(t["k"], "head", cfg.block_n)
        v8, vs = fp8.quantize(t["v"], "block", cfg.block_n)

        def call(q8, k8, v8, q_scale, k_scale, v_scale):
            return fp8.forward_quantized(q8, k8, v8, q_scale, k_scale, v_scale, causal=True, out_dtype=F16)

        return call, {"q8": q8, "k8": k8, "v8": v8, "q_scale": qs, "k_scale": ks, "v_scale": vs}

    return Case("fp8.forward_quantized", ("q8", "k8", "v8", "q_scale", "k_scale", "v_scale"), build)


def _on_device(qw, device):
    moved = {
        f.name: getattr(qw, f.name).to(device)
        for f in dataclasses.fields(qw)
        if isinstance(getattr(qw, f.name), torch.Tensor)
    }
    moved = dataclasses.replace(qw, **moved)
    if qw.__class__ is wq.W4Weight and qw.scale_zero is not None:  # scales and zeros stay views of scale_zero
        sz = moved.scale_zero
        sdtype = qw.scales.dtype
        moved = dataclasses.replace(
            moved,
            scales=sz.view(torch.int16)[:, 0::2].view(sdtype).t(),
            zeros=sz.view(torch.uint8)[:, 2::4].t() if not qw.symmetric else None,
        )
    return moved


def _w4_case(m: int, wdtype: torch.dtype, path: str | None = None) -> Case:
    """matmul with the weight's tensors as arguments: x, bias and the packed words and scales the kernel reads
    (16-bit weights: the int32 scale_zero words; float32 weights: scales and zero points); ``path``: a candidate
    kernel (the tc path's tensor descriptors give way to pointer loads where a layout does not allow them)."""
    fields = ("packed", "scale_zero") if wdtype != F32 else ("packed", "scales", "zeros")

    def build(device):
        qw = _on_device(wq.quantize(_randn(40, 256, dtype=wdtype, scale=0.05, seed=7), 64), device)

        def call(x, bias, **parts):
            return wq.matmul(x, dataclasses.replace(qw, **parts), bias, path=path)

        tensors = _on(device, {"x": _randn(m, 256, seed=8), "bias": _randn(40, seed=9)})
        return call, {**tensors, **{f: getattr(qw, f) for f in fields}}

    name = f"w4a16.matmul M={m} {str(wdtype)[6:]} weight" + (f" {path}" if path else "")
    return Case(name, ("x", "bias", *fields), build)


def _unpack_case() -> Case:
    def build(device):
        qw = _on_device(wq.quantize(_randn(40, 224, scale=0.05, seed=7), 32), device)  # K = 224: a shorter last block

        def call(packed, scale_zero):
            return wq.unpack_to_memory(dataclasses.replace(qw, packed=packed, scale_zero=scale_zero))

        return call, {"packed": qw.packed, "scale_zero": qw.scale_zero}

    return Case("w4a16.unpack_to_memory", ("packed", "scale_zero"), build)


def _w8_case(m: int, path: str | None = None) -> Case:
    def build(device):
        q8 = _on_device(wq.quantize_w8(_randn(40, 100, scale=0.05, seed=7)), device)

        def call(x, bias, qweight, scales):
            return wq.matmul_w8(x, dataclasses.replace(q8, qweight=qweight, scales=scales), bias, path=path)

        tensors = _on(device, {"x": _randn(m, 100, seed=8), "bias": _randn(40, seed=9)})
        return call, {**tensors, "qweight": q8.qweight, "scales": q8.scales}

    return Case(f"w4a16.matmul_w8 M={m}" + (f" {path}" if path else ""), ("x", "bias", "qweight", "scales"), build)


def _grouped_case(fuse: bool, path: str | None = None) -> Case:
    """``path="persistent"``: its per-segment descriptors give way to pointer loads where a layout does not
    allow them (here N = 32 and K = 24: 64- and 48-byte rows, so the contiguous call takes descriptors)."""
    rows, k, n, e = 37, 24, 20 if path is None else 32, 4

    def build(device):
        tensors = {
            "a": _randn(rows, k, seed=1),
            "b": _randn(e, k, n, scale=0.2, seed=2),
            "expert_offsets": torch.tensor([9, 9, 30, rows], dtype=torch.int32),
        }
        if fuse:
            tensors["swiglu_b"] = _randn(e, k, n, scale=0.2, seed=3)
        return (lambda **t: grouped_gemm(**t, path=path)), _on(device, tensors)

    args = ("a", "b", "expert_offsets") + (("swiglu_b",) if fuse else ())
    return Case(f"moe.grouped_gemm{' swiglu' if fuse else ''}{' ' + path if path else ''}", args, build)


def _moe_ffn_case() -> Case:
    tokens, e, h, f = 13, 4, 24, 20

    def build(device):
        tensors = {
            "x": _randn(tokens, h, seed=1),
            "router_logits": _randn(tokens, e, dtype=F32, seed=2),
            "w_gate": _randn(e, h, f, scale=0.2, seed=3),
            "w_up": _randn(e, h, f, scale=0.2, seed=4),
            "w_down": _randn(e, f, h, scale=0.2, seed=5),
        }
        return (lambda **t: moe_ffn(**t, top_k=2)), _on(device, tensors)

    return Case("moe.moe_ffn", ("x", "router_logits", "w_gate", "w_up", "w_down"), build)


def _routing_cases() -> list[Case]:
    def routed(device):
        logits = _randn(13, 5, dtype=F32, seed=2).to(device)
        weights, ids = routing.route(logits, 2)
        return logits, weights, ids, routing.dispatch(ids, 5)

    def route(device):
        return (lambda router_logits: routing.route(router_logits, 2)), {"router_logits": routed(device)[0]}

    def dispatch(device):
        return (lambda expert_ids: routing.dispatch(expert_ids, 5)), {"expert_ids": routed(device)[2]}

    def gather(device):
        plan = routed(device)[3]
        return (lambda x: routing.gather(x, plan)), {"x": _randn(13, 8, seed=4).to(device)}

    def combine(device):
        _, weights, _, plan = routed(device)
        return (lambda y, weights: routing.combine(y, weights, plan)), {
            "y": _randn(26, 8, seed=3).to(device),
            "weights": weights,
        }

    return [
        Case("routing.route", ("router_logits",), route),
        Case("routing.dispatch", ("expert_ids",), dispatch),
        Case("routing.gather", ("x",), gather),
        Case("routing.combine", ("y", "weights"), combine),
    ]


def _weight_case(name: str, entry: Callable, n: int, k: int) -> Case:
    return Case(name, ("w",), lambda device: (entry, {"w": _randn(n, k, scale=0.05, seed=7).to(device)}))


def _cases() -> list[Case]:
    return [
        _dense("fa2.forward", lambda q, k, v: fa2.forward(q, k, v, causal=True)),
        _dense("fa2.attention", lambda q, k, v: fa2.attention(q, k, v), b=2, h=2, hk=2, nq=7, nk=30),
        _backward_case("fa2.backward", fa2),
        _varlen_case("attention_varlen"),
        _varlen_case("forward_varlen"),
        _varlen_case("backward_varlen"),
        _dense("fa1.forward", lambda q, k, v: fa1.forward(q, k, v, causal=True), hk=2, nq=18, nk=21),
        _backward_case("fa1.backward", fa1),
        _dense("decode.forward", lambda q, k, v: decode.forward(q, k, v, num_splits=3), h=4, hk=2, nq=3, nk=70, d=16),
        _dense(
            "decode.forward packed GQA",
            lambda q, k, v: decode.forward(q, k, v, causal=True, num_splits=2),
            h=8,
            hk=2,
            nq=2,
            nk=37,
            d=16,
        ),
        _paged_case(),
        _append_case(),
        _dense("fp8.attention", lambda q, k, v: fp8.attention(q, k, v, causal=True), hk=1, nq=20, nk=36, d=32),
        _fp8_quantized_case(),
        _w4_case(3, F16),
        _w4_case(20, F16),
        _w4_case(3, F32),
        _w4_case(20, F16, "tc"),
        _w4_case(3, F16, "streamk"),
        _unpack_case(),
        _weight_case("w4a16.quantize", lambda w: wq.quantize(w, 32), 16, 96),
        _w8_case(3),
        _w8_case(20),
        _w8_case(20, "tc"),
        _w8_case(3, "streamk"),
        _weight_case("w4a16.quantize_w8", wq.quantize_w8, 16, 40),
        _grouped_case(False),
        _grouped_case(True),
        _grouped_case(False, "persistent"),
        _grouped_case(True, "persistent"),
        _moe_ffn_case(),
        *_routing_cases(),
    ]


def _flatten(out) -> list[torch.Tensor]:
    """The tensors of an entry's result (a tensor, a tuple, a NamedTuple or a dataclass of tensors)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if dataclasses.is_dataclass(out):
        out = [getattr(out, f.name) for f in dataclasses.fields(out)]
    if isinstance(out, (tuple, list)):
        return [t for part in out for t in _flatten(part)]
    return []


def _params():
    for case in _cases():
        for arg in case.args:
            for layout in LAYOUTS:
                reason = case.skip.get((arg, layout))
                marks = [pytest.mark.skip(reason=reason)] if reason else []
                yield pytest.param(case.name, arg, layout, marks=marks, id=f"{case.name}-{arg}-{layout}")


CASES = {c.name: c for c in _cases()}
_BUILT: dict[tuple[str, str], tuple[Callable, dict[str, torch.Tensor]]] = {}
_REFERENCE: dict[tuple, list[torch.Tensor]] = {}


def _built(name: str, device: str):
    if (name, device) not in _BUILT:
        call, tensors = CASES[name].build(device)
        assert tuple(tensors) == CASES[name].args, f"{name}: built {tuple(tensors)}, declared {CASES[name].args}"
        _BUILT[name, device] = call, tensors
    return _BUILT[name, device]


def _call(call: Callable, tensors: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    return [t.detach().cpu() for t in _flatten(call(**tensors))]


@pytest.mark.parametrize("case_name, arg, layout", list(_params()))
def test_every_layout_of_every_tensor_argument(case_name, arg, layout, device):
    call, tensors = _built(case_name, device)
    values, view = relayout(tensors[arg], layout)
    assert view.shape == values.shape and torch.equal(view, values)
    if layout != "stride0":
        assert not view.is_contiguous() or view.storage_offset() > 0
    if layout == "stride0":
        expected = _call(call, {**tensors, arg: values})
    else:
        if (case_name, device) not in _REFERENCE:
            _REFERENCE[case_name, device] = _call(call, tensors)
        expected = _REFERENCE[case_name, device]
    got = _call(call, {**tensors, arg: view})
    assert len(got) == len(expected) > 0
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.shape == e.shape and g.dtype == e.dtype, f"output {i}: {g.shape} {g.dtype} vs {e.shape} {e.dtype}"
        tol = 0.0
        if device == "cuda" and g.is_floating_point():
            tol = GPU_ULPS * torch.finfo(e.dtype).eps * max(e.float().nan_to_num(0.0).abs().max().item(), 1.0)
        torch.testing.assert_close(
            g,
            e,
            rtol=0,
            atol=tol,
            equal_nan=True,
            msg=lambda m, i=i: f"{case_name}: output {i} with {arg} {layout}: {m}",
        )


def test_relayout_makes_the_layouts_it_names():
    t = torch.arange(24.0).reshape(2, 3, 4)
    _, nc = relayout(t, "noncontig")
    assert nc.stride() == (1, 2, 6)
    _, st = relayout(t, "strided")
    assert st.stride() == (24, 8, 2)
    _, off = relayout(t, "offset")
    assert off.storage_offset() == 3 and off.is_contiguous()
    values, s0 = relayout(t, "stride0")
    assert s0.stride()[0] == 0 and torch.equal(values[0], t[1]) and torch.equal(values[1], t[1])
    offsets = torch.tensor([3, 3, 9], dtype=torch.int32)
    assert relayout(offsets, "stride0")[0].tolist() == [9, 9, 9]  # every row to the first expert
