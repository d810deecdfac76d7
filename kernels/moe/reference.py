"""The plain-PyTorch mixture-of-experts reference: a loop over experts, for tests and benchmark baselines.

Written independently of the kernels' dispatch: each expert selects its tokens with a boolean mask and
the outputs are accumulated per token. ``dtype`` sets the precision of the expert computation (float64
for the ground truth; the inputs' dtype for the "same-precision PyTorch" of the tolerance policy, where
every matmul output is rounded as torch rounds it). Routing runs in float64 for a float64 reference,
else in float32 as in the kernels' ``routing.route``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["route_reference", "grouped_gemm_reference", "moe_ffn_reference"]


def route_reference(router_logits: torch.Tensor, top_k: int, renormalize: bool = True, dtype=torch.float32):
    probs = torch.softmax(router_logits.to(dtype), dim=-1)
    weights, expert_ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, expert_ids


def grouped_gemm_reference(
    a: torch.Tensor, b: torch.Tensor, expert_offsets: torch.Tensor, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Per-expert ``a[segment] @ b[e]`` in ``dtype`` (default: a's), one matmul per expert."""
    dtype = dtype or a.dtype
    out = torch.zeros((a.shape[0], b.shape[2]), dtype=dtype, device=a.device)
    start = 0
    for e, end in enumerate(expert_offsets.tolist()):
        out[start:end] = a[start:end].to(dtype) @ b[e].to(dtype)
        start = end
    return out


def moe_ffn_reference(
    x: torch.Tensor,
    router_logits: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    top_k: int,
    renormalize: bool = True,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The MoE SwiGLU layer by a loop over experts; result in ``dtype`` (default: x's)."""
    dtype = dtype or x.dtype
    route_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    weights, expert_ids = route_reference(router_logits, top_k, renormalize, route_dtype)
    out = torch.zeros(x.shape, dtype=route_dtype, device=x.device)
    xd = x.to(dtype)
    for e in range(router_logits.shape[1]):
        token, choice = torch.nonzero(expert_ids == e, as_tuple=True)
        if token.numel() == 0:
            continue
        xe = xd[token]
        hidden = F.silu(xe @ w_gate[e].to(dtype)) * (xe @ w_up[e].to(dtype))
        y = hidden @ w_down[e].to(dtype)
        out.index_add_(0, token, y.to(route_dtype) * weights[token, choice, None])
    return out.to(dtype)
