"""autograd.Function for the blockwise CPU / PyTorch path of PaTH attention.

forward: tokens -> blocks -> UT transform (no graph) -> right-to-left scan; saves only the
inputs, the output rows and the log-sum-exp (O(T * D) per head).
backward: re-runs the UT transform under autograd, runs the backward scan (FlashAttention-2
style recomputation), and pulls the gradients of (Q~, K~, Pt, in-block logits) back to
(q, k, w, beta) with torch.autograd.grad. Gate and value gradients come from the scan.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .cpu import (
    fused_block_ut,
    fused_scan_applies,
    scan_backward,
    scan_forward,
    ut_backward,
    ut_forward,
)
from .gates import gate_grad
from .layout import BlockLayout
from .stages import (
    block_inputs,
    compute_dtype,
    kv_tokens,
    row_blocks,
    rows_to_tokens,
    suffix_transitions,
)
from .ut import block_ut

__all__ = ["PaTHAttnFunction", "forward_with_keys", "blocks_backward"]


def _forward_blocks(lay: BlockLayout, qb, kb, wb, bb, vb, gates, scale: float,
                    kernels: bool):
    """UT transform and forward scan of block tensors (one head group). Returns o_rows
    [NB, H, R, Dv] and lse [NB, H, R]."""
    ut = ut_forward(qb, kb, wb, bb, scale, kernels)
    return scan_forward(lay, ut, vb, gates, wb, bb, kernels)


def blocks_backward(lay: BlockLayout, qb, kb, wb, bb, vb, gates, do_rows, lse, delta,
                    scale: float, kernels: bool, extra=None):
    """The in-block backward shared by the op and context parallelism: gradients of the
    block tensors (one head group) from do_rows [NB, H, R, Dv], lse and delta
    [NB, H, R]. The UT transform is differentiated by the fused CPU kernel where it applies
    (`fused_scan_applies`), by autograd through `block_ut` otherwise.

    extra: optional `extra(ut, grads) -> (outs, cots)`, called under autograd after the
    scan's backward with the UT quantities (differentiable) and the scan's `ScanGrads`:
    further outputs computed from `ut` and their cotangents, pulled back with the scan's
    (context parallelism's shard terms).

    Returns (dqb, dkb, dwb, dbb, grads): grads holds dv and the gate column sums.
    """
    fused = fused_scan_applies(qb, kernels)
    with torch.enable_grad():
        if fused:  # autograd only from the UT quantities on, when extra needs it
            ut = fused_block_ut(qb, kb, wb, bb, scale)
            leaves = [ut.qt, ut.kt, ut.pt]
            if extra is not None:
                leaves = [x.requires_grad_() for x in leaves]
        else:
            leaves = [x.detach().requires_grad_() for x in (qb, kb, wb, bb)]
            ut = block_ut(*leaves, scale)
    with torch.no_grad():
        grads = scan_backward(lay, ut.qt.detach(), ut.kt.detach(), ut.pt.detach(),
                              ut.s_diag.detach(), vb, gates, do_rows, lse, delta, kernels)
    outs, cots = [], []
    if extra is not None:
        with torch.enable_grad():
            outs, cots = extra(ut, grads)
    if fused:
        dut = [grads.dqt, grads.dkt, grads.dpt]
        if outs:
            more = torch.autograd.grad(outs, leaves, cots, allow_unused=True)
            dut = [d if e is None else d + e for d, e in zip(dut, more, strict=True)]
        dqb, dkb, dwb, dbb = ut_backward(qb, kb, wb, bb, scale, *dut, grads.ds_diag)
    else:
        dqb, dkb, dwb, dbb = torch.autograd.grad(
            [ut.qt, ut.kt, ut.pt, ut.s_diag, *outs], leaves,
            [grads.dqt, grads.dkt, grads.dpt, grads.ds_diag, *cots])
    return dqb, dkb, dwb, dbb, grads


class PaTHAttnFunction(torch.autograd.Function):
    """o = PaTHAttnFunction.apply(q, k, v, w, beta, g, scale, layout, kernels); see
    `path_attn`. kernels: run the fused C++ kernels where they apply (the "cpu" backend) or
    PyTorch ops only ("torch")."""

    @staticmethod
    def forward(ctx, q, k, v, w, beta, g, scale: float, lay: BlockLayout,
                kernels: bool = True):
        B, T, HQ, _ = q.shape
        Dv = v.shape[-1]
        with torch.no_grad():
            bi = block_inputs(q, k, v, w, beta, g, lay)
            o_rows, lse = _forward_blocks(lay, *bi.ut, bi.vb, bi.gates, scale, kernels)
        ctx.save_for_backward(q, k, v, w, beta, g, o_rows, lse)
        ctx.scale, ctx.lay, ctx.kernels = scale, lay, kernels
        return rows_to_tokens(o_rows, lay, (B, T, HQ, Dv)).to(q.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, do):
        q, k, v, w, beta, g, o_rows, lse = ctx.saved_tensors
        lay, scale = ctx.lay, ctx.scale
        H = k.shape[2]
        cd = compute_dtype(q.dtype)
        # a backward run inside an autocast region keeps the op's own precision rule
        with torch.no_grad(), torch.autocast(q.device.type, enabled=False):
            # autograd starts at the block tensors: the token <-> slot maps are bijective
            # on real tokens, so their gradients map back with a gather (no scatter-add)
            bi = block_inputs(q, k, v, w, beta, g, lay)
            do_rows = row_blocks(do, lay, H, cd).flatten(2, 3)  # [NB, H, R, Dv]
            delta = (do_rows * o_rows).sum(-1)  # [NB, H, R]
            dqb, dkb, dwb, dbb, grads = blocks_backward(
                lay, *bi.ut, bi.vb, bi.gates, do_rows, lse, delta, scale, ctx.kernels)
            dvb, dcol = grads.dv, grads.dgate_col
            dq = rows_to_tokens(dqb.flatten(2, 3), lay, q.shape)
            dk, dw, dv, dbeta = (kv_tokens(x, lay, ref.shape)
                                 for x, ref in ((dkb, k), (dwb, w), (dvb, v), (dbb, beta)))
            dg = None if g is None else gate_grad(dcol, lay).view(g.shape).to(g.dtype)
        cast = lambda x, ref: None if x is None else x.to(ref.dtype)  # noqa: E731
        return (cast(dq, q), cast(dk, k), cast(dv, v), cast(dw, w), cast(dbeta, beta), dg,
                None, None, None)


@torch.no_grad()
def forward_with_keys(q, k, v, w, beta, g, scale: float, lay: BlockLayout,
                      kernels: bool = True):
    """Forward pass that also returns every key transformed by all later tokens of its
    sequence, k_j^(T) = H_{T-1} ... H_{j+1} k_j, from the forward's own UT quantities
    (K~ and the block transitions): the prefill of an inference cache at the cost of one
    GEMM per block beyond the forward. No autograd.

    Returns o [B, T, HQ, Dv] in q's dtype and keys [B, T, H, D] in the compute dtype.
    """
    B, T, HQ, _ = q.shape
    H, D, Dv = k.shape[2], k.shape[3], v.shape[-1]
    bi = block_inputs(q, k, v, w, beta, g, lay)
    ut = ut_forward(*bi.ut, scale, kernels)
    o_rows, _ = scan_forward(lay, ut, bi.vb, bi.gates, bi.wb, bi.bb, kernels)
    keys = kv_tokens(ut.kt @ suffix_transitions(lay, ut.pt), lay, (B, T, H, D))
    return rows_to_tokens(o_rows, lay, (B, T, HQ, Dv)).to(q.dtype), keys
