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

The outputs must be the same bits as the contiguous call's (NaN where it has NaN). Layouts that cannot hold
valid values are left out with the reason (a stride-0 cu_seqlens cannot start at 0 and end at the token
count). Sizes are tiny and odd so that the interpreter stays quick and crosses tile tails.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

from kernels.attention import decode, fa1, fa2, fp8
from kernels.moe import grouped_gemm, moe_ffn, routing
from kernels.quant import w4a16 as wq

F16, F32 = torch.float16, torch.float32
LAYOUTS = ("noncontig", "strided", "offset", "stride0")


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
    """``call(**tensors)`` is the entry under test; ``skip`` maps (argument, layout) to why it is left out."""

    name: str
    call: Callable
    tensors: dict[str, torch.Tensor]
    skip: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)


def _dense_qkv(b=1, h=2, hk=1, nq=19, nk=23, d=24):
    return {"q": _randn(b, h, nq, d, seed=1), "k": _randn(b, hk, nk, d, seed=2), "v": _randn(b, hk, nk, d, seed=3)}


def _fa2_backward_case() -> Case:
    t = _dense_qkv(hk=2, nq=21, nk=21, d=16)
    out, lse = fa2.forward(**t, causal=True)
    do = _randn(*out.shape, seed=4)
    return Case("fa2.backward", lambda do, q, k, v, out, lse: fa2.backward(do, q, k, v, out, lse, causal=True),
                {"do": do, **t, "out": out, "lse": lse})  # fmt: skip


def _varlen_tensors():
    lens = [5, 0, 11]
    total = sum(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    t = {"q": _randn(total, 2, 16, seed=1), "k": _randn(total, 1, 16, seed=2), "v": _randn(total, 1, 16, seed=3)}
    return t, cu


NO_STRIDE0_CU = "a stride-0 cu_seqlens cannot start at 0 and end at the token count"


def _varlen_case(which: str) -> Case:
    t, cu = _varlen_tensors()
    skip = {("cu_seqlens_q", "stride0"): NO_STRIDE0_CU, ("cu_seqlens_k", "stride0"): NO_STRIDE0_CU}
    if which in ("attention_varlen", "forward_varlen"):
        entry = getattr(fa2, which)
        call = lambda q, k, v, cu_seqlens_q, cu_seqlens_k: entry(  # noqa: E731
            q, k, v, cu_seqlens_q, cu_seqlens_k, causal=True)  # fmt: skip
        return Case(f"fa2.{which}", call, {**t, "cu_seqlens_q": cu, "cu_seqlens_k": cu.clone()}, skip)
    out, lse = fa2.forward_varlen(**t, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True)
    do = _randn(*out.shape, seed=5)
    call = lambda do, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k: fa2.backward_varlen(  # noqa: E731
        do, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, causal=True)  # fmt: skip
    tensors = {"do": do, **t, "out": out, "lse": lse, "cu_seqlens_q": cu, "cu_seqlens_k": cu.clone()}
    return Case("fa2.backward_varlen", call, tensors, skip)


def _fa1_backward_case() -> Case:
    t = _dense_qkv(hk=2, nq=18, nk=18, d=16)
    out, lse = fa1.forward(**t)
    do = _randn(*out.shape, seed=4)
    return Case("fa1.backward", lambda do, q, k, v, out, lse: fa1.backward(do, q, k, v, out, lse),
                {"do": do, **t, "out": out, "lse": lse})  # fmt: skip


def _fp8_quantized_case() -> Case:
    t = _dense_qkv(b=2, hk=2, nq=40, nk=36, d=32)  # two of everything, so that every scale has a layout
    cfg = fp8.config_in_effect(32)
    q8, qs = fp8.quantize(t["q"], "block", cfg.block_m)
    k8, ks = fp8.quantize(t["k"], "head", cfg.block_n)
    v8, vs = fp8.quantize(t["v"], "block", cfg.block_n)
    call = lambda q8, k8, v8, q_scale, k_scale, v_scale: fp8.forward_quantized(  # noqa: E731
        q8, k8, v8, q_scale, k_scale, v_scale, causal=True, out_dtype=F16)  # fmt: skip
    return Case("fp8.forward_quantized", call,
                {"q8": q8, "k8": k8, "v8": v8, "q_scale": qs, "k_scale": ks, "v_scale": vs})  # fmt: skip


def _w4_case(m: int, wdtype: torch.dtype) -> Case:
    """matmul with the weight's tensors as arguments: x, bias and the packed words and scales the kernel reads
    (16-bit weights: the int32 scale_zero words; float32 weights: scales and zero points)."""
    qw = wq.quantize(_randn(40, 256, dtype=wdtype, scale=0.05, seed=7), 64)
    x, bias = _randn(m, 256, seed=8), _randn(40, seed=9)
    fields = ["packed", "scale_zero"] if qw.scale_zero is not None else ["packed", "scales", "zeros"]

    def call(x, bias, **parts):
        return wq.matmul(x, dataclasses.replace(qw, **parts), bias)

    return Case(f"w4a16.matmul M={m} {str(wdtype)[6:]} weight", call,
                {"x": x, "bias": bias, **{f: getattr(qw, f) for f in fields}})  # fmt: skip


def _unpack_case() -> Case:
    qw = wq.quantize(_randn(40, 224, scale=0.05, seed=7), 32)  # a shorter last packing block: K = 224
    call = lambda packed, scale_zero: wq.unpack_to_memory(  # noqa: E731
        dataclasses.replace(qw, packed=packed, scale_zero=scale_zero))  # fmt: skip
    return Case("w4a16.unpack_to_memory", call, {"packed": qw.packed, "scale_zero": qw.scale_zero})


def _w8_case(m: int) -> Case:
    q8 = wq.quantize_w8(_randn(40, 100, scale=0.05, seed=7))
    call = lambda x, bias, qweight, scales: wq.matmul_w8(  # noqa: E731
        x, dataclasses.replace(q8, qweight=qweight, scales=scales), bias)  # fmt: skip
    tensors = {"x": _randn(m, 100, seed=8), "bias": _randn(40, seed=9), "qweight": q8.qweight, "scales": q8.scales}
    return Case(f"w4a16.matmul_w8 M={m}", call, tensors)


def _grouped_case(fuse: bool) -> Case:
    rows, k, n, e = 37, 24, 20, 4
    tensors = {"a": _randn(rows, k, seed=1), "b": _randn(e, k, n, scale=0.2, seed=2),
               "expert_offsets": torch.tensor([9, 9, 30, rows], dtype=torch.int32)}  # fmt: skip
    if fuse:
        tensors["swiglu_b"] = _randn(e, k, n, scale=0.2, seed=3)
    return Case(f"moe.grouped_gemm{' swiglu' if fuse else ''}", grouped_gemm, tensors)


def _moe_ffn_case() -> Case:
    tokens, e, h, f = 13, 4, 24, 20
    tensors = {"x": _randn(tokens, h, seed=1), "router_logits": _randn(tokens, e, dtype=F32, seed=2),
               "w_gate": _randn(e, h, f, scale=0.2, seed=3), "w_up": _randn(e, h, f, scale=0.2, seed=4),
               "w_down": _randn(e, f, h, scale=0.2, seed=5)}  # fmt: skip
    return Case("moe.moe_ffn", lambda **t: moe_ffn(**t, top_k=2), tensors)


def _routing_cases() -> list[Case]:
    logits = _randn(13, 5, dtype=F32, seed=2)
    weights, ids = routing.route(logits, 2)
    plan = routing.dispatch(ids, 5)
    y = _randn(26, 8, seed=3)
    return [
        Case("routing.route", lambda router_logits: routing.route(router_logits, 2), {"router_logits": logits}),
        Case("routing.dispatch", lambda expert_ids: routing.dispatch(expert_ids, 5), {"expert_ids": ids}),
        Case("routing.gather", lambda x: routing.gather(x, plan), {"x": _randn(13, 8, seed=4)}),
        Case("routing.combine", lambda y, weights: routing.combine(y, weights, plan), {"y": y, "weights": weights}),
    ]


def _decode_call(q, k, v):
    return decode.forward(q, k, v, num_splits=3)


def _fp8_call(q, k, v):
    return fp8.attention(q, k, v, causal=True, granularity="block")


def _cases() -> list[Case]:
    dense = _dense_qkv()
    return [
        Case("fa2.forward", lambda q, k, v: fa2.forward(q, k, v, causal=True), dense),
        Case("fa2.attention", lambda q, k, v: fa2.attention(q, k, v), _dense_qkv(b=2, h=2, hk=2, nq=7, nk=30)),
        _fa2_backward_case(),
        _varlen_case("attention_varlen"),
        _varlen_case("forward_varlen"),
        _varlen_case("backward_varlen"),
        Case("fa1.forward", lambda q, k, v: fa1.forward(q, k, v, causal=True), _dense_qkv(hk=2, nq=18, nk=21)),
        _fa1_backward_case(),
        Case("decode.forward", _decode_call, _dense_qkv(h=4, hk=2, nq=3, nk=70, d=16)),
        Case("fp8.attention", _fp8_call, _dense_qkv(hk=1, nq=20, nk=36, d=32)),
        _fp8_quantized_case(),
        _w4_case(3, F16),
        _w4_case(20, F16),
        _w4_case(3, F32),
        _unpack_case(),
        Case("w4a16.quantize", lambda w: wq.quantize(w, 32), {"w": _randn(16, 96, scale=0.05, seed=7)}),
        _w8_case(3),
        _w8_case(20),
        Case("w4a16.quantize_w8", wq.quantize_w8, {"w": _randn(16, 40, scale=0.05, seed=7)}),
        _grouped_case(False),
        _grouped_case(True),
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
        for arg in case.tensors:
            for layout in LAYOUTS:
                reason = case.skip.get((arg, layout))
                marks = [pytest.mark.skip(reason=reason)] if reason else []
                yield pytest.param(case.name, arg, layout, marks=marks, id=f"{case.name}-{arg}-{layout}")


_CASES: dict[str, Case] = {}
_REFERENCE: dict[tuple, list[torch.Tensor]] = {}


def _case(name: str) -> Case:
    if not _CASES:
        _CASES.update({c.name: c for c in _cases()})
    return _CASES[name]


def _call(case: Case, tensors: dict[str, torch.Tensor], device: str) -> list[torch.Tensor]:
    moved = {n: t.to(device) if t.device.type != device else t for n, t in tensors.items()}
    return [t.detach().cpu() for t in _flatten(case.call(**moved))]


@pytest.mark.parametrize("case_name, arg, layout", list(_params()))
def test_every_layout_of_every_tensor_argument(case_name, arg, layout, device):
    case = _case(case_name)
    values, view = relayout(case.tensors[arg].to(device), layout)
    assert view.shape == values.shape and torch.equal(view, values)
    if layout != "stride0":
        assert not view.is_contiguous() or view.storage_offset() > 0 or view.dim() == 0
    key = (case_name, arg if layout == "stride0" else None)
    if layout == "stride0":
        expected = _call(case, {**case.tensors, arg: values}, device)
    else:
        if key not in _REFERENCE:
            _REFERENCE[key] = _call(case, case.tensors, device)
        expected = _REFERENCE[key]
    got = _call(case, {**case.tensors, arg: view}, device)
    assert len(got) == len(expected) > 0
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.shape == e.shape and g.dtype == e.dtype, f"output {i}: {g.shape} {g.dtype} vs {e.shape} {e.dtype}"
        torch.testing.assert_close(g, e, rtol=0, atol=0, equal_nan=True,
                                   msg=lambda m, i=i: f"{case_name}: output {i} with {arg} {layout}: {m}")  # fmt: skip


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
