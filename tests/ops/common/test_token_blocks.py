"""Tile tables of the flattened token axis (`pathattn.ops.common.token_blocks`)."""

from __future__ import annotations

import torch

from pathattn.ops.common.token_blocks import max_tiles, token_tile_table


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
