"""Tiles of consecutive tokens for kernels that walk a flattened batch.

A kernel that sees the batch as N = B * T tokens (a dense batch is the packed batch with
boundaries 0, T, 2T, ...) is launched over a table of tiles: each tile is up to BT tokens of
one sequence, starting at the sequence's first token or BT after the previous tile, so only
a sequence's last tile can be partial and no tile straddles two sequences. The table is
built on the tensors' device from shapes alone: no value is read back to the host, so a
call does not wait for the device.
"""

from __future__ import annotations

import torch

__all__ = ["token_tile_table", "max_tiles", "block_gate_offsets"]


def max_tiles(B: int, T: int, cu_seqlens: torch.Tensor | None, BT: int) -> int:
    """Rows of `token_tile_table`: B * ceil(T / BT) for a dense batch; with cu_seqlens
    [S + 1] the bound ceil(T / BT) + S (each sequence wastes at most one partial tile)."""
    if cu_seqlens is None:
        return B * -(-T // BT)
    return -(-T // BT) + cu_seqlens.shape[0] - 1


def token_tile_table(B: int, T: int, cu_seqlens: torch.Tensor | None, BT: int,
                     device: torch.device) -> torch.Tensor:
    """int32 [NB, 3], NB = `max_tiles`: per tile its first token, its sequence's first token
    and one past its sequence's last token (flattened [B * T] token axis). The tiles of a
    sequence are consecutive rows, left to right. Rows past the last tile (packed batches)
    are (0, 0, 0): kernels skip a row whose first token is not before its sequence's end."""
    if cu_seqlens is None:
        per_row = -(-T // BT)
        tile = torch.arange(B * per_row, device=device)  # [NB]
        seq_start = tile // per_row * T
        first = seq_start + tile % per_row * BT
        return torch.stack([first, seq_start, seq_start + T], dim=1).to(torch.int32)
    cu = cu_seqlens.to(device=device, dtype=torch.int64)
    tiles = (cu[1:] - cu[:-1] + BT - 1) // BT  # [S] tiles per sequence
    first_row = torch.cat([tiles.new_zeros(1), tiles.cumsum(0)])  # [S + 1]
    row = torch.arange(max_tiles(B, T, cu_seqlens, BT), device=device)  # [NB]
    # the sequence of a row: the last one whose first row is <= row (empty ones skipped)
    seq = (torch.bucketize(row, first_row, right=True) - 1).clamp(0, tiles.shape[0] - 1)
    start, end = cu[seq], cu[seq + 1]
    first = start + (row - first_row[seq]) * BT
    used = row < first_row[-1]
    table = torch.stack([first, start, end], dim=1) * used[:, None]  # [NB, 3]
    return table.to(torch.int32)


def block_gate_offsets(G: torch.Tensor, seq_start: torch.Tensor, seq_end: torch.Tensor,
                       block_size: int) -> torch.Tensor:
    """G [N, HQ] float64 (per-sequence cumulative forget gates of N flattened tokens) ->
    [2, HQ, N] float32, head-major: G_t - G at the first token of t's tile, and G_t - G at
    its last, for the tiles of `token_tile_table` with BT = block_size (seq_start, seq_end
    [N] int64 as `layout.token_bounds` gives them). Each difference is formed in float64
    and rounded once. A kernel meeting query i of the tile starting at a0 and key j of an
    earlier tile ending at b1 adds (G_i - G_a0) + (G_a0 - G_b1) - (G_j - G_b1): with g <= 0
    the three terms have one sign, so the float32 sum is as exact as G_i - G_j formed in
    float64 and rounded once, with no float64 arithmetic per element."""
    t = torch.arange(G.shape[0], device=G.device)
    first = seq_start + (t - seq_start) // block_size * block_size
    last = torch.minimum(first + block_size, seq_end) - 1
    out = torch.stack([G - G.index_select(0, first), G - G.index_select(0, last)])
    return out.transpose(1, 2).float().contiguous()
