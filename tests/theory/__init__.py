"""Tests of pathattn.theory: the appendix constructions against plain-Python ground truth,
and where float32 / bf16 precision ends. Shared sequence builders live here."""

from __future__ import annotations

import torch

from pathattn.theory import START, SWAPS


def swap_id(x: int, y: int) -> int:
    """The token id of the swap [x <-> y]."""
    return 1 + SWAPS.index((x, y))


def swap_ids(swaps: list[tuple[int, int]]) -> torch.Tensor:
    """ids [1, 1 + len(swaps)]: `#` then the given swaps."""
    return torch.tensor([[START] + [swap_id(x, y) for x, y in swaps]])


def random_swap_ids(B: int, T: int, seed: int) -> torch.Tensor:
    """ids [B, T]: `#` then uniformly random swaps."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, len(SWAPS) + 1, (B, T), generator=g)
    ids[:, 0] = START
    return ids
