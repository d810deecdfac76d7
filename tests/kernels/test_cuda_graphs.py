"""Every public kernel entry captured in a CUDA graph, replayed, and compared bit for bit with its eager call.

Serving and training stacks capture their steps in CUDA graphs; an entry that synchronises with the host or
copies between host and device per call cannot be captured (the capture fails, or is invalidated). For each
entry, on a GPU: warm-up calls on a side stream (compiles, tunes, caches what the launchers read on the host:
the validated cu_seqlens and expert offsets), then one capture on that stream, then

- ``replay == eager``: the replayed outputs are the bits of an eager call on the same inputs;
- ``replay follows the inputs``: new values copied into the captured inputs (offsets included) give the
  replayed outputs of an eager call on the new values, so nothing was baked into the graph;
- ``no host synchronisation``: a steady-state eager call under ``torch.cuda.set_sync_debug_mode("error")``.

FA-2's backward is captured the two ways a stack would: the kernel-level ``fa2.backward`` called inside the
capture, and a whole training step (forward and ``torch.autograd.grad`` both inside the capture, PyTorch's
"whole-network capture"). Capturing ``autograd.grad`` of a forward built *before* the capture is not a valid
test: autograd runs the backward on the stream its forward ran on, which is not the capturing stream.

FP8 attention is captured whole (the fused quantiser and the attention kernel, nothing read back) with each
of its kernels, and the FA-3 entries where the GPU is a Hopper one (skipped elsewhere, with that reason).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16


def _flatten(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for part in out for t in _flatten(part)]
    raise TypeError(f"unexpected output {type(out).__name__}")


def _capture(fn: Callable[[], object], warmups: int = 3):
    """(graph, its static outputs, the stream it was captured on) after ``warmups`` eager calls there."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmups):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        static = fn()
    torch.cuda.synchronize()
    return graph, _flatten(static), stream


def _replay(graph, stream) -> None:
    with torch.cuda.stream(stream):
        graph.replay()
    torch.cuda.synchronize()


def _eager(fn, stream) -> list[torch.Tensor]:
    with torch.cuda.stream(stream):
        out = [t.clone() for t in _flatten(fn())]
    torch.cuda.synchronize()
    return out


def _assert_same_bits(got: list[torch.Tensor], expected: list[torch.Tensor], what: str) -> None:
    assert len(got) == len(expected) > 0
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.shape == e.shape and g.dtype == e.dtype, f"{what}: output {i}"
        assert torch.isfinite(e.float()).all(), f"{what}: output {i} of the eager call is not finite"
        torch.testing.assert_close(g, e, rtol=0, atol=0, msg=lambda m, i=i: f"{what}: output {i}: {m}")


def _no_sync(fn) -> None:
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def _randn(*shape, dtype=BF16, scale=1.0, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g, device="cuda")).to(dtype)


@dataclasses.dataclass
class Entry:
    """``call()`` is the entry on inputs made once (the graph captures their addresses); ``refresh()`` copies
    new values into those inputs."""

    call: Callable[[], object]
    refresh: Callable[[], None]


def _refill(tensors: list[torch.Tensor], seed: int) -> Callable[[], None]:
    def refresh():
        for i, t in enumerate(tensors):
            t.copy_(_randn(*t.shape, dtype=t.dtype, seed=seed + i))

    return refresh


def _fa2_forward():
    from kernels.attention import fa2

    q, k, v = _randn(2, 8, 300, 128, seed=1), _randn(2, 2, 333, 128, seed=2), _randn(2, 2, 333, 128, seed=3)
    return Entry(lambda: fa2.forward(q, k, v, causal=True), _refill([q, k, v], 10))


def _fa2_backward():
    from kernels.attention import fa2

    q, k, v = _randn(2, 8, 300, 128, seed=1), _randn(2, 2, 300, 128, seed=2), _randn(2, 2, 300, 128, seed=3)
    out, lse = fa2.forward(q, k, v, causal=True)
    do = _randn(*out.shape, seed=4)

    def refresh():  # new inputs, and the forward's out and lse of them (computed outside the graph)
        _refill([q, k, v, do], 10)()
        o, l_ = fa2.forward(q, k, v, causal=True)
        out.copy_(o)
        lse.copy_(l_)

    return Entry(lambda: fa2.backward(do, q, k, v, out, lse, causal=True), refresh)


def _fa2_training_step():
    """Forward and backward through autograd, both inside the capture (a whole training step)."""
    from kernels.attention import fa2

    q, k, v = (_randn(1, 4, 257, 64, seed=s).requires_grad_() for s in (1, 2, 3))
    dout = _randn(1, 4, 257, 64, seed=4)

    def step():
        out = fa2.attention(q, k, v, causal=True)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        return (out.detach(), *grads)

    def refresh():
        with torch.no_grad():
            _refill([q, k, v, dout], 10)()

    return Entry(step, refresh)


def _varlen():
    from kernels.attention import fa2

    lens = [100, 0, 257, 31]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    total = sum(lens)
    q, k, v = _randn(total, 8, 64, seed=1), _randn(total, 2, 64, seed=2), _randn(total, 2, 64, seed=3)
    do = _randn(total, 8, 64, seed=4)
    out, lse = fa2.forward_varlen(q, k, v, cu, cu, causal=True)

    def call():
        o, l_ = fa2.forward_varlen(q, k, v, cu, cu, causal=True)
        return (o, l_, *fa2.backward_varlen(do, q, k, v, out, lse, cu, cu, causal=True))

    def refresh():
        _refill([q, k, v, do], 10)()
        o, l_ = fa2.forward_varlen(q, k, v, cu, cu, causal=True)
        out.copy_(o)
        lse.copy_(l_)

    return Entry(call, refresh)


def _decode():
    from kernels.attention import decode

    q, k, v = _randn(2, 16, 1, 128, seed=1), _randn(2, 4, 5000, 128, seed=2), _randn(2, 4, 5000, 128, seed=3)
    return Entry(lambda: decode.attention(q, k, v), _refill([q, k, v], 10))


def _paged(step: bool):
    """Paged decoding with a static block table and static lengths (the graph holds their addresses); ``step``:
    a whole decoding step, the new token's K/V appended first. The refresh writes new values into the queries,
    the pages, the block table and the lengths."""
    from kernels.attention import decode

    b, h, hk, page, pages = 4, 16, 2, 16, 300
    kc, vc = _randn(pages, page, hk, 128, seed=2), _randn(pages, page, hk, 128, seed=3)
    q, k_new, v_new = _randn(b, h, 1, 128, seed=1), _randn(b, hk, 1, 128, seed=4), _randn(b, hk, 1, 128, seed=5)
    table = torch.randperm(pages, device="cuda")[: b * 60].reshape(b, 60).to(torch.int32)
    lens = torch.tensor([900, 1, 513, 77], dtype=torch.int32, device="cuda")
    cached = lens - 1

    def call():
        if step:
            decode.append_kv(k_new, v_new, kc, vc, table, cached)
        return decode.paged_forward(q, kc, vc, table, lens, causal=True)

    def refresh():
        _refill([q, kc, vc, k_new, v_new], 10)()
        table.copy_(torch.randperm(pages, device="cuda")[: b * 60].reshape(b, 60).to(torch.int32))
        lens.copy_(torch.tensor([3, 940, 1, 512], dtype=torch.int32, device="cuda"))  # (no empty one: lse = -inf)
        cached.copy_(lens - 1)

    return Entry(call, refresh)


def _w4a16(m: int, path: str | None = None):
    from kernels import w4a16 as wq

    qw = wq.quantize(_randn(4096, 2048, scale=0.05, seed=1), 128)
    x, bias = _randn(m, 2048, seed=2), _randn(4096, seed=3)
    return Entry(lambda: wq.matmul(x, qw, bias, path=path), _refill([x, bias], 10))


def _w8a16(m: int, path: str | None = None):
    from kernels import w4a16 as wq

    qw = wq.quantize_w8(_randn(4096, 2048, scale=0.05, seed=1))
    x, bias = _randn(m, 2048, seed=2), _randn(4096, seed=3)
    return Entry(lambda: wq.matmul_w8(x, qw, bias, path=path), _refill([x, bias], 10))


def _grouped(fuse: bool, path: str | None = None):
    """The default check_offsets=True: validated on the host at the first call, cached for the same tensor."""
    from kernels.moe import grouped_gemm

    e, k, n, rows = 8, 1024, 768, 1000
    a = _randn(rows, k, seed=1)
    b, b2 = _randn(e, k, n, scale=0.03, seed=2), _randn(e, k, n, scale=0.03, seed=3)
    offsets = torch.tensor([100, 100, 350, 500, 640, 900, 999, rows], dtype=torch.int32, device="cuda")
    new_offsets = torch.tensor([0, 300, 300, 301, 700, 800, 950, rows], dtype=torch.int32, device="cuda")

    def refresh():
        _refill([a], 10)()
        offsets.copy_(new_offsets)  # a torch write: bumps the version, so the next eager call re-validates

    return Entry(lambda: grouped_gemm(a, b, offsets, swiglu_b=b2 if fuse else None, path=path), refresh)


def _moe_ffn(path: str | None = None):
    from kernels.moe import moe_ffn

    tokens, e, h, f = 256, 16, 1024, 512
    x, logits = _randn(tokens, h, seed=1), _randn(tokens, e, dtype=torch.float32, seed=2)
    wg, wu = _randn(e, h, f, scale=0.03, seed=3), _randn(e, h, f, scale=0.03, seed=4)
    wd = _randn(e, f, h, scale=0.03, seed=5)
    return Entry(lambda: moe_ffn(x, logits, wg, wu, wd, top_k=4, path=path), _refill([x, logits], 10))


def _hopper() -> None:
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the FA-3 kernel is built for Hopper (compute capability 9.x)")


def _fp8_quantized(kernel: str):
    from kernels.attention import fp8

    if kernel == "fa3":
        _hopper()
    qb, kvb = fp8.blocks(kernel, 128)
    q, k, v = (_randn(1, 8, 1000, 128, seed=s) for s in (1, 2, 3))
    q8, k8, v8, qs, ks, vs = fp8.quantize_qkv(q, k, v, "block", blocks=(qb, kvb))
    call = lambda: fp8.forward_quantized(
        q8,
        k8,
        v8,
        qs,
        ks,
        vs,
        causal=True,
        q_block=qb,  # noqa: E731
        kv_block=kvb,
        check_scale_values=False,
        kernel=kernel,
    )

    def refresh():
        new = fp8.quantize_qkv(*(_randn(1, 8, 1000, 128, seed=s) for s in (11, 12, 13)), "block", blocks=(qb, kvb))
        for old, fresh in zip((q8, k8, v8, qs, ks, vs), new, strict=True):
            old.copy_(fresh)

    return Entry(call, refresh)


def _fp8_attention(kernel: str, granularity: str):
    from kernels.attention import fp8

    if kernel == "fa3":
        _hopper()
    q, k, v = _randn(1, 8, 1000, 128, seed=1), _randn(1, 2, 1037, 128, seed=2), _randn(1, 2, 1037, 128, seed=3)
    call = lambda: fp8.attention(q, k, v, causal=True, granularity=granularity, kernel=kernel)  # noqa: E731
    return Entry(call, _refill([q, k, v], 10))


def _fa3_forward():
    from kernels.attention import fa3

    _hopper()
    q, k, v = _randn(2, 8, 1000, 128, seed=1), _randn(2, 2, 1037, 128, seed=2), _randn(2, 2, 1037, 128, seed=3)
    return Entry(lambda: fa3.forward(q, k, v, causal=True), _refill([q, k, v], 10))


ENTRIES = {
    "fa2.forward": _fa2_forward,
    "fa2.backward": _fa2_backward,
    "fa2.attention training step (autograd inside the capture)": _fa2_training_step,
    "fa2 varlen forward + backward": _varlen,
    "decode.attention": _decode,
    "decode.paged_forward (static block table)": lambda: _paged(False),
    "decoding step: decode.append_kv + decode.paged_forward": lambda: _paged(True),
    "w4a16.matmul M=1 (split-K)": lambda: _w4a16(1),
    "w4a16.matmul M=300 (GEMM)": lambda: _w4a16(300),
    "w4a16.matmul_w8 M=1 (split-K + reduce)": lambda: _w8a16(1),
    "w4a16.matmul_w8 M=300": lambda: _w8a16(300),
    "w4a16.matmul M=1 (stream-K)": lambda: _w4a16(1, "streamk"),
    "w4a16.matmul M=300 (tc)": lambda: _w4a16(300, "tc"),
    "w4a16.matmul_w8 M=1 (stream-K)": lambda: _w8a16(1, "streamk"),
    "w4a16.matmul_w8 M=300 (tc)": lambda: _w8a16(300, "tc"),
    "moe.grouped_gemm": lambda: _grouped(False),
    "moe.grouped_gemm swiglu": lambda: _grouped(True),
    "moe.grouped_gemm persistent": lambda: _grouped(False, "persistent"),
    "moe.grouped_gemm swiglu persistent": lambda: _grouped(True, "persistent"),
    "moe.moe_ffn": _moe_ffn,
    "moe.moe_ffn persistent": lambda: _moe_ffn("persistent"),
    "fa3.forward": _fa3_forward,
    "fp8.forward_quantized fa3": lambda: _fp8_quantized("fa3"),
    "fp8.forward_quantized triton": lambda: _fp8_quantized("triton"),
    "fp8.attention fa3 (fused quantiser, per block)": lambda: _fp8_attention("fa3", "block"),
    "fp8.attention fa3 (fused quantiser, per tensor)": lambda: _fp8_attention("fa3", "tensor"),
    "fp8.attention triton (fused quantiser, per head)": lambda: _fp8_attention("triton", "head"),
}


@pytest.mark.parametrize("name", list(ENTRIES))
def test_capture_replays_the_eager_bits(name):
    entry = ENTRIES[name]()
    graph, static, stream = _capture(entry.call)
    _replay(graph, stream)
    _assert_same_bits([t.clone() for t in static], _eager(entry.call, stream), f"{name}: replay")
    entry.refresh()  # on the default stream: finished before the capture stream reads the new values
    torch.cuda.synchronize()
    expected = _eager(entry.call, stream)  # eager on the new values (re-validates changed offsets)
    _replay(graph, stream)
    _assert_same_bits([t.clone() for t in static], expected, f"{name}: replay after new input values")


@pytest.mark.parametrize("name", list(ENTRIES))
def test_steady_state_call_does_not_synchronise(name):
    entry = ENTRIES[name]()
    entry.call()
    entry.call()
    _no_sync(entry.call)
