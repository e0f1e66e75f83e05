"""Block layouts (`pathattn.ops.common.layout`): the dense path of the token <-> block maps against
their general gathers, and the blocks' first tokens (`block_starts`)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pathattn.ops.common.layout import block_starts, from_head_blocks, make_layout, to_head_blocks

SHAPES = [  # B, T, C, H, features
    (1, 512, 128, 8, (64,)),
    (3, 256, 64, 2, (5,)),
    (2, 96, 32, 3, ()),
    (2, 100, 32, 2, (4,)),  # padded last block: the general gather
    (1, 64, 64, 1, (2, 3)),
]


def _general(lay):
    """The same layout seen as packed sequences: no dense path."""
    return dataclasses.replace(lay, row_length=None, _head_major={})


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(map(str, s[:4])))
def test_dense_blocks_equal_the_general_gather(shape):
    B, T, C, H, F = shape
    lay = make_layout(B, T, C, None, torch.device("cpu"))
    x = torch.randn((B * T, H) + F, dtype=torch.float64)
    xb = to_head_blocks(x, lay)
    assert xb.shape == (lay.NB, H, C) + F and xb.is_contiguous()
    assert torch.equal(xb, to_head_blocks(x, _general(lay)))
    back = from_head_blocks(xb, lay)
    assert back.is_contiguous()
    assert torch.equal(back, from_head_blocks(xb, _general(lay)))
    assert torch.equal(back, x)


def test_dense_blocks_follow_the_scan_order():
    """Row (n_b - 1 - l) * B + s holds block l of sequence s."""
    B, T, C = 2, 96, 32
    lay = make_layout(B, T, C, None, torch.device("cpu"))
    tokens = torch.arange(B * T, dtype=torch.float64).view(B * T, 1)
    xb = to_head_blocks(tokens, lay).view(T // C, B, C)
    for l in range(T // C):
        for s in range(B):
            first = s * T + l * C
            assert torch.equal(xb[T // C - 1 - l, s], torch.arange(first, first + C,
                                                                     dtype=torch.float64))


@pytest.mark.parametrize("cu", [None, (0, 64, 96, 224)], ids=["dense", "packed"])
def test_block_starts_are_each_blocks_tokens(cu):
    """Without padding, block n is the C tokens from block_starts[n] on: what the gather
    into blocks reads."""
    B, T, C = (2, 96, 32) if cu is None else (1, 224, 32)
    lay = make_layout(B, T, C, None if cu is None else torch.tensor(cu), torch.device("cpu"))
    start = block_starts(lay)
    assert start.dtype == torch.long and start.shape == (lay.NB,) and start.is_contiguous()
    tokens = torch.arange(B * T, dtype=torch.float64).view(B * T, 1)
    blocks = to_head_blocks(tokens, lay).view(lay.NB, C)
    assert torch.equal(blocks, (start[:, None] + torch.arange(C)).double())


@pytest.mark.parametrize("cu", [None, (0, 50, 96)], ids=["dense", "packed"])
def test_block_starts_refuse_padded_blocks(cu):
    lay = make_layout(1, 100 if cu is None else 96, 32,
                      None if cu is None else torch.tensor(cu), torch.device("cpu"))
    assert lay.pad_slots.numel() > 0 and block_starts(lay) is None
