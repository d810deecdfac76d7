"""The FA-3 kernels' host side on any machine: what TMA can read (and the copies made where it cannot), the
launch caches and what they are keyed on.

The Gluon kernels need a Hopper GPU, but everything before the launch runs on the CPU: the argument checks,
the copy decisions, the descriptors and the launcher's caches. Here the launch is stubbed (``fa3._launcher``,
``fa3_bwd._launcher``) and the Hopper check switched off, so the arguments a kernel would get can be read.
The launcher's keys are checked against Triton's own binder, built for sm_90 without a GPU.
"""

from __future__ import annotations

import pytest
import torch
from attention_checks import PoisonedTorch, random_tensors

from kernels.attention import fa3, fa3_bwd, fa3_host
from kernels.attention.fa3_host import GluonLauncher, Tma

F16 = torch.float16


def _unaligned(shape, dtype=F16, seed=0):
    """A contiguous tensor whose storage offset is one element: its base is not 16-byte aligned."""
    (flat,) = random_tensors([(1 + torch.Size(shape).numel(),)], dtype, "cpu", seed=seed)
    t = flat[1:].view(shape)
    assert t.is_contiguous() and t.data_ptr() % 16
    return t


# ---------------------------------------------------------------------------------------------------
# What TMA can read
# ---------------------------------------------------------------------------------------------------


def test_an_unaligned_contiguous_view_is_copied():
    """The bug: ``contiguous()`` returned such a view as it was, and TMA's descriptor asserted on its base."""
    t = _unaligned((2, 3, 50, 64))
    ready, strides = fa3_host.tma_ready(t)
    assert ready.data_ptr() % 16 == 0 and ready.data_ptr() != t.data_ptr()
    assert torch.equal(ready, t) and strides == ready.stride()
    _, arg = fa3_host.tma_arg(t, (64, 64))
    arg.descriptor()  # Triton's TensorDescriptor checks base, strides and block: no AssertionError


@pytest.mark.parametrize(
    "make",
    [
        lambda base: base[:, :, :, 8:72],  # a column offset of 8 fp16 = 16 bytes: aligned, strided rows
        lambda base: base.transpose(1, 2)[:, :, :, :64],  # heads-second view of [B, N, H, d]
        lambda base: base[:1].expand(2, *base.shape[1:])[:, :, :, :64],  # batch stride 0 on a size-2 dim
    ],
    ids=["column-slice", "transposed", "expanded-batch"],
)
def test_views_that_tma_reads_or_not(make):
    base = random_tensors([(2, 6, 40, 80)], F16, "cpu")[0]
    t = make(base)
    ready, strides = fa3_host.tma_ready(t)
    legal = t.data_ptr() % 16 == 0 and all(s > 0 and s * 2 % 16 == 0 for s in t.stride()[:-1])
    assert (ready is t) == legal
    assert torch.equal(ready, t)
    fa3_host.tma_arg(t, (32, 64))[1].descriptor()


def test_size_one_dims_take_any_stride():
    """A size-1 dim's stride is never used: an odd one does not force a copy."""
    t = random_tensors([(1, 3, 10, 64)], F16, "cpu")[0].as_strided((1, 3, 10, 64), (7, 640, 64, 1))
    ready, strides = fa3_host.tma_ready(t)
    assert ready is t and strides == (1920, 640, 64, 1)


def test_the_tma_decision_is_cached_by_layout_not_by_address():
    """Decided once per (shape, strides, element size, alignment): no address in the key, so a new tensor
    of a known layout hits and a stale pointer can never be returned."""
    fa3_host._strides_for_tma.cache_clear()
    a, b = random_tensors([(2, 3, 40, 64)] * 2, F16, "cpu")
    fa3_host.tma_strides(a)
    fa3_host.tma_strides(b)
    assert fa3_host._strides_for_tma.cache_info().hits == 1
    fa3_host.tma_strides(a.transpose(1, 2))  # new strides
    fa3_host.tma_strides(_unaligned((2, 3, 40, 64)))  # same layout, unaligned
    info = fa3_host._strides_for_tma.cache_info()
    assert info.hits == 1 and info.misses == 3
    for key in fa3_host._strides_for_tma.cache_parameters(), info:
        assert not isinstance(key, torch.Tensor)


# ---------------------------------------------------------------------------------------------------
# The entry points' arguments, launch stubbed
# ---------------------------------------------------------------------------------------------------


@pytest.fixture
def stubbed(monkeypatch):
    """The Hopper check off and the Gluon launches recorded: (kernel, grid, args, constexprs, options)."""
    calls = []

    def launcher(kernel=None):
        return lambda grid, args, constexprs, options: calls.append((kernel, grid, args, constexprs, options))

    monkeypatch.setattr(fa3, "check_hopper", lambda q: None)
    monkeypatch.setattr(fa3_bwd, "check_hopper", lambda q: None)
    monkeypatch.setattr(fa3, "_launcher", launcher)
    monkeypatch.setattr(fa3_bwd, "_launcher", launcher)
    return calls


def _tensor_args(args):
    return [a.base if isinstance(a, Tma) else a for a in args if isinstance(a, (torch.Tensor, Tma))]


def test_forward_copies_unaligned_inputs(stubbed):
    """``fa3.forward`` on views at odd offsets: the kernel gets aligned copies holding the same values, and
    every descriptor can be built."""
    shape = (1, 2, 100, 128)
    q, k, v = (_unaligned(shape, seed=s) for s in range(3))
    fa3.forward(q, k, v, causal=True)
    (_, grid, args, _, _) = stubbed[0]
    for a in args[:4]:
        assert isinstance(a, Tma)
        a.descriptor()
    for got, want in zip(args[4:7], (q, k, v), strict=True):
        assert got.data_ptr() % 16 == 0 and torch.equal(got, want)
    assert grid == (1, 2, 1)


def test_forward_passes_aligned_views_as_they_are(stubbed):
    base = random_tensors([(1, 100, 4, 128)], F16, "cpu")[0]
    q = k = v = base.transpose(1, 2)  # [B, H, N, d] view: strides TMA can describe
    fa3.forward(q, k, v)
    q_desc, k_desc, v_desc, o_desc, *pointers = _tensor_args(stubbed[0][2])[:7]
    assert all(t.data_ptr() == base.data_ptr() for t in (q_desc, k_desc, v_desc, *pointers))


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_backward_copies_unaligned_inputs_and_grad(stubbed, monkeypatch, deterministic):
    """``fa3_bwd.backward`` (preprocess and dQ conversion in the interpreter, the Gluon kernel stubbed, fresh
    buffers poisoned with NaN): q, k, v and dO at odd offsets reach it as aligned copies, its descriptors,
    the rows' ones included, build, and the words it reads come zeroed or written by the preprocess."""
    b, h, n, d = 1, 2, 70, 64
    q, k, v, do = (_unaligned((b, h, n, d), seed=s) for s in range(4))
    out = random_tensors([(b, h, n, d)], F16, "cpu")[0]
    lse = torch.zeros(b, h, n)
    monkeypatch.setattr(fa3_bwd, "torch", PoisonedTorch())
    fa3_bwd.backward(do, q, k, v, out, lse, causal=True, deterministic=deterministic)
    monkeypatch.undo()
    rows, dq_acc, sem = (stubbed[0][2][i] for i in (10, 12, 13))
    assert torch.isfinite(dq_acc).all() and not dq_acc.any() and torch.isfinite(rows[:, :n]).all()
    if deterministic:
        assert sem.dtype == torch.int32 and not sem.any()
    (_, grid, args, constexprs, _) = stubbed[0]
    descs = [a for a in args if isinstance(a, Tma)]
    assert len(descs) == 6
    for a in descs:
        assert a.base.data_ptr() % 16 == 0
        a.descriptor()
    for got, want in zip(args[6:10], (q, k, v, do), strict=True):
        assert got.data_ptr() % 16 == 0 and torch.equal(got, want)
    assert grid == (1, b * h, 1) and constexprs["IS_CAUSAL"]


# ---------------------------------------------------------------------------------------------------
# The launcher's cache
# ---------------------------------------------------------------------------------------------------


class _Compiled:
    """What Triton's JIT returns: a compiled kernel with its launcher."""

    function = "function"
    packed_metadata = "metadata"

    def __init__(self):
        self.runs = []

    def launch_metadata(self, *args):
        return None

    def run(self, *args):
        self.runs.append(args)


class _Kernel:
    """A ``@gluon.jit`` function as the launcher sees it: argument names, and ``kernel[grid](...)``."""

    arg_names = ["desc", "ptr", "n", "scale", "BLOCK"]

    def __init__(self):
        self.jit_calls = []
        self.compiled = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.jit_calls.append((grid, args, kwargs))
            self.compiled.append(_Compiled())
            return self.compiled[-1]

        return launch


@pytest.fixture
def gpu_free_launcher(monkeypatch):
    """A ``GluonLauncher`` outside the interpreter, with no CUDA: device 0 and stream 0."""
    monkeypatch.setattr(fa3_host, "INTERPRET", False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0, raising=False)
    kernel = _Kernel()
    return kernel, GluonLauncher(kernel)


def _args(t, n, block=(1, 64), dtype=F16):
    base = torch.zeros(4, 64, dtype=dtype)
    desc = Tma(base, (4, 64), (64, 1), block, fa3_host.smem_layout(block, dtype))
    return (desc, t, n, 0.5)


def test_the_launcher_compiles_once_then_launches_directly(gpu_free_launcher):
    kernel, launch = gpu_free_launcher
    t = torch.zeros(64, dtype=F16)
    launch((2, 1, 1), _args(t, 97), {"BLOCK": 64}, {"num_warps": 4})
    assert len(kernel.jit_calls) == 1
    grid, jit_args, kwargs = kernel.jit_calls[0]
    assert type(jit_args[0]).__name__ == "TensorDescriptor" and kwargs == {"BLOCK": 64, "num_warps": 4}
    # same specialisation (97 and 98: neither 1 nor a multiple of 16): the compiled kernel's own launcher
    launch((3, 1, 1), _args(t, 98), {"BLOCK": 64}, {"num_warps": 4})
    assert len(kernel.jit_calls) == 1
    (run,) = kernel.compiled[0].runs
    assert run[:3] == (3, 1, 1) and isinstance(run[9], Tma) and run[-3:] == (98, 0.5, 64)


@pytest.mark.parametrize(
    "change",
    [
        lambda: ((2, 1, 1), _args(torch.zeros(64, dtype=torch.bfloat16), 97), {"BLOCK": 64}, {"num_warps": 4}),
        lambda: ((2, 1, 1), _args(torch.zeros(64, dtype=F16)[1:], 97), {"BLOCK": 64}, {"num_warps": 4}),
        lambda: ((2, 1, 1), _args(torch.zeros(64, dtype=F16), 96), {"BLOCK": 64}, {"num_warps": 4}),
        lambda: ((2, 1, 1), _args(torch.zeros(64, dtype=F16), 1), {"BLOCK": 64}, {"num_warps": 4}),
        lambda: ((2, 1, 1), _args(torch.zeros(64, dtype=F16), 2**31), {"BLOCK": 64}, {"num_warps": 4}),
        lambda: ((2, 1, 1), _args(torch.zeros(64, dtype=F16), 97, block=(1, 32)), {"BLOCK": 64}, {"num_warps": 4}),
        lambda: ((2, 1, 1), _args(torch.zeros(64, dtype=F16), 97), {"BLOCK": 128}, {"num_warps": 4}),
        lambda: ((2, 1, 1), _args(torch.zeros(64, dtype=F16), 97), {"BLOCK": 64}, {"num_warps": 8}),
    ],
    ids=["dtype", "unaligned", "int-divisible-by-16", "int-one", "int64", "block", "constexpr", "option"],
)
def test_a_new_specialisation_goes_through_the_jit(gpu_free_launcher, change):
    kernel, launch = gpu_free_launcher
    launch((2, 1, 1), _args(torch.zeros(64, dtype=F16), 97), {"BLOCK": 64}, {"num_warps": 4})
    launch(*change())
    assert len(kernel.jit_calls) == 2 and launch.cached() == 2


def test_the_launch_cache_holds_no_tensor(gpu_free_launcher):
    """Keys and entries hold dtypes, flags and constexprs: nothing that keeps a tensor (or its address)."""
    _, launch = gpu_free_launcher
    for n in (97, 96, 1):
        launch((2, 1, 1), _args(torch.zeros(64, dtype=F16), n), {"BLOCK": 64}, {"num_warps": 4})

    def walk(x):
        assert not isinstance(x, (torch.Tensor, Tma)), x
        if isinstance(x, (tuple, list)):
            for y in x:
                walk(y)

    for key, (_, tail) in launch._compiled.items():
        walk(key)
        walk(tail)


def _binder(kernel):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    return create_function_from_signature(kernel.signature, kernel.params, make_backend(GPUTarget("cuda", 90, 32)))


def test_launch_keys_match_tritons_specialisation():
    """``spec_key`` against the binder Triton's JIT runs on every call (built for sm_90 without a GPU), on
    the FA-3 forward's own arguments: two argument lists get the same key exactly when Triton specialises
    them alike, so a cached launch never runs a kernel compiled for other arguments."""
    kernel = fa3.forward_kernel()
    bind = _binder(kernel)
    config, schedule = fa3.default_config(128), fa3.schedule_of("fa3")
    constexprs, options = fa3.kernel_specialisation(config, schedule, True, 128)

    def arguments(seqlen_q, seqlen_k, heads, group, q):
        q, q_desc = fa3_host.tma_arg(q, (64, 128))
        _, k_desc = fa3_host.tma_arg(q, (128, 128))
        lse = torch.zeros(4)
        strides = q.stride()[:3]
        return (q_desc, k_desc, k_desc, q_desc, q, q, q, lse, lse, lse, lse, *strides * 3, *(0,) * 9) + (
            seqlen_q,
            seqlen_k,
            heads,
            group,
            0.125,
        )

    def triton_key(args):
        jit_args = [a.descriptor() if isinstance(a, Tma) else a for a in args]
        return [s for s in bind(*jit_args, **constexprs, **options)[1]]

    q16, (qb,) = torch.zeros(1, 2, 96, 128, dtype=F16), random_tensors([(1, 2, 96, 128)], torch.bfloat16, "cpu")
    variants = [
        arguments(97, 97, 16, 1, q16),
        arguments(98, 99, 16, 1, q16),  # same specialisation
        arguments(96, 97, 16, 1, q16),
        arguments(1, 97, 16, 1, q16),
        arguments(97, 97, 16, 8, q16),
        arguments(97, 97, 12, 1, q16),
        arguments(97, 97, 16, 1, qb),
        arguments(97, 97, 16, 1, q16[:, :1]),
    ]
    for a in variants:
        for b in variants:
            same_triton = triton_key(a) == triton_key(b)
            assert (fa3_host.spec_key(a) == fa3_host.spec_key(b)) == same_triton
    assert fa3_host.spec_key(variants[0]) == fa3_host.spec_key(variants[1])
