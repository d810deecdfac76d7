"""Decoding on a paged K/V cache, and the append kernel, against float64 and against the contiguous path.

Paged and contiguous decoding share their inner loop (only where a tile's keys are differs), so on the same
values and the same split count they give the same bits; against float64 they are held to the tolerance
policy. Shapes are small and odd (the interpreter runs every program in Python): page sizes below the key tile
(a lookup per key) and at or above it (one per tile), lengths that leave the last page partly full, empty and
one-token contexts, pages shared between requests, both cache layouts.
"""

from __future__ import annotations

import pytest
import torch

from kernels import tolerance
from kernels.attention import decode, reference

F16, F32, BF16 = torch.float16, torch.float32, torch.bfloat16


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _cache(num_pages, page, hk, d, dtype, layout, seed=1):
    """A K and a V pool of random pages in ``layout``."""
    shape = (num_pages, page, hk, d) if layout == "nhd" else (num_pages, hk, page, d)
    return tuple(torch.randn(shape, generator=_gen(seed + i)).to(dtype) for i in range(2))


def _table(lens, page, num_pages, seed=3, width=None):
    """A block table of distinct random pages, enough columns for the longest request (or ``width``)."""
    need = max(1, *(-(-n // page) for n in lens))
    width = width or need
    pages = torch.randperm(num_pages, generator=_gen(seed))[: len(lens) * width]
    return pages.reshape(len(lens), width).to(torch.int32)


def _on(device, *tensors):
    return tuple(t.to(device) for t in tensors)


def _check(name, out, q, kc, vc, table, lens, causal, layout="nhd"):
    ref = reference.paged_reference_attention(q, kc, vc, table, lens, causal, layout=layout)
    same = reference.paged_reference_attention(q, kc, vc, table, lens, causal, layout=layout, exact=False)
    tolerance.assert_close(name, out, ref, same, q.dtype)


CASES = [
    # (heads, heads_kv, Nq, lengths, page, d, causal, dtype, layout)
    pytest.param((8, 1, 1, [37, 1, 0, 64], 8, 32, False, F16, "nhd"), id="mqa8-page8-lens37,1,0,64"),
    pytest.param((8, 2, 3, [50, 2, 17], 16, 24, True, F16, "hnd"), id="gqa4-q3-causal-page16-hnd-d24"),
    pytest.param((4, 4, 2, [70, 33], 32, 16, True, F32, "nhd"), id="mha-q2-causal-page32-f32"),
    pytest.param((16, 2, 16, [20, 5], 16, 16, True, F16, "nhd"), id="gqa8-q16-two-row-blocks-short-contexts"),
    pytest.param((8, 1, 1, [300, 70], 64, 64, False, BF16, "nhd"), id="bf16", marks=pytest.mark.gpu),
]


@pytest.mark.parametrize("pack_gqa", [True, False], ids=["packed", "unpacked"])
@pytest.mark.parametrize("case", CASES)
def test_matches_float64_on_random_block_tables(case, pack_gqa, device):
    h, hk, nq, lens, page, d, causal, dtype, layout = case
    num_pages = 3 * sum(-(-n // page) for n in lens) + 2
    kc, vc = _cache(num_pages, page, hk, d, dtype, layout)
    table = _table(lens, page, num_pages)
    q = torch.randn(len(lens), h, nq, d, generator=_gen(5)).to(dtype)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    q, kc, vc, table, lens_t = _on(device, q, kc, vc, table, lens_t)
    out, lse = decode.paged_forward(q, kc, vc, table, lens_t, causal, layout=layout, pack_gqa=pack_gqa)
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == q.shape[:3]
    _check(f"paged {case}", out, q, kc, vc, table, lens_t, causal, layout)
    empty = lens_t == 0
    assert torch.count_nonzero(out[empty]) == 0 and torch.isneginf(lse[empty]).all()


@pytest.mark.parametrize("splits", [1, 3, 64], ids=["unsplit", "3-splits", "a-split-a-block"])
@pytest.mark.parametrize("layout", ["nhd", "hnd"])
def test_paged_equals_contiguous_bit_for_bit(layout, splits, device):
    """The same values in pages and gathered contiguously (with per-request lengths): the same output bits."""
    lens = [45, 0, 1, 77]
    page, hk, d = 8, 2, 32
    kc, vc = _cache(40, page, hk, d, F16, layout)
    table = _table(lens, page, 40)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(4, 4, 2, d, generator=_gen(6)).to(F16)
    kg, vg = (reference.gather_paged(c, table, lens_t, layout) for c in (kc, vc))
    q, kc, vc, table, lens_t, kg, vg = _on(device, q, kc, vc, table, lens_t, kg, vg)
    paged = decode.paged_forward(q, kc, vc, table, lens_t, True, layout=layout, num_splits=splits)
    ran = decode.last_splits()
    contiguous = decode.forward(q, kg, vg, True, seqlens_k=lens_t, num_splits=splits)
    assert decode.last_splits() == ran
    for name, p, c in zip(("out", "lse"), paged, contiguous, strict=True):
        torch.testing.assert_close(p, c, rtol=0, atol=0, equal_nan=True, msg=lambda m, n=name: f"{n}: {m}")


def test_pages_shared_between_requests(device):
    """Prefix sharing: two requests read the same first pages, then pages of their own."""
    page, hk, d = 16, 2, 32
    kc, vc = _cache(8, page, hk, d, F16, "nhd")
    table = torch.tensor([[5, 2, 7], [5, 2, 0], [5, 1, 1]], dtype=torch.int32)  # the last one repeats a page
    lens = torch.tensor([40, 35, 48], dtype=torch.int32)
    q = torch.randn(3, 8, 1, d, generator=_gen(7)).to(F16)
    q, kc, vc, table, lens = _on(device, q, kc, vc, table, lens)
    out, _ = decode.paged_forward(q, kc, vc, table, lens)
    _check("shared pages", out, q, kc, vc, table, lens, False)


def test_split_counts_and_max_context_len(device):
    """Any split count gives the float64 answer; a ``max_context_len`` below a real length only moves the split
    boundaries (the last split takes the rest)."""
    lens = [90, 13]
    kc, vc = _cache(30, 8, 1, 16, F32, "nhd")
    table = _table(lens, 8, 30)
    q = torch.randn(2, 2, 1, 16, generator=_gen(8))
    lens_t = torch.tensor(lens, dtype=torch.int32)
    q, kc, vc, table, lens_t = _on(device, q, kc, vc, table, lens_t)
    for splits, bound in ((None, None), (1, None), (4, None), (None, 20)):
        out, _ = decode.paged_forward(q, kc, vc, table, lens_t, num_splits=splits, max_context_len=bound)
        _check(f"splits={splits} max_context_len={bound}", out, q, kc, vc, table, lens_t, False)


def test_append_into_a_fresh_page_and_a_partly_full_one(device):
    """Request 0 has 13 tokens in pages of 8 (its second page partly full): 5 new tokens fill it and open a
    fresh page. Request 1 starts empty. Every other slot of the pool keeps its bits, and decoding the
    appended cache matches float64 on it."""
    page, hk, d, n_new = 8, 2, 16, 5
    kc, vc = _cache(10, page, hk, d, F16, "nhd")
    table = torch.tensor([[4, 1, 7], [9, 2, 3]], dtype=torch.int32)
    cache_lens = torch.tensor([13, 0], dtype=torch.int32)
    k_new, v_new = (torch.randn(2, hk, n_new, d, generator=_gen(11 + i)).to(F16) for i in range(2))
    expect_k, expect_v = kc.clone(), vc.clone()
    for b in range(2):
        for i in range(n_new):
            pos = int(cache_lens[b]) + i
            expect_k[table[b, pos // page], pos % page] = k_new[b, :, i]
            expect_v[table[b, pos // page], pos % page] = v_new[b, :, i]
    kc, vc, table, cache_lens, k_new, v_new = _on(device, kc, vc, table, cache_lens, k_new, v_new)
    decode.append_kv(k_new, v_new, kc, vc, table, cache_lens)
    assert torch.equal(kc.cpu(), expect_k) and torch.equal(vc.cpu(), expect_v)
    q = torch.randn(2, 4, n_new, d, generator=_gen(13)).to(F16).to(device)
    lens = cache_lens + n_new
    out, _ = decode.paged_forward(q, kc, vc, table, lens, causal=True)
    _check("after append", out, q, kc, vc, table, lens, True)


def test_append_head_major_layout(device):
    kc, vc = _cache(4, 4, 3, 8, F32, "hnd")
    table = torch.tensor([[2, 0]], dtype=torch.int32)
    k_new, v_new = torch.randn(1, 3, 2, 8, generator=_gen(14)), torch.randn(1, 3, 2, 8, generator=_gen(15))
    expect = kc.clone()
    expect[2, :, 3], expect[0, :, 0] = k_new[0, :, 0], k_new[0, :, 1]
    kc, vc, table, k_new, v_new = _on(device, kc, vc, table, k_new, v_new)
    decode.append_kv(k_new, v_new, kc, vc, table, torch.tensor([3], dtype=torch.int32, device=device), layout="hnd")
    assert torch.equal(kc.cpu(), expect)


def test_out_of_range_pages_are_clamped_and_flagged(device):
    """Entries past the pool, negative ones and a length the table cannot hold: the reads stay in the cache
    (the output is that of the clamped table), only the requests concerned are flagged, and the opt-in check
    names request and page."""
    page, num_pages = 8, 6
    kc, vc = _cache(num_pages, page, 1, 16, F32, "nhd")
    good = torch.tensor([[0, 1, 2], [3, 4, 5], [1, 2, 3], [5, 4, 3]], dtype=torch.int32)
    bad = good.clone()
    bad[0, 1], bad[2, 0] = 99, -4
    lens = torch.tensor([20, 24, 9, 23], dtype=torch.int32)
    clamped = bad.clamp(0, num_pages - 1)
    q = torch.randn(4, 2, 1, 16, generator=_gen(16))
    q, kc, vc, bad, clamped, lens = _on(device, q, kc, vc, bad, clamped, lens)
    flags = decode.new_page_flags(4, device)
    out, _ = decode.paged_forward(q, kc, vc, bad, lens, page_flags=flags, num_splits=2)
    assert flags.tolist() == [2, 0, 1, 0]  # 1 + the logical page that was out of range
    assert torch.equal(out, decode.paged_forward(q, kc, vc, clamped, lens, num_splits=2)[0])
    with pytest.raises(ValueError, match=r"request 0: block_table\[0, 1\] = 99, outside the cache's pages 0…5"):
        decode.check_page_flags(flags, bad, lens, kc)
    with pytest.raises(ValueError, match=r"request 2: block_table\[2, 0\] = -4"):
        decode.paged_forward(q, kc, vc, bad, lens, check_pages=True)
    too_long = lens.clone()
    too_long[1] = 25  # 3 pages of 8 hold 24 tokens
    flags.zero_()
    decode.paged_forward(q, kc, vc, clamped, too_long, page_flags=flags)
    assert flags.tolist() == [0, 4, 0, 0]
    with pytest.raises(ValueError, match="request 1: 25 tokens need 4 pages of 8, its block table has 3"):
        decode.check_page_flags(flags, clamped, too_long, kc)
    decode.paged_forward(q, kc, vc, clamped, lens, check_pages=True)  # a good table passes the check


def test_append_to_a_bad_page_writes_nothing(device):
    kc, vc = _cache(3, 4, 1, 8, F32, "nhd")
    table = torch.tensor([[0, 7], [1, 2]], dtype=torch.int32)  # request 0's second page is not in the pool
    cache_lens = torch.tensor([2, 1], dtype=torch.int32)
    k_new, v_new = torch.randn(2, 1, 3, 8, generator=_gen(17)), torch.randn(2, 1, 3, 8, generator=_gen(18))
    expect = kc.clone()
    expect[0, 2:, 0] = k_new[0, 0, :2]  # request 0's positions 2, 3; position 4 is in page 7: not written
    expect[1, 1:, 0] = k_new[1, 0]  # request 1's positions 1, 2, 3; page 2 untouched
    kc, vc, table, cache_lens, k_new, v_new = _on(device, kc, vc, table, cache_lens, k_new, v_new)
    flags = decode.new_page_flags(2, device)
    decode.append_kv(k_new, v_new, kc, vc, table, cache_lens, page_flags=flags)
    assert flags.tolist() == [2, 0]
    assert torch.equal(kc.cpu(), expect)
    with pytest.raises(ValueError, match=r"request 0: block_table\[0, 1\] = 7"):
        decode.append_kv(k_new, v_new, kc, vc, table, cache_lens, check_pages=True)


def test_bad_arguments_are_refused_by_name(device):
    kc, vc = _cache(4, 8, 2, 16, F16, "nhd")
    table = torch.zeros(2, 3, dtype=torch.int32)
    lens = torch.tensor([3, 4], dtype=torch.int32)
    q = torch.randn(2, 4, 1, 16).to(F16)
    q, kc, vc, table, lens = _on(device, q, kc, vc, table, lens)
    with pytest.raises(TypeError, match="block_table must be int32"):
        decode.paged_forward(q, kc, vc, table.long(), lens)
    with pytest.raises(ValueError, match=r"context_lens must be \[B\] with B = 2"):
        decode.paged_forward(q, kc, vc, table, lens[:1])
    with pytest.raises(ValueError, match=r"block_table must be \[B, max_pages\]"):
        decode.paged_forward(q, kc, vc, table[0], lens)
    with pytest.raises(ValueError, match="block_table must have at least one column"):
        decode.paged_forward(q, kc, vc, table[:, :0], lens)
    with pytest.raises(ValueError, match="layout must be one of"):
        decode.paged_forward(q, kc, vc, table, lens, layout="bhsd")
    with pytest.raises(ValueError, match="K/V heads must divide"):
        decode.paged_forward(q[:, :3], kc, vc, table, lens)
    with pytest.raises(ValueError, match="1 to 16 query rows"):
        decode.paged_forward(q.expand(2, 4, 17, 16), kc, vc, table, lens)
    with pytest.raises(ValueError, match="k_cache and v_cache must have one shape"):
        decode.paged_forward(q, kc, vc[:2], table, lens)
    with pytest.raises(ValueError, match="max_context_len must be >= 0"):
        decode.paged_forward(q, kc, vc, table, lens, max_context_len=-1)
    with pytest.raises(ValueError, match=r"page_flags must be \[B\]"):
        decode.paged_forward(q, kc, vc, table, lens, page_flags=torch.zeros(3, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match=r"k_new must be \[B, H_kv=2, N_new, d=16\]"):
        decode.append_kv(q, q, kc, vc, table, lens)
    with pytest.raises(TypeError, match="cache_lens must be int32"):
        decode.append_kv(kc[:2, :1].transpose(1, 2), kc[:2, :1].transpose(1, 2), kc, vc, table, lens.float())
    with pytest.raises(NotImplementedError, match="inference-only"):
        decode.paged_attention(q.clone().requires_grad_(True), kc, vc, table, lens)


_COMPILE = """
import json
from analysis.families.compiled import sass
from kernels.attention import decode_kernels as dk

def summary(fn, kinds, cx, warps, stages):
    built = sass.compile_kernel(fn, kinds, cx, 90, dict(num_warps=warps, num_stages=stages))
    return sass.summary(sass.read(built.asm["cubin"]))

out = {}
ones = dict(stride_qd=1, stride_kd=1, stride_vd=1)  # contiguous head dims, as Triton specialises them
for paged, page in ((False, 1), (True, 16), (True, 64)):
    kinds = {"Q": "*fp16", "K": "*fp16", "V": "*fp16", "PART_O": "*fp32", "PART_LSE": "*fp32", "sm_scale": "fp32",
             "LENS": "*i32", "BT": "*i32", "FLAGS": "*i32"}
    cx = dict(HEAD_DIM=128, BLOCK_D=128, IS_CAUSAL=True, IS_FP32=False, EVEN_D=True, PAGED=paged, PAGE=page,
              HAS_LENS=True, HAS_FLAGS=paged, BLOCK_M=64, BLOCK_N=64, **ones)
    if not paged:
        del kinds["BT"], kinds["FLAGS"]
        cx.update(BT=None, FLAGS=None)
    out[f"split page={page}"] = summary(dk._decode_split_kernel, kinds, cx, 4, 3)
kinds = {n: "*fp16" for n in ("K_NEW", "V_NEW", "K", "V")} | {n: "*i32" for n in ("CACHE_LENS", "BT", "FLAGS")}
cx = dict(HEAD_DIM=128, BLOCK_H=8, BLOCK_D=128, PAGE=16, HAS_FLAGS=True, stride_knd=1, stride_vnd=1, **ones)
del cx["stride_qd"]
out["append"] = summary(dk._append_kernel, kinds, cx, 4, 1)
print(json.dumps(out))
"""


def test_the_kernels_compile_for_hopper_without_spilling():
    """The interpreter runs what a GPU compile may refuse (a global that is not a constexpr, a scalar atomic):
    the split kernel (contiguous, a lookup per key, one per tile) and the append kernel built for sm_90 here."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(root))
    done = subprocess.run([sys.executable, "-c", _COMPILE], env=env, cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(rows) == {"split page=1", "split page=16", "split page=64", "append"}
    for name, row in rows.items():
        assert row["stack_bytes"] == 0 and row["kernel_spills"] == 0, (name, row)
    for name in ("split page=1", "split page=16", "split page=64"):
        assert rows[name]["loop_mma"] > 0 and rows[name]["loop_thread_loads"] > 0, rows[name]
