"""The kernels' GEMM FLOP counter (flops.cpp, `torch.ops.pathattn_cpu.gemm_flops`): off by
default, exact for the forward scan's GEMM schedule, booked to the kernel that ran."""

from __future__ import annotations

import pytest
import torch

from pathattn.ops.path.cpu import (
    fused_backward_scan,
    fused_block_ut,
    fused_forward_scan,
    load_kernels,
)
from pathattn.ops.path.stages import ut_blocks

from .._helpers import make_inputs
from .test_scan import _block_inputs

pytestmark = pytest.mark.skipif(not load_kernels(), reason="CPU kernel could not be built")

SCAN_FWD, SCAN_BWD, UT_FWD, UT_BWD = range(4)


def _flops(count: bool) -> list[int]:
    return list(torch.ops.pathattn_cpu.gemm_flops(count))


def _scan_fwd_flops(nb: int, H: int, C: int, D: int, Dv: int, g: int) -> int:
    """GEMM FLOPs of the forward scan over one sequence of nb blocks (R = C rows per task)
    in steps of g key blocks: the group tiles of every block b (its n = min(g, b + 1) step
    blocks: the keys of n - 1 of them moved, and a [D, D] product for each further
    transition formed), then per query block the diagonal's P V and, per step, logits and
    P V over its n C keys and a state update when another step follows."""
    R = C
    total = 0
    for b in range(nb):
        n = min(g, b + 1)
        follows = b + 1 > g
        total += (n - 1) * 2 * C * D * D + (max(n - 2, 0) + (n > 1 and follows)) * 2 * D ** 3
    for a in range(nb):
        total += 2 * R * C * Dv
        b = a - 1
        while b >= 0:
            n = min(g, b + 1)
            total += 2 * R * n * C * D + 2 * R * n * C * Dv
            b -= n
            if b >= 0:
                total += 2 * R * D * D
    return H * total


@pytest.mark.parametrize("group", [1, 2, 3, 4])
@pytest.mark.parametrize("nb", [1, 2, 3, 4, 7])
def test_forward_scan_flops_match_its_gemm_schedule(nb, group):
    C, H, D, Dv = 16, 2, 8, 4
    lay, ut, vb, _, _ = _block_inputs(1, nb * C, H, H, D, Dv, C, False, None, torch.float32)
    _flops(False)  # reset
    fused_forward_scan(lay, ut.qt, ut.kt, ut.pt, ut.s_diag, vb, None, group=group)
    assert _flops(True) == [0, 0, 0, 0]  # counting was off
    fused_forward_scan(lay, ut.qt, ut.kt, ut.pt, ut.s_diag, vb, None, group=group)
    got = _flops(False)
    assert got == [_scan_fwd_flops(nb, H, C, D, Dv, group), 0, 0, 0]


def test_flops_are_booked_to_the_kernel_that_ran():
    C, H, D = 16, 2, 8
    q, k, _, w, beta, _ = make_inputs(1, 3 * C, H, H, D, D, False)
    lay, ut, vb, _, _ = _block_inputs(1, 3 * C, H, H, D, D, C, False, None, torch.float32)
    _flops(True)
    fused_block_ut(*ut_blocks(q, k, w, beta, lay, torch.float32), D ** -0.5)
    got = _flops(True)
    assert got[UT_FWD] > 0 and got[SCAN_FWD] == got[SCAN_BWD] == got[UT_BWD] == 0
    o, lse = fused_forward_scan(lay, ut.qt, ut.kt, ut.pt, ut.s_diag, vb, None)
    do = torch.randn_like(o)
    _flops(True)
    fused_backward_scan(lay, ut.qt, ut.kt, ut.pt, ut.s_diag, vb, None, do, lse,
                        (do * o).sum(-1))
    got = _flops(False)
    assert got[SCAN_BWD] > 0 and got[SCAN_FWD] == got[UT_FWD] == got[UT_BWD] == 0
