"""Top-k routing, and the dispatch/combine permutations of a mixture-of-experts layer, in device torch ops.

What it is: the router (softmax over the experts' logits in float32, top-k, optional renormalisation of
the k weights), then the bookkeeping that turns ``[tokens, k]`` expert choices into contiguous per-expert
segments for a grouped GEMM, and back. Nothing here reads a value back to the host: the permutation
comes from a stable sort of the expert ids, the segment ends from a binary search of each expert id in
the sorted ids (equal to bincount + cumsum, which tests check, but bincount sizes its output by the
largest id, a device-to-host read), so the grouped GEMM's launch shape depends only on sizes the host
already knows. Ids outside ``[0, E)`` are not detected (that would need a read-back) and give wrong
segments: ``route`` never produces them.

Layout of a dispatch: the ``tokens × k`` assignments are numbered as slots ``s = token · k + j`` (token
order, then choice order). ``slot_order[i]`` is the slot that sorted row ``i`` came from; rows are
sorted by expert, and, the sort being stable, by token within an expert. ``expert_offsets[e]`` is the
int32 END of expert ``e``'s segment (torch._grouped_mm's convention), so expert ``e`` owns rows
``[expert_offsets[e-1], expert_offsets[e])`` with ``expert_offsets[-1] = tokens · k``.

Combine is deterministic: each token has exactly k slots, so the sorted results are put back in slot
order (a scatter with unique indices) and the k weighted rows are summed by a reshape-sum in float32,
with no atomics.

Tested: on CPU (tests/kernels/test_moe.py) and on an H200, where a GPU-only test asserts the absence of
host synchronisation (``torch.cuda.set_sync_debug_mode("error")`` around ``moe_ffn``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["Dispatch", "route", "dispatch", "gather", "combine"]


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over ``router_logits [tokens, E]`` then top-k.

    Returns ``(weights [tokens, k] float32, expert_ids [tokens, k] int64)``, each row's choices in
    descending weight. With ``renormalize`` the k weights of a token are divided by their sum (they sum
    to 1); without it they are the softmax probabilities themselves.
    """
    if not isinstance(router_logits, torch.Tensor):
        raise TypeError(f"router_logits must be a torch.Tensor, got {type(router_logits).__name__}")
    if router_logits.dim() != 2:
        raise ValueError(f"router_logits must be [tokens, experts], got shape {tuple(router_logits.shape)}")
    if not router_logits.is_floating_point():
        raise TypeError(f"router_logits must be floating point, got {router_logits.dtype}")
    num_experts = router_logits.shape[1]
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be an int in [1, {num_experts}] (the number of experts), got {top_k!r}")
    # float32 whatever the logits' dtype: a half-precision softmax would round close weights together
    # and could change which experts are chosen
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, expert_ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, expert_ids


class Dispatch(NamedTuple):
    """Where each sorted row comes from and where each expert's segment ends (see the module docstring)."""

    slot_order: torch.Tensor  # [tokens * k] int64: sorted row -> slot (token * k + j)
    token_index: torch.Tensor  # [tokens * k] int64: sorted row -> source token
    counts: torch.Tensor  # [E] int64: rows per expert
    expert_offsets: torch.Tensor  # [E] int32: cumulative END offsets of the segments
    top_k: int

    @property
    def num_rows(self) -> int:
        return self.slot_order.numel()


def dispatch(expert_ids: torch.Tensor, num_experts: int) -> Dispatch:
    """Sort the ``[tokens, k]`` expert choices by expert, on the device, without a host round trip."""
    if expert_ids.dim() != 2:
        raise ValueError(f"expert_ids must be [tokens, k], got shape {tuple(expert_ids.shape)}")
    if expert_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"expert_ids must be int32 or int64, got {expert_ids.dtype}")
    if num_experts < 1:
        raise ValueError(f"num_experts must be ≥ 1, got {num_experts}")
    flat = expert_ids.reshape(-1).long()
    sorted_ids, slot_order = torch.sort(flat, stable=True)
    # segment ends by binary search in the sorted ids: the same numbers as bincount + cumsum, but with
    # an output size the host knows (bincount sizes its output by the largest id, a device-to-host read)
    experts = torch.arange(num_experts, device=flat.device, dtype=flat.dtype)
    ends = torch.searchsorted(sorted_ids, experts, right=True)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    return Dispatch(slot_order, slot_order // expert_ids.shape[1], counts, ends.to(torch.int32), expert_ids.shape[1])


def gather(x: torch.Tensor, plan: Dispatch) -> torch.Tensor:
    """``x [tokens, H]`` copied once into expert order: ``[tokens * k, H]``, contiguous per expert."""
    return x.index_select(0, plan.token_index)


def combine(y: torch.Tensor, weights: torch.Tensor, plan: Dispatch) -> torch.Tensor:
    """Sorted expert outputs ``y [tokens * k, H]`` back to token order, weighted and summed over the k choices.

    The weighted sum is in float32 (``weights`` are float32) and the result is cast to ``y``'s dtype.
    """
    tokens, k = weights.shape
    if k != plan.top_k or y.shape[0] != tokens * k:
        raise ValueError(f"y has {y.shape[0]} rows and weights shape {tuple(weights.shape)}; expected {tokens}·{k}")
    # slot_order is a permutation: every row written once, no accumulation
    by_slot = torch.empty_like(y).index_copy_(0, plan.slot_order, y)
    out = (by_slot.view(tokens, k, y.shape[1]).float() * weights.unsqueeze(-1).float()).sum(dim=1)
    return out.to(y.dtype)
