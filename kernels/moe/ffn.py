"""A mixture-of-experts SwiGLU feed-forward layer: route, dispatch, two grouped GEMMs, combine.

What it is: ``moe_ffn(x, router_logits, w_gate, w_up, w_down, top_k)`` computes, for every token, the
router-weighted sum over its top-k experts of ``(silu(x W_gate[e]) ⊙ (x W_up[e])) W_down[e]``. Steps:
``routing.route`` (float32 softmax, top-k, optional renormalisation); ``routing.dispatch`` (sort by
expert on the device, int32 segment ends); ``routing.gather`` (each token copied once per choice into
contiguous per-expert segments); one grouped GEMM with the SwiGLU epilogue fused (gate and up products
accumulated side by side in fp32, ``silu(gate) · up`` written once, in the inputs' dtype); one grouped
GEMM for the down projection; ``routing.combine`` (back to token order, weighted, summed over k in
float32, deterministic). No step reads a value back to the host (asserted by a GPU-only test).

Does not handle: a backward pass, expert parallelism, capacity limits / token dropping, shared experts,
biases, quantised weights.

Tested: in Triton's interpreter on CPU against ``reference.moe_ffn_reference`` in float64
(tests/kernels/test_moe.py), and on an H200 (the GPU-marked tests: bf16 against the reference, no host
synchronisation). The ``moe`` family's experiment times the layer stage by stage (``analysis/families/moe/run.py``).
"""

from __future__ import annotations

import torch

from kernels._runtime import check_device, check_flag
from kernels.moe import routing
from kernels.moe.grouped_gemm import PATHS, SUPPORTED_DTYPES, grouped_gemm

__all__ = ["moe_ffn", "expert_ffn"]


def _check_inputs(x, router_logits, w_gate, w_up, w_down) -> None:
    names = ("x", "router_logits", "w_gate", "w_up", "w_down")
    tensors = (x, router_logits, w_gate, w_up, w_down)
    for name, t in zip(names, tensors, strict=True):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if x.dim() != 2:
        raise ValueError(f"x must be [tokens, H], got shape {tuple(x.shape)}")
    h = x.shape[1]
    # the weights define the experts; the router's logits must have one column per expert
    if w_gate.dim() != 3 or w_gate.shape[1] != h:
        raise ValueError(f"w_gate must be [E, H, F] = [E, {h}, F] (H from x), got {tuple(w_gate.shape)}")
    e = w_gate.shape[0]
    if router_logits.dim() != 2 or router_logits.shape[0] != x.shape[0]:
        raise ValueError(
            f"router_logits must be [tokens, E] = [{x.shape[0]}, E] (tokens from x), got {tuple(router_logits.shape)}"
        )
    if router_logits.shape[1] != e:
        raise ValueError(
            f"router_logits has {router_logits.shape[1]} expert columns but w_gate has {e} experts (its dim 0): "
            f"router_logits must be [tokens, E] = [{x.shape[0]}, {e}], got {tuple(router_logits.shape)}"
        )
    if w_up.shape != w_gate.shape:
        raise ValueError(f"w_up must have w_gate's shape {tuple(w_gate.shape)}, got {tuple(w_up.shape)}")
    f = w_gate.shape[2]
    if w_down.shape != (e, f, h):
        raise ValueError(f"w_down must be [E, F, H] = [{e}, {f}, {h}], got {tuple(w_down.shape)}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"x has dtype {x.dtype}; supported: {', '.join(str(d)[6:] for d in SUPPORTED_DTYPES)}")
    for name, t in zip(names[2:], tensors[2:], strict=True):
        if t.dtype != x.dtype:
            raise TypeError(f"{name} must have x's dtype {x.dtype}, got {t.dtype}")
    check_device(*tensors, names=names)


def moe_ffn(
    x: torch.Tensor,
    router_logits: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    top_k: int,
    renormalize: bool = True,
    *,
    path: str | None = None,
) -> torch.Tensor:
    """MoE SwiGLU layer: ``x [tokens, H]``, ``router_logits [tokens, E]``, ``w_gate``/``w_up [E, H, F]``,
    ``w_down [E, F, H]``; returns ``[tokens, H]`` in x's dtype (float16, bfloat16; float32 to test).

    ``renormalize``: divide each token's k router weights by their sum (Mixtral's convention); without
    it the weights are the softmax probabilities of the chosen experts. ``path``: the grouped GEMMs' kernel
    (``grouped_gemm``'s ``path``: None, ``"grouped"``, ``"persistent"``).
    """
    _check_inputs(x, router_logits, w_gate, w_up, w_down)
    renormalize = check_flag("renormalize", renormalize)
    if path is not None and path not in PATHS:
        raise ValueError(f"path must be one of {PATHS} or None (the default, 'grouped'), got {path!r}")
    weights, expert_ids = routing.route(router_logits, top_k, renormalize)
    plan = routing.dispatch(expert_ids, router_logits.shape[1])
    ys = expert_ffn(routing.gather(x, plan), plan, w_gate, w_up, w_down, path)
    return routing.combine(ys, weights, plan)


def expert_ffn(xs: torch.Tensor, plan: routing.Dispatch, w_gate, w_up, w_down, path: str | None = None) -> torch.Tensor:
    """The experts' SwiGLU on rows already sorted by expert (``routing.gather``): the fused gate/up grouped
    GEMM, then the down projection, both on ``path``; ``[tokens · k, H]`` in the sorted order. No input
    checks (``moe_ffn`` does them); the experiments time this step alone."""
    hidden = grouped_gemm(xs, w_gate, plan.expert_offsets, swiglu_b=w_up, check_offsets=False, path=path)
    return grouped_gemm(hidden, w_down, plan.expert_offsets, check_offsets=False, path=path)
