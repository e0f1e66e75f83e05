"""Block layouts (`pathattn.ops.layout`): the dense path of the token <-> block maps against
their general gathers."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pathattn.ops.layout import from_head_blocks, make_layout, to_head_blocks

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
