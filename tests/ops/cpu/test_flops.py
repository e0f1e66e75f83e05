"""The kernels' GEMM FLOP counter (flops.cpp, `torch.ops.pathattn_cpu.gemm_flops`): off by
default, exact for the forward scan's GEMM schedule, booked to the kernel that ran."""

from __future__ import annotations

import pytest
import torch

from pathattn.ops.cpu import (
    fused_backward_scan,
    fused_block_ut,
    fused_forward_scan,
    load_kernels,
)
from pathattn.ops.stages import ut_blocks

from .._helpers import make_inputs
from .test_scan import _block_inputs

pytestmark = pytest.mark.skipif(not load_kernels(), reason="CPU kernel could not be built")

SCAN_FWD, SCAN_BWD, UT_FWD, UT_BWD = range(4)


def _flops(count: bool) -> list[int]:
    return list(torch.ops.pathattn_cpu.gemm_flops(count))


def _scan_fwd_flops(nb: int, H: int, C: int, D: int, Dv: int) -> int:
    """GEMM FLOPs of the forward scan over one sequence of nb blocks (R = C rows per task):
    the pair tiles of every block with a predecessor, then per query block the diagonal's
    P V and, per pair step (2C keys, or C at a block without predecessor), logits and P V,
    and a state update when another step follows."""
    R = C
    total = (nb - 1) * (2 * C * D * D + 2 * D ** 3)
    for a in range(nb):
        total += 2 * R * C * Dv
        b = a - 1
        while b >= 0:
            p = b - 1
            W = 2 * C if p >= 0 else C
            total += 2 * R * W * D + 2 * R * W * Dv
            if p >= 1:
                total += 2 * R * D * D
            b = p - 1 if p >= 0 else -1
    return H * total


@pytest.mark.parametrize("nb", [1, 2, 3, 4, 7])
def test_forward_scan_flops_match_its_gemm_schedule(nb):
    C, H, D, Dv = 16, 2, 8, 4
    lay, ut, vb, _, _ = _block_inputs(1, nb * C, H, H, D, Dv, C, False, None, torch.float32)
    _flops(False)  # reset
    fused_forward_scan(lay, ut.qt, ut.kt, ut.pt, ut.s_diag, vb, None)
    assert _flops(True) == [0, 0, 0, 0]  # counting was off
    fused_forward_scan(lay, ut.qt, ut.kt, ut.pt, ut.s_diag, vb, None)
    got = _flops(False)
    assert got == [_scan_fwd_flops(nb, H, C, D, Dv), 0, 0, 0]


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
