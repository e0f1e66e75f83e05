"""UT transform for the forward pass on the CPU: the fused kernel (ut_fwd.cpp) when it is
available and no gradient is needed, `ut.block_ut` otherwise. Same arguments, same results
(up to rounding; the backward pass always differentiates `ut.block_ut`)."""

from __future__ import annotations

import torch

from ..ut import BlockUT, block_ut, sub_block_size, sub_block_target
from .scan import fused_scan_applies

__all__ = ["ut_forward", "fused_block_ut"]


def fused_block_ut(qb, kb, wb, bb, scale: float, sub_block: int | None = None) -> BlockUT:
    """The fused kernel. qb [NB, H, Gr, C, D]; kb, wb [NB, H, C, D]; bb [NB, H, C]; one
    dtype (float32 or float64). Returns `BlockUT` (s_diag zero above the diagonal's
    sub-blocks)."""
    C, D = qb.shape[-2:]
    c = sub_block_size(C, sub_block_target(D)) if sub_block is None else sub_block
    qt, kt, pt, s = torch.ops.pathattn_cpu.ut_fwd(
        qb.contiguous(), kb.contiguous(), wb.contiguous(), bb.contiguous(), float(scale), c)
    return BlockUT(qt=qt, kt=kt, pt=pt, s_diag=s)


def ut_forward(qb, kb, wb, bb, scale: float) -> BlockUT:
    """`ut.block_ut` for the forward pass (no autograd), by the fused kernel where it
    applies."""
    needs_grad = torch.is_grad_enabled() and any(
        x.requires_grad for x in (qb, kb, wb, bb))
    if not needs_grad and fused_scan_applies(qb):
        return fused_block_ut(qb, kb, wb, bb, scale)
    return block_ut(qb, kb, wb, bb, scale)
