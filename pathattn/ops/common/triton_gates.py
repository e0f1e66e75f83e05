"""The gates' per-sequence sums and block offsets as Triton kernels (PaTH-FoX and FoX).

The forward needs G_t = sum of g_s over s <= t of t's sequence; the backward turns
dL/dG into dL/dg_t = sum of dL/dG_s over s >= t (a suffix sum). Both are sums over the
tiles of a tile table (`token_blocks.token_tile_table`, or the PaTH op's block table, the
same format): `_tile_cumsum_kernel` writes each tile's own prefix (suffix) sums and its
total, `_tile_offset_kernel` adds the totals of the sequence's earlier (later) tiles, read
BB tiles at a time. Every addition reads values of the same sequence only, so a huge or
non-finite gate reaches no other sequence, and nothing is read back to the host (two
launches, where PyTorch's scan over packed sequences takes tens). `block_offsets` is
`token_blocks.block_gate_offsets` (its reference) in one kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_launch import launch_kernel
from .triton_tiles import helper

__all__ = ["sequence_cumsum", "block_offsets", "head_tile"]


@helper
def _tile(table_ptr, HQ, BT: tl.constexpr, BH: tl.constexpr):
    """The program's tile (table row program_id(0), heads tile program_id(1)): its first
    token t0, its sequence's first token s0 and end s1, the heads and their mask, and the
    offsets and mask of its [BT, BH] entries of a token-major [N, HQ] array. The tile is
    empty when t0 >= s1."""
    blk = tl.program_id(0)
    heads = tl.program_id(1) * BH + tl.arange(0, BH)
    hmask = heads < HQ
    t0 = tl.load(table_ptr + blk * 3)
    s0 = tl.load(table_ptr + blk * 3 + 1)
    s1 = tl.load(table_ptr + blk * 3 + 2)
    rows = t0 + tl.arange(0, BT)
    offs = rows.to(tl.int64)[:, None] * HQ + heads[None, :]
    return t0, s0, s1, heads, hmask, offs, (rows < s1)[:, None] & hmask[None, :]


@triton.jit
def _tile_cumsum_kernel(x_ptr, out_ptr, total_ptr, table_ptr, HQ, REVERSE: tl.constexpr,
                        BT: tl.constexpr, BH: tl.constexpr, FINITE: tl.constexpr = False):
    blk = tl.program_id(0)
    t0, _, s1, heads, hmask, offs, mask = _tile(table_ptr, HQ, BT, BH)
    if t0 >= s1:
        return
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float64)  # [BT, BH]
    if FINITE:  # non-finite entries read as 0 (NaN fails the comparison too)
        x = tl.where(tl.abs(x) < float("inf"), x, 0.0)
    tl.store(out_ptr + offs, tl.cumsum(x, axis=0, reverse=REVERSE), mask=mask)
    tl.store(total_ptr + blk.to(tl.int64) * HQ + heads, tl.sum(x, axis=0), mask=hmask)


@triton.jit
def _tile_offset_kernel(out_ptr, total_ptr, table_ptr, HQ, REVERSE: tl.constexpr,
                        BT: tl.constexpr, BH: tl.constexpr, BB: tl.constexpr):
    blk = tl.program_id(0)
    t0, s0, s1, heads, hmask, offs, mask = _tile(table_ptr, HQ, BT, BH)
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
        toffs = (first + idx).to(tl.int64)[:, None] * HQ + heads[None, :]
        t = tl.load(total_ptr + toffs, mask=(idx < n)[:, None] & hmask[None, :], other=0.0)
        acc += tl.sum(t, axis=0)
    tl.store(out_ptr + offs, tl.load(out_ptr + offs, mask=mask, other=0.0) + acc[None, :],
             mask=mask)


def sequence_cumsum(x: torch.Tensor, table: torch.Tensor, BT: int,
                    reverse: bool = False, finite: bool = False) -> torch.Tensor:
    """x [N, HQ] (any float dtype) -> float64 [N, HQ]: inclusive prefix sums (suffix sums
    with reverse=True) within each sequence of `table`, the tiles of BT tokens of
    `pathattn.ops.common.token_blocks.token_tile_table`; finite: x's non-finite entries
    read as 0."""
    N, HQ = x.shape
    x = x.contiguous()
    out = torch.empty(N, HQ, dtype=torch.float64, device=x.device)
    total = torch.empty(table.shape[0], HQ, dtype=torch.float64, device=x.device)
    BH = head_tile(HQ)
    grid = (table.shape[0], triton.cdiv(HQ, BH))
    launch_kernel(_tile_cumsum_kernel, grid)(x, out, total, table, HQ, REVERSE=reverse, BT=BT,
                                             BH=BH, FINITE=finite, num_warps=4,
                                             num_stages=1)
    launch_kernel(_tile_offset_kernel, grid)(out, total, table, HQ, REVERSE=reverse, BT=BT,
                                             BH=BH, BB=32, num_warps=4, num_stages=1)
    return out


@triton.jit
def _block_offsets_kernel(G_ptr, offs_ptr, table_ptr, NTOK, HQ, BT: tl.constexpr,
                          BH: tl.constexpr):
    t0, _, s1, heads, hmask, offs, mask = _tile(table_ptr, HQ, BT, BH)
    if t0 >= s1:
        return
    G = tl.load(G_ptr + offs, mask=mask, other=0.0)  # [BT, BH] float64
    last = tl.minimum(t0 + BT, s1) - 1
    first_g = tl.load(G_ptr + t0.to(tl.int64) * HQ + heads, mask=hmask, other=0.0)
    last_g = tl.load(G_ptr + last.to(tl.int64) * HQ + heads, mask=hmask, other=0.0)
    rows = t0 + tl.arange(0, BT)
    out = heads.to(tl.int64)[None, :] * NTOK + rows[:, None]  # head-major [2, HQ, NTOK]
    tl.store(offs_ptr + out, (G - first_g[None, :]).to(tl.float32), mask=mask)
    tl.store(offs_ptr + HQ * NTOK + out, (G - last_g[None, :]).to(tl.float32), mask=mask)


def block_offsets(G: torch.Tensor, table: torch.Tensor, BT: int) -> torch.Tensor:
    """G [N, HQ] float64 -> [2, HQ, N] float32: G_t - G at the first token of t's tile
    and G_t - G at its last, the tiles of `table` (BT tokens; each difference formed in
    float64 and rounded once), as `token_blocks.block_gate_offsets`."""
    N, HQ = G.shape
    G = G.contiguous()
    out = torch.empty(2, HQ, N, dtype=torch.float32, device=G.device)
    BH = head_tile(HQ)
    launch_kernel(_block_offsets_kernel, (table.shape[0], triton.cdiv(HQ, BH)))(
        G, out, table, N, HQ, BT=BT, BH=BH, num_warps=4, num_stages=1)
    return out


def head_tile(HQ: int) -> int:
    """Heads per program of the kernels here (BH)."""
    return min(32, triton.next_power_of_2(max(HQ, 1)))
