"""Per-block UT transform: every sub-block length gives the same block quantities, and the
default sub-block length follows the head dim."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pathattn.ops.path.ut import block_ut, sub_block_size, sub_block_target


@pytest.mark.parametrize("D", [16, 48, 64])
def test_sub_block_lengths_agree(D):
    gen = torch.Generator().manual_seed(0)
    NB, H, Gr, C = 3, 2, 2, 64
    qb = torch.randn(NB, H, Gr, C, D, generator=gen, dtype=torch.float64)
    kb = torch.randn(NB, H, C, D, generator=gen, dtype=torch.float64)
    wb = F.normalize(torch.randn(NB, H, C, D, generator=gen, dtype=torch.float64), dim=-1)
    bb = 2 * torch.rand(NB, H, C, generator=gen, dtype=torch.float64)
    whole = block_ut(qb, kb, wb, bb, 0.5, sub_block=C)  # no merges
    for c in (8, 16, 32):  # 3, 2 and 1 merge levels
        parts = block_ut(qb, kb, wb, bb, 0.5, sub_block=c)
        for name in whole._fields:
            x, ref = getattr(parts, name), getattr(whole, name)
            if name == "s_diag":  # only j <= i is defined (the scan masks the rest)
                mask = torch.ones(C, C, dtype=torch.bool).tril().repeat(Gr, 1)
                x, ref = x[..., mask], ref[..., mask]
            torch.testing.assert_close(x, ref, rtol=1e-10, atol=1e-10, msg=f"{name} c={c}")


def test_sub_block_target_follows_head_dim():
    assert [sub_block_target(D) for D in (8, 16, 32, 48, 64, 128, 256)] == \
        [16, 16, 16, 24, 32, 64, 64]
    assert [sub_block_target(D, fused=True) for D in (8, 16, 32, 64, 96, 128, 256)] == \
        [32, 32, 32, 32, 48, 64, 64]
    assert sub_block_size(128, sub_block_target(32)) == 16
    assert sub_block_size(128, sub_block_target(48)) == 16  # 24 does not divide 128 by 2^k
    assert sub_block_size(48, 64) == 48 and sub_block_size(48, 16) == 12
