"""UT transform on the CPU: the fused kernels (ut_fwd.cpp, and ut_bwd.cpp for its gradient)
when they are available, `block_ut` (differentiated by autograd) otherwise. Same
arguments (any number R of reflections per token), same results up to rounding."""

from __future__ import annotations

import torch

from ..ut import BlockUT, block_ut, sub_block_size, sub_block_target
from .scan import fused_scan_applies

__all__ = ["ut_forward", "fused_block_ut", "fused_token_ut", "fused_ut_applies",
           "ut_backward", "token_ut_backward"]


def _sub_block(qb, sub_block: int | None, C: int | None = None) -> int:
    """The kernels' sub-block for qb [..., C, D] (or C given and qb [..., D])."""
    C = qb.shape[-2] if C is None else C
    return sub_block_size(C, sub_block_target(qb.shape[-1], fused=True)) \
        if sub_block is None else sub_block


def fused_block_ut(qb, kb, wb, bb, scale: float, sub_block: int | None = None) -> BlockUT:
    """The fused kernel (no autograd). qb [NB, H, Gr, C, D]; kb [NB, H, C, D];
    wb [NB, H, C * R, D] and bb [NB, H, C * R], R >= 1 reflections per token (reflection
    l = t * R + r of token t, as `block_ut`); one dtype (float32 or float64). Returns
    `BlockUT` (s_diag zero above the diagonal's sub-blocks). `sub_block` counts tokens."""
    c = _sub_block(qb, sub_block)
    qt, kt, pt, s = torch.ops.pathattn_cpu.ut_fwd(
        qb.contiguous(), kb.contiguous(), wb.contiguous(), bb.contiguous(), float(scale), c)
    return BlockUT(qt=qt, kt=kt, pt=pt, s_diag=s)


def fused_token_ut(q, k, w, beta, start: torch.Tensor, block: int, scale: float,
                   sub_block: int | None = None) -> BlockUT:
    """`fused_block_ut` read straight from token tensors, without gathering them into blocks:
    q [N, HQ, D], k [N, H, D], w [N, H, R * D] (token t's R reflections in order), beta
    [N, H, R], any strides with unit stride along the last dim; start [NB] int64: block n
    holds tokens [start[n], start[n] + block) (`pathattn.ops.common.layout.block_starts`). The
    same numbers as `fused_block_ut` of those blocks (block tensors out)."""
    c = _sub_block(q, sub_block, block)
    qt, kt, pt, s = torch.ops.pathattn_cpu.ut_fwd_tokens(q, k, w, beta, start, int(block),
                                                         float(scale), c)
    return BlockUT(qt=qt, kt=kt, pt=pt, s_diag=s)


def fused_ut_applies(qb, kb, wb, kernels: bool = True) -> bool:
    """True when the fused UT kernels take these block tensors: where the fused scan
    applies (`fused_scan_applies`), for any number R of reflections per token
    (wb [NB, H, C * R, D])."""
    return wb.shape[-2] % kb.shape[-2] == 0 and fused_scan_applies(qb, kernels)


def ut_forward(qb, kb, wb, bb, scale: float, kernels: bool = True) -> BlockUT:
    """`block_ut` for the forward pass (no autograd), by the fused kernel where it
    applies (`fused_ut_applies`)."""
    needs_grad = torch.is_grad_enabled() and any(
        x.requires_grad for x in (qb, kb, wb, bb))
    if not needs_grad and fused_ut_applies(qb, kb, wb, kernels):
        return fused_block_ut(qb, kb, wb, bb, scale)
    return block_ut(qb, kb, wb, bb, scale)


def ut_backward(qb, kb, wb, bb, scale: float, dqt, dkt, dpt, ds,
                sub_block: int | None = None):
    """Gradients (dqb, dkb, dwb, dbb) of the block tensors (shaped as qb, kb, wb, bb of
    `fused_block_ut`) from those of `BlockUT`'s fields (dqt, dkt, dpt, ds = d s_diag), by
    the fused kernel: what autograd through `block_ut` gives, for the same sub-block
    length. ds is read on and left of the diagonal sub-blocks (block_ut's s_diag is zero,
    with no gradient, right of them)."""
    c = _sub_block(qb, sub_block)
    dt = qb.dtype
    return torch.ops.pathattn_cpu.ut_bwd(
        qb.contiguous(), kb.contiguous(), wb.contiguous(), bb.contiguous(), float(scale), c,
        *(x.to(dt).contiguous() for x in (dqt, dkt, dpt, ds)))


def token_ut_backward(q, k, w, beta, start: torch.Tensor, block: int, scale: float, dqt, dkt,
                      dpt, ds, sub_block: int | None = None):
    """`ut_backward` with the token inputs of `fused_token_ut`: gradients (dq [N, HQ, D],
    dk [N, H, D], dw [N, H, R * D], dbeta [N, H, R]) as token tensors, from those of its
    block outputs (dqt, dkt, dpt, ds)."""
    c = _sub_block(q, sub_block, block)
    dt = q.dtype
    return torch.ops.pathattn_cpu.ut_bwd_tokens(
        q, k, w, beta, start, int(block), float(scale), c,
        *(x.to(dt).contiguous() for x in (dqt, dkt, dpt, ds)))
