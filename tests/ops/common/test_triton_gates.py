"""`triton_gates`: the per-sequence sums (prefix and suffix, non-finite entries kept or read
as 0) against PyTorch's cumsum per sequence, and `block_offsets` bit for bit against its
reference `token_blocks.block_gate_offsets`, dense and packed, with partial last tiles."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from pathattn.ops.common.layout import token_bounds  # noqa: E402
from pathattn.ops.common.token_blocks import block_gate_offsets, token_tile_table  # noqa: E402
from pathattn.ops.common.triton_gates import block_offsets, sequence_cumsum  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CU = (0, 20, 20, 50, 51, 90)  # lengths 20, 0, 30, 1, 39


def _per_sequence(x, bounds, reverse):
    out = []
    for a, e in zip(bounds[:-1], bounds[1:], strict=True):
        seg = x[a:e].double()
        out.append(seg.flip(0).cumsum(0).flip(0) if reverse else seg.cumsum(0))
    return torch.cat(out)


@pytest.mark.parametrize("reverse", [False, True])
def test_gate_sums_stay_in_their_sequence(reverse):
    """A non-finite gate reaches its own sequence only (finite=False keeps it)."""
    cu = torch.tensor(CU, device=DEVICE)
    x = torch.randn(90, 3, device=DEVICE)
    x[25, 1] = float("nan")
    table = token_tile_table(1, 90, cu, 16, x.device)
    got = sequence_cumsum(x, table, 16, reverse=reverse)
    torch.testing.assert_close(got, _per_sequence(x, CU, reverse), equal_nan=True)


@pytest.mark.parametrize("reverse", [False, True])
def test_non_finite_read_as_zero(reverse):
    x = torch.randn(2 * 37, 4, device=DEVICE, dtype=torch.bfloat16)
    x[5, 0], x[40, 2], x[41, 3] = float("nan"), float("inf"), -float("inf")
    table = token_tile_table(2, 37, None, 16, x.device)
    got = sequence_cumsum(x, table, 16, reverse=reverse, finite=True)
    clean = torch.nan_to_num(x.double(), nan=0.0, posinf=0.0, neginf=0.0)
    torch.testing.assert_close(got, _per_sequence(clean, (0, 37, 74), reverse))
    assert torch.isfinite(got).all()


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("BT", [16, 32])
def test_block_offsets_match_reference(packed, BT):
    B, T = (1, 90) if packed else (3, 41)
    cu = torch.tensor(CU, device=DEVICE) if packed else None
    g = -torch.rand(B * T, 5, device=DEVICE, dtype=torch.float64) * 3
    g[7, 2] = -3e4  # a wall of forgetting inside a tile
    table = token_tile_table(B, T, cu, BT, g.device)
    G = sequence_cumsum(g, table, BT)
    start, end = token_bounds(B, T, cu, g.device)
    assert torch.equal(block_offsets(G, table, BT), block_gate_offsets(G, start, end, BT))
