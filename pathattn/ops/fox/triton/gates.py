"""Per-sequence cumulative sums of the gates, in float64, as two Triton kernels.

The forward needs G_t = sum of g_s over s <= t of t's sequence; the backward turns
dL/dG into dL/dg_t = sum of dL/dG_s over s >= t (a suffix sum). Both are sums over the
tiles of `token_tile_table`: `_tile_cumsum_kernel` writes each tile's own prefix (suffix)
sums and its total, `_tile_offset_kernel` adds the totals of the sequence's earlier (later)
tiles, read BB tiles at a time. Every addition reads values of the same sequence only, so a
huge or non-finite gate reaches no other sequence, and nothing is read back to the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...common.triton_launch import launch_kernel

__all__ = ["sequence_cumsum"]


@triton.jit
def _tile_cumsum_kernel(x_ptr, out_ptr, total_ptr, table_ptr, HQ, REVERSE: tl.constexpr,
                        BT: tl.constexpr, BH: tl.constexpr):
    blk = tl.program_id(0)
    heads = tl.program_id(1) * BH + tl.arange(0, BH)
    hmask = heads < HQ
    t0 = tl.load(table_ptr + blk * 3)
    s1 = tl.load(table_ptr + blk * 3 + 2)
    if t0 >= s1:
        return
    rows = t0 + tl.arange(0, BT)
    offs = rows.to(tl.int64)[:, None] * HQ + heads[None, :]
    mask = (rows < s1)[:, None] & hmask[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float64)  # [BT, BH]
    tl.store(out_ptr + offs, tl.cumsum(x, axis=0, reverse=REVERSE), mask=mask)
    tl.store(total_ptr + blk.to(tl.int64) * HQ + heads, tl.sum(x, axis=0), mask=hmask)


@triton.jit
def _tile_offset_kernel(out_ptr, total_ptr, table_ptr, HQ, REVERSE: tl.constexpr,
                        BT: tl.constexpr, BH: tl.constexpr, BB: tl.constexpr):
    blk = tl.program_id(0)
    heads = tl.program_id(1) * BH + tl.arange(0, BH)
    hmask = heads < HQ
    t0 = tl.load(table_ptr + blk * 3)
    s0 = tl.load(table_ptr + blk * 3 + 1)
    s1 = tl.load(table_ptr + blk * 3 + 2)
    if t0 >= s1:
        return
    a = (t0 - s0) // BT  # this tile's index in its sequence
    if REVERSE:  # the tiles after this one
        first = blk + 1
        n = (s1 - s0 + BT - 1) // BT - 1 - a
    else:  # the tiles before it
        first = blk - a
        n = a
    acc = tl.zeros([BH], dtype=tl.float64)
    for b0 in range(0, n, BB):
        idx = b0 + tl.arange(0, BB)
        offs = (first + idx).to(tl.int64)[:, None] * HQ + heads[None, :]
        t = tl.load(total_ptr + offs, mask=(idx < n)[:, None] & hmask[None, :], other=0.0)
        acc += tl.sum(t, axis=0)
    rows = t0 + tl.arange(0, BT)
    offs = rows.to(tl.int64)[:, None] * HQ + heads[None, :]
    mask = (rows < s1)[:, None] & hmask[None, :]
    tl.store(out_ptr + offs, tl.load(out_ptr + offs, mask=mask, other=0.0) + acc[None, :],
             mask=mask)


def sequence_cumsum(x: torch.Tensor, table: torch.Tensor, BT: int,
                    reverse: bool = False) -> torch.Tensor:
    """x [N, HQ] (any float dtype) -> float64 [N, HQ]: inclusive prefix sums (suffix sums
    with reverse=True) within each sequence of `table`, the tiles of BT tokens of
    `pathattn.ops.common.token_blocks.token_tile_table`."""
    N, HQ = x.shape
    x = x.contiguous()
    out = torch.empty(N, HQ, dtype=torch.float64, device=x.device)
    total = torch.empty(table.shape[0], HQ, dtype=torch.float64, device=x.device)
    BH = min(32, triton.next_power_of_2(max(HQ, 1)))
    grid = (table.shape[0], triton.cdiv(HQ, BH))
    launch_kernel(_tile_cumsum_kernel, grid)(x, out, total, table, HQ, REVERSE=reverse, BT=BT,
                                             BH=BH, num_warps=4, num_stages=1)
    launch_kernel(_tile_offset_kernel, grid)(out, total, table, HQ, REVERSE=reverse, BT=BT,
                                             BH=BH, BB=32, num_warps=4, num_stages=1)
    return out
