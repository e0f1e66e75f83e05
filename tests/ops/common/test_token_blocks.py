"""Tile tables of the flattened token axis and the gate offsets per tile
(`pathattn.ops.common.token_blocks`)."""

from __future__ import annotations

import torch

from pathattn.ops.common.layout import token_bounds
from pathattn.ops.common.token_blocks import block_gate_offsets, max_tiles, token_tile_table
from pathattn.ops.path.gates import sequence_cumsum


def _expected(bounds, BT):
    rows = [(t, a, e) for a, e in bounds for t in range(a, e, BT)]
    return torch.tensor(rows, dtype=torch.int32).reshape(-1, 3)


def test_dense_batch():
    table = token_tile_table(2, 20, None, 8, torch.device("cpu"))
    assert torch.equal(table, _expected([(0, 20), (20, 40)], 8))


def test_packed_sequences_with_empty_ones():
    cu = torch.tensor([0, 1, 1, 17, 40, 40])
    table = token_tile_table(1, 40, cu, 8, torch.device("cpu"))
    assert table.shape[0] == max_tiles(1, 40, cu, 8) == 5 + 5
    used = _expected([(0, 1), (1, 17), (17, 40)], 8)
    assert torch.equal(table[:len(used)], used)
    assert not table[len(used):].any()  # unused rows: (0, 0, 0)


def _offsets_by_loop(G: torch.Tensor, cu: list[int], bt: int) -> torch.Tensor:
    out = torch.zeros(2, G.shape[1], G.shape[0], dtype=torch.float32)
    for s0, s1 in zip(cu[:-1], cu[1:], strict=True):
        for b0 in range(s0, s1, bt):
            b1 = min(b0 + bt, s1) - 1
            for t in range(b0, b1 + 1):
                out[0, :, t] = (G[t] - G[b0]).float()
                out[1, :, t] = (G[t] - G[b1]).float()
    return out


def test_offsets_follow_blocks_of_each_sequence():
    """Packed sequences of lengths 5, 0, 9, 1 with 4-token blocks: partial blocks at every
    sequence's end, each offset the float64 difference rounded once (g = -1e5 on one token
    keeps the rounding visible: a float32 difference of G would be off)."""
    cu = [0, 5, 5, 14, 15]
    g = -torch.rand(15, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    g[7] = -1e5
    start, end = token_bounds(1, 15, torch.tensor(cu), g.device)
    G = sequence_cumsum(g, start, end)
    got = block_gate_offsets(G, start, end, 4)
    assert got.shape == (2, 3, 15) and got.dtype == torch.float32 and got.is_contiguous()
    assert torch.equal(got, _offsets_by_loop(G, cu, 4))
    # the rounding is the float64 difference's, not float32 G's
    assert not torch.equal(got[1, :, 8:11], (G[8:11].float() - G[11].float()).t())


def test_dense_rows_restart():
    """Two rows of 6 tokens (B = 2, T = 6) with 4-token blocks: blocks [0, 4), [4, 6) in
    each row, the second row's never reaching back into the first."""
    g = -torch.rand(12, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    start, end = token_bounds(2, 6, None, g.device)
    G = sequence_cumsum(g, start, end, row_length=6)
    assert torch.equal(block_gate_offsets(G, start, end, 4),
                       _offsets_by_loop(G, [0, 6, 12], 4))
