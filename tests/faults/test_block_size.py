"""block_size cannot make the op allocate without bound: a block longer than the longest
sequence is cut to what the sequence needs, and a block beyond MAX_BLOCK_SIZE is refused."""

from __future__ import annotations

import importlib

import pytest
import torch

from pathattn import path_attn
from pathattn.ops.common.validation import MAX_BLOCK_SIZE
from tests.ops.path._helpers import make_inputs


def test_huge_block_is_refused():
    inputs = make_inputs(1, 40, 2, 1, 16, 16)
    with pytest.raises(ValueError, match=r"^block_size must be a positive integer at most 1024"):
        path_attn(*inputs, block_size=10**6)


def test_long_block_on_short_sequence_is_cut(monkeypatch):
    """block_size = MAX_BLOCK_SIZE at T = 40 runs with 48-token blocks (T rounded up to 16)
    and gives the default's output."""
    op_module = importlib.import_module("pathattn.ops.common.block_size")
    monkeypatch.setattr(op_module, "_LAYOUTS", type(op_module._LAYOUTS)())  # no cached layout
    seen = []
    make = op_module.make_layout
    monkeypatch.setattr(op_module, "make_layout",
                        lambda B, T, C, *a: seen.append(C) or make(B, T, C, *a))
    inputs = make_inputs(1, 40, 2, 1, 16, 16)
    o = path_attn(*inputs, block_size=MAX_BLOCK_SIZE)
    assert seen == [48]
    torch.testing.assert_close(o, path_attn(*inputs), rtol=1e-6, atol=1e-6)
