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
from .gates import block_gates, gate_grad
from .layout import BlockLayout, from_blocks, to_blocks
from .ut import block_ut

__all__ = ["PaTHAttnFunction", "compute_dtype"]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: float64 stays float64, everything else runs in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _kv_blocks(x: torch.Tensor, lay: BlockLayout, cd) -> torch.Tensor:
    """[B, T, H, *F] -> [NB, H, C, *F] in dtype cd."""
    flat = x.reshape((-1,) + tuple(x.shape[2:])).to(cd)  # [B*T, H, *F]
    xb = to_blocks(flat, lay)  # [NB, C, H, *F]
    return xb.transpose(1, 2).contiguous()


def _row_blocks(x: torch.Tensor, lay: BlockLayout, H: int, cd) -> torch.Tensor:
    """Query-side [B, T, HQ, F] -> [NB, H, Gr, C, F] (Gr = HQ // H) in dtype cd."""
    HQ, F = x.shape[2], x.shape[3]
    xb = to_blocks(x.reshape(-1, HQ, F).to(cd), lay)  # [NB, C, HQ, F]
    xb = xb.view(lay.NB, lay.C, H, HQ // H, F).permute(0, 2, 3, 1, 4)  # [NB, H, Gr, C, F]
    return xb.contiguous()


def _rows_to_tokens(xb: torch.Tensor, lay: BlockLayout, shape) -> torch.Tensor:
    """[NB, H, Gr * C, F] -> tokens [B, T, HQ, F]."""
    NB, H, R, F = xb.shape
    Gr = R // lay.C
    x = xb.view(NB, H, Gr, lay.C, F).permute(0, 3, 1, 2, 4).reshape(NB, lay.C, H * Gr, F)
    return from_blocks(x, lay).view(shape)


def _blocks(q, k, w, beta, lay: BlockLayout, cd):
    """Block layout of the UT inputs: [NB, H, Gr, C, D], [NB, H, C, D] x 2, [NB, H, C]."""
    H = k.shape[2]
    return (_row_blocks(q, lay, H, cd), _kv_blocks(k, lay, cd), _kv_blocks(w, lay, cd),
            _kv_blocks(beta, lay, cd))


def _forward_blocks(lay: BlockLayout, qb, kb, wb, bb, vb, gates, scale: float):
    """UT transform and forward scan of block tensors (one head group). Returns o_rows
    [NB, H, R, Dv] and lse [NB, H, R]."""
    ut = ut_forward(qb, kb, wb, bb, scale)
    return scan_forward(lay, ut, vb, gates, wb, bb)


def _backward_blocks(lay: BlockLayout, qb, kb, wb, bb, vb, gates, do_rows, o_rows, lse,
                     scale: float):
    """Gradients with respect to the block tensors (one head group): dqb, dkb, dwb, dbb,
    dvb and the gate column sums (or None). The UT transform is differentiated by the fused
    CPU kernel where it applies, by autograd through `block_ut` otherwise."""
    delta = (do_rows * o_rows).sum(-1)  # [NB, H, R]
    if fused_scan_applies(qb):
        ut = fused_block_ut(qb, kb, wb, bb, scale)
        grads = scan_backward(lay, ut.qt, ut.kt, ut.pt, ut.s_diag, vb, gates, do_rows, lse,
                              delta)
        dqb, dkb, dwb, dbb = ut_backward(qb, kb, wb, bb, scale, grads.dqt, grads.dkt,
                                         grads.dpt, grads.ds_diag)
        return dqb, dkb, dwb, dbb, grads.dv, grads.dgate_col
    leaves = [x.detach().requires_grad_() for x in (qb, kb, wb, bb)]
    with torch.enable_grad():
        ut = block_ut(*leaves, scale)
    with torch.no_grad():
        grads = scan_backward(lay, ut.qt.detach(), ut.kt.detach(), ut.pt.detach(),
                              ut.s_diag.detach(), vb, gates, do_rows, lse, delta)
    dqb, dkb, dwb, dbb = torch.autograd.grad(
        [ut.qt, ut.kt, ut.pt, ut.s_diag], leaves,
        [grads.dqt, grads.dkt, grads.dpt, grads.ds_diag])
    return dqb, dkb, dwb, dbb, grads.dv, grads.dgate_col


class PaTHAttnFunction(torch.autograd.Function):
    """o = PaTHAttnFunction.apply(q, k, v, w, beta, g, scale, layout); see `path_attn`."""

    @staticmethod
    def forward(ctx, q, k, v, w, beta, g, scale: float, lay: BlockLayout):
        B, T, HQ, _ = q.shape
        H, Dv = k.shape[2], v.shape[-1]
        cd = compute_dtype(q.dtype)
        with torch.no_grad():
            blocks = _blocks(q, k, w, beta, lay, cd)
            vb = _kv_blocks(v, lay, cd)
            gates = None if g is None else block_gates(g.reshape(B * T, HQ), lay, H)
            o_rows, lse = _forward_blocks(lay, *blocks, vb, gates, scale)
        ctx.save_for_backward(q, k, v, w, beta, g, o_rows, lse)
        ctx.scale, ctx.lay = scale, lay
        return _rows_to_tokens(o_rows, lay, (B, T, HQ, Dv)).to(q.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, do):
        q, k, v, w, beta, g, o_rows, lse = ctx.saved_tensors
        lay, scale = ctx.lay, ctx.scale
        B, T, HQ, _ = q.shape
        H = k.shape[2]
        cd = compute_dtype(q.dtype)
        # a backward run inside an autocast region keeps the op's own precision rule
        with torch.no_grad(), torch.autocast(q.device.type, enabled=False):
            # autograd starts at the block tensors: the token <-> slot maps are bijective
            # on real tokens, so their gradients map back with a gather (no scatter-add)
            blocks = _blocks(q, k, w, beta, lay, cd)
            vb = _kv_blocks(v, lay, cd)
            gates = None if g is None else block_gates(g.reshape(B * T, HQ), lay, H)
            do_rows = _row_blocks(do, lay, H, cd).flatten(2, 3)  # [NB, H, R, Dv]
            dqb, dkb, dwb, dbb, dvb, dcol = _backward_blocks(
                lay, *blocks, vb, gates, do_rows, o_rows, lse, scale)
            dq = _rows_to_tokens(dqb.flatten(2, 3), lay, q.shape)
            dk, dw, dv = (from_blocks(x.transpose(1, 2), lay).view(ref.shape)
                          for x, ref in ((dkb, k), (dwb, w), (dvb, v)))
            dbeta = from_blocks(dbb.transpose(1, 2), lay).view(beta.shape)
            dg = None if g is None else gate_grad(dcol, lay).view(g.shape).to(g.dtype)
        cast = lambda x, ref: None if x is None else x.to(ref.dtype)  # noqa: E731
        return (cast(dq, q), cast(dk, k), cast(dv, v), cast(dw, w), cast(dbeta, beta), dg,
                None, None)


def _suffix_transitions(lay: BlockLayout, pt: torch.Tensor) -> torch.Tensor:
    """R [NB, H, D, D] per block: the row-form transition of all later blocks of its
    sequence, R_l = Pt_{l+1}^T R_{l+1}, R_last = I (paper section 3.4, "reuse the suffix
    cumulative product"). pt [NB, H, D, D]; blocks in scan order."""
    NB, D = pt.shape[0], pt.shape[-1]
    R = torch.empty_like(pt)
    n1 = lay.counts[1] if lay.n_max > 1 else 0
    pred = lay.key_rows[1] if n1 else None  # pred[r]: row of the block before row r (r < n1)
    has_next = torch.zeros(NB, dtype=torch.bool, device=pt.device)
    if n1:
        has_next[pred] = True
    frontier = (~has_next).nonzero().squeeze(1)  # last block of every sequence
    R[frontier] = torch.eye(D, dtype=pt.dtype, device=pt.device)
    while True:
        frontier = frontier[frontier < n1]  # blocks that have a block before them
        if frontier.numel() == 0:
            return R
        prev = pred[frontier]
        R[prev] = pt[frontier].transpose(-1, -2) @ R[frontier]
        frontier = prev


@torch.no_grad()
def forward_with_keys(q, k, v, w, beta, g, scale: float, lay: BlockLayout):
    """Forward pass that also returns every key transformed by all later tokens of its
    sequence, k_j^(T) = H_{T-1} ... H_{j+1} k_j, from the forward's own UT quantities
    (K~ and the block transitions): the prefill of an inference cache at the cost of one
    GEMM per block beyond the forward. No autograd.

    Returns o [B, T, HQ, Dv] in q's dtype and keys [B, T, H, D] in the compute dtype.
    """
    B, T, HQ, _ = q.shape
    H, D, Dv = k.shape[2], k.shape[3], v.shape[-1]
    cd = compute_dtype(q.dtype)
    qb, kb, wb, bb = _blocks(q, k, w, beta, lay, cd)
    ut = ut_forward(qb, kb, wb, bb, scale)
    vb = _kv_blocks(v, lay, cd)
    gates = None if g is None else block_gates(g.reshape(B * T, HQ), lay, H)
    o_rows, _ = scan_forward(lay, ut, vb, gates, wb, bb)
    keys = ut.kt @ _suffix_transitions(lay, ut.pt)  # [NB, H, C, D]
    keys = from_blocks(keys.transpose(1, 2), lay).view(B, T, H, D)
    return _rows_to_tokens(o_rows, lay, (B, T, HQ, Dv)).to(q.dtype), keys
