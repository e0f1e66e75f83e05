"""Segment slots of the Triton kernels (`segments.segment_slots`): each sequence's segments
get consecutive slots, no two sequences share one, and every slot lies under the bound the
launcher allocates; the same for the rows of the multi-segment transitions
(`crossings.segment_pairs`). The kernels' use of them (forward and every gradient against float64
with segments of 1 and 2 blocks, packed and dense) is in test_path_attn_triton.py."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from pathattn.ops.path.triton._common import block_table  # noqa: E402
from pathattn.ops.path.triton.crossings import segment_pairs  # noqa: E402
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


def _check_pairs(B, T, cu, BT, seg):
    """Every Pi_{q,s} of every sequence (0 <= s < q <= n_seg - 2) gets its own row of the
    table of `crossings.segment_products`, under the bound allocated."""
    table, n_max = block_table(B, T, cu, BT, torch.device("cpu"))
    base, n_pairs = segment_pairs(table, seg, BT, n_max)
    t0, s0, s1 = table.long().unbind(1)
    seen: dict[int, tuple[int, int, int]] = {}
    for r in range(table.shape[0]):
        if t0[r] >= s1[r]:
            continue
        n_seg = -(-int(-(-(s1[r] - s0[r]) // BT)) // seg)
        for q in range(1, n_seg - 1):
            for s in range(q):
                row = int(base[r]) + q * (q - 1) // 2 + s
                assert 0 <= row < n_pairs
                assert seen.setdefault(row, (int(s0[r]), q, s)) == (int(s0[r]), q, s)
    return seen, n_pairs


@pytest.mark.parametrize("seg", [1, 2, 3])
def test_pairs_dense(seg):
    seen, _ = _check_pairs(3, 100, None, 16, seg)
    n_seg = -(-7 // seg)
    assert len(seen) == 3 * max(n_seg - 2, 0) * max(n_seg - 1, 0) // 2


@pytest.mark.parametrize("seg", [1, 2, 5])
def test_pairs_packed_with_empty_and_short_sequences(seg):
    cu = torch.tensor([0, 0, 1, 40, 40, 200, 201], dtype=torch.int32)
    seen, _ = _check_pairs(1, 201, cu, 16, seg)
    n_segs = [-(-n // seg) for n in (1, 3, 10, 1)]
    assert len(seen) == sum(max(n - 2, 0) * max(n - 1, 0) // 2 for n in n_segs)


def test_pairs_bound_is_tight_enough():
    """The bound stays O(blocks): one long sequence of 64 blocks in segments of 8."""
    seen, n_pairs = _check_pairs(1, 64 * 16, None, 16, 8)
    assert len(seen) == 6 * 7 // 2 and n_pairs <= 2 * 9 * 9


@pytest.mark.parametrize("R", [1, 2])
def test_walk_matches_per_block(R):
    """`segments.segment_keys` walking each segment (`config.SEG_WALK`) and one program per
    block give bitwise the same moved keys, E of every block and M of every crossed
    segment (packed sequences, segments of 3 blocks, the last ones partial)."""
    import triton.language as tl

    from pathattn.ops.path.triton.segments import segment_keys

    gen = torch.Generator().manual_seed(0)
    cu = torch.tensor([0, 50, 53, 203], dtype=torch.int32)
    N, H, D, BT, seg = 203, 2, 32, 16, 3
    table, _ = block_table(1, N, cu, BT, torch.device("cpu"))
    slots, n_slots = segment_slots(table, seg, BT, cu.numel() - 1)
    w = torch.nn.functional.normalize(torch.randn(N * R, H, D, generator=gen), dim=-1)
    u = w * torch.rand(N * R, H, 1, generator=gen)
    kt = torch.randn(N, H, D, generator=gen)
    out = [segment_keys(w, u, kt, table, slots, n_slots, seg, BT, D, "ieee", tl.float32,
                        tl.float32, False, R, store_e=True, walk=walk)
           for walk in (False, True)]
    t0, s0, s1 = table.long().unbind(1)
    c = (t0 - s0) // BT
    last = (s1 - s0 + BT - 1) // BT - 1
    crossed = ((t0 < s1) & (c % seg == 0) & (c // seg > 0)
               & ((c // seg + 1) * seg - 1 < last)).nonzero().flatten()
    assert crossed.numel() > 0
    real = (t0 < s1).nonzero().flatten()
    (ks0, ms0, e0), (ks1, ms1, e1) = out
    assert torch.equal(ks0, ks1)
    assert torch.equal(e0[real], e1[real])
    assert torch.equal(ms0[slots[crossed].long()], ms1[slots[crossed].long()])
