"""Tile orders shared by the kernels of several families (``@triton.jit`` helpers, inlined where called).

``grouped_order`` maps a linear tile index to (tile along the grouped axis, tile along the other axis) in the
grouped order of Triton's matmul tutorial: GROUP consecutive tiles of the first axis sweep every tile of the
second together, so that programs running at the same time share both operands' tiles in L2. Used by the
grouped GEMM (``kernels.moe``: row tiles grouped) and the persistent W4A16 kernel (``kernels.w4a16``: weight
tiles grouped).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def grouped_order(tile, tiles_a, tiles_b, GROUP: tl.constexpr):
    """(index along a, index along b) of linear tile ``tile`` of a ``tiles_a × tiles_b`` grid: groups of
    GROUP tiles along a, each group sweeping b, its a tiles varying fastest."""
    in_group = GROUP * tiles_b
    first = (tile // in_group) * GROUP
    size = tl.minimum(tiles_a - first, GROUP)
    return first + (tile % in_group) % size, (tile % in_group) // size
