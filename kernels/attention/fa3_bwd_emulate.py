"""The FA-3 backward's tile algorithm in PyTorch, step for step, to check it where the Gluon kernel cannot run.

``emulate`` computes dQ, dK and dV the way ``fa3_bwd_kernels._fa3_bwd_kernel`` does: the same preprocess and
dQ conversion (``fa3_bwd.prepare`` and ``fa3_bwd.finish``, the real Triton kernels: in the interpreter on a
CPU), and between them one pass per block of 128 keys (64 at d = 256) of each (batch, K/V head) over the query tiles of
``fa3_bwd.tile_range`` (the masked ones first), every query head of the group in turn; tiles padded with
zeros past the sequences' ends as TMA pads them; each product in fp32 from operands in the inputs' dtype,
rounded where the kernel rounds (Pᵀ and dSᵀ to the inputs' dtype before their products, dK and dV at the
end); dQ added in fp32 to the accumulator one key block at a time, in ``key_order`` (the deterministic
kernel's order is ascending). What it does not model: the order of the additions inside one product (the
tensor cores' own), and so the last bits of every fp32 sum.
"""

from __future__ import annotations

import torch

from kernels._runtime import softmax_scale
from kernels.attention import fa3_bwd
from kernels.attention.fa3_host import cdiv

__all__ = ["emulate"]

_LOG2E = 1.4426950408889634


def _padded(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` [B, H, N, d] as fp32 with zero rows up to ``rows`` (TMA's zero fill past the end)."""
    out = torch.zeros((*t.shape[:2], rows, t.shape[3]), dtype=torch.float32, device=t.device)
    out[:, :, : t.shape[2]] = t.float()
    return out


def emulate(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    *,
    block_m: int = 64,
    block_n: int | None = None,
    key_order: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) as the FA-3 backward computes them, on any device (arguments as ``fa3_bwd.backward``;
    ``out`` and ``lse`` from a forward of the same inputs). ``block_n``: keys per CTA, by default the head
    dim's (``fa3_bwd.default_config``: 64 at d = 256, whose consumers split the head dim, which changes no
    sum). ``key_order``: the order in which the key blocks' dQ adds land (default ascending, the deterministic
    kernel's)."""
    b, h, seqlen_q, d = q.shape
    h_kv, seqlen_k = k.shape[1], k.shape[2]
    group = h // h_kv
    sm_scale = softmax_scale(d, sm_scale)
    dtype = q.dtype
    block_n = fa3_bwd.default_config(d).block_n if block_n is None else block_n
    n_blocks = cdiv(seqlen_k, block_n)
    work = fa3_bwd.prepare(do.to(dtype), q, out, lse, block_m, deterministic=False)
    lse2, delta = work.rows[0], work.rows[1]
    dq_acc = work.dq_acc
    qs, dos = _padded(q, work.q_rows), _padded(do.to(dtype), work.q_rows)
    ks, vs = _padded(k, n_blocks * block_n), _padded(v, n_blocks * block_n)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    qk_scale = sm_scale * _LOG2E
    order = list(range(n_blocks)) if key_order is None else list(key_order)
    if sorted(order) != list(range(n_blocks)):
        raise ValueError(f"key_order must be a permutation of the {n_blocks} key blocks, got {key_order}")
    for bb in range(b):
        for hk in range(h_kv):
            for j in order:
                i_lo, i_mid, n_m = fa3_bwd.tile_range(j, seqlen_q, seqlen_k, block_m, causal, block_n)
                keys = slice(j * block_n, (j + 1) * block_n)
                k_j, v_j = ks[bb, hk, keys], vs[bb, hk, keys]
                dk_j = torch.zeros((block_n, d), dtype=torch.float32, device=q.device)
                dv_j = torch.zeros_like(dk_j)
                key_ids = torch.arange(j * block_n, (j + 1) * block_n, device=q.device)[:, None]
                for g in range(group):
                    hh = hk * group + g
                    bh = bb * h + hh
                    for i in range(i_lo, n_m):
                        rows = slice(i * block_m, (i + 1) * block_m)
                        q_i, do_i = qs[bb, hh, rows], dos[bb, hh, rows]
                        p = torch.exp2(k_j @ q_i.T * qk_scale - lse2[bh, rows][None, :])  # Pᵀ [keys, queries]
                        if i < i_mid:
                            keep = key_ids < seqlen_k
                            if causal:
                                query_ids = torch.arange(i * block_m, (i + 1) * block_m, device=q.device)[None, :]
                                keep = keep & (key_ids <= query_ids + (seqlen_k - seqlen_q))
                            p = torch.where(keep, p, 0.0)
                        dv_j += p.to(dtype).float() @ do_i
                        dp = v_j @ do_i.T
                        ds = (p * (dp - delta[bh, rows][None, :])).to(dtype).float()
                        dk_j += ds @ q_i
                        dq_acc[bh, rows] += ds.T @ k_j
                valid = min(block_n, seqlen_k - j * block_n)
                dk[bb, hk, j * block_n : j * block_n + valid] = (dk_j[:valid] * sm_scale).to(dtype)
                dv[bb, hk, j * block_n : j * block_n + valid] = dv_j[:valid].to(dtype)
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    fa3_bwd.finish(work, dq, sm_scale, block_m)
    return dq, dk, dv
