"""Segment slots of the Triton kernels (`segments.segment_slots`): each sequence's segments
get consecutive slots, no two sequences share one, and every slot lies under the bound the
launcher allocates. The kernels' use of them (forward and every gradient against float64
with segments of 1 and 2 blocks, packed and dense) is in test_path_attn_triton.py."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from pathattn.ops.path.triton._common import block_table  # noqa: E402
from pathattn.ops.path.triton.segments import segment_slots  # noqa: E402


def _check(B, T, cu, BT, seg):
    table, _ = block_table(B, T, cu, BT, torch.device("cpu"))
    n_seq = B if cu is None else cu.numel() - 1
    slots, n_slots = segment_slots(table, seg, BT, n_seq)
    t0, s0, s1 = table.long().unbind(1)
    seen: dict[int, tuple[int, int]] = {}  # slot -> (sequence start, segment)
    for r in range(table.shape[0]):
        if t0[r] >= s1[r]:
            continue
        c = int((t0[r] - s0[r]) // BT)
        key = (int(s0[r]), c // seg)
        slot = int(slots[r])
        assert 0 <= slot < n_slots
        assert seen.setdefault(slot, key) == key, "two segments share a slot"
        first = int(slots[r - c])  # the sequence's first block
        assert slot == first + c // seg, "a sequence's segments are not consecutive"
    return seen


@pytest.mark.parametrize("seg", [1, 2, 3])
def test_dense(seg):
    seen = _check(3, 100, None, 16, seg)
    assert len(seen) == 3 * -(-7 // seg)


@pytest.mark.parametrize("seg", [1, 2, 5])
def test_packed_with_empty_and_short_sequences(seg):
    cu = torch.tensor([0, 0, 1, 40, 40, 200, 201], dtype=torch.int32)
    seen = _check(1, 201, cu, 16, seg)
    blocks = [1, 3, 10, 1]  # of the non-empty sequences
    assert len(seen) == sum(-(-n // seg) for n in blocks)
