"""The blockwise op never allocates a T x T tensor: the largest single allocation of a
forward + backward is one chunk of a scan step's tiles, at most TILE_ELEMENTS entries (or one
block's tiles, HQ * C^2, when that is more), or an O(T) tensor of the inputs' size."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from pathattn.ops import sb_attn

ALLOCATIONS = ("aten::empty", "aten::empty_strided", "[memory]")


@pytest.mark.parametrize("budget", [None, 512], ids=["default", "budget512"])
def test_largest_allocation_is_one_chunk_of_tiles(budget, monkeypatch):
    from pathattn.ops.sba import blockwise

    if budget is not None:
        monkeypatch.setattr(blockwise, "TILE_ELEMENTS", budget)
    T, C, D = 256, 8, 4
    q, k, v = (torch.randn(1, T, 1, D, requires_grad=True) for _ in range(3))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        sb_attn(q, k, v, block_size=C).sum().backward()
    largest = max(e.cpu_memory_usage for e in prof.events() if e.name in ALLOCATIONS)
    assert all(x.grad is not None for x in (q, k, v))
    tiles = min(T * C, budget or T * C) * 4  # float32 tiles [<= T / C, 1, C, C]
    assert largest <= max(tiles, T * D * 4), (largest, tiles)
    assert largest * 32 <= T * T * 4  # far below one T x T float32 matrix
