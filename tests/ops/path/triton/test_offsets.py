"""64-bit offsets: a batch of B * T * H * D elements past 2**31 indexes correctly.

Every token-indexed load and store of the kernels forms its offset with one of three helpers
(`tile_offsets`, `row_offsets`, `e_offsets`). A small kernel evaluates them at token and
block indices whose offsets pass 2**31 (about 2.6e10 elements, no large tensor needed) and
compares with exact integers; the same expression without the int64 cast is evaluated as a
control and must wrap around, so the check would fail on 32-bit offsets.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from pathattn.ops.path.triton._common import e_offsets, row_offsets, tile_offsets  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
R, C, BD = 4, 16, 32  # rows, columns of the tiles; padded head dim of E


@triton.jit
def _offsets_kernel(out_ptr, t0, stride, col0, blk, h, H, R: tl.constexpr, C: tl.constexpr,
                    BD: tl.constexpr):
    r = tl.arange(0, R)
    rows = t0 + r
    cols = tl.arange(0, C)
    tile = r[:, None] * C + cols[None, :]  # [R, C] slots of the output
    tl.store(out_ptr + tile, tile_offsets(rows, stride, col0, cols))
    tl.store(out_ptr + R * C + r, row_offsets(rows, stride, col0))
    tl.store(out_ptr + R * C + R + tile, e_offsets(blk, h, H, r, cols, BD))
    # control: the tile offsets without the int64 cast
    tl.store(out_ptr + 2 * R * C + R + tile,
             (rows[:, None] * stride + col0 + cols[None, :]).to(tl.int64))


def test_token_offsets_past_2_pow_31_are_exact():
    t0, stride, col0 = 2**26 + 5, 384, 200  # token 2**26 of a [N, 6, 64] tensor, head 3
    blk, h, H = 2**20 + 3, 5, 16
    out = torch.zeros(3 * R * C + R, dtype=torch.int64, device=DEVICE)
    _offsets_kernel[(1,)](out, t0, stride, col0, blk, h, H, R=R, C=C, BD=BD)
    out = out.cpu()
    rows = torch.arange(R, dtype=torch.int64)[:, None]  # [R, 1]
    cols = torch.arange(C, dtype=torch.int64)[None, :]  # [1, C]
    tile = (t0 + rows) * stride + col0 + cols  # [R, C]
    assert tile.min() > 2**31 and (blk * H + h) * BD * BD > 2**31
    assert torch.equal(out[:R * C].view(R, C), tile)
    assert torch.equal(out[R * C:R * C + R], tile[:, 0])
    e = (blk * H + h) * BD * BD + rows * BD + cols  # [R, C]
    assert torch.equal(out[R * C + R:2 * R * C + R].view(R, C), e)
    # the same offsets in int32 wrap around: this test tells 32-bit offsets apart
    assert not torch.equal(out[2 * R * C + R:].view(R, C), tile)
