"""Autograd of the blockwise CPU / PyTorch path of PaTH attention, as torch.library custom
ops (`pathattn::blockwise_fwd` with its registered backward `pathattn::blockwise_bwd`, and
`pathattn::blockwise_fwd_keys` for the prefill): eager calls and torch.compile run the same
code, and a compiled graph holds each pass as one node (fullgraph, dynamic shapes,
cu_seqlens).

forward: tokens -> blocks -> UT transform (no graph) -> right-to-left scan; saves only the
inputs, the output and the log-sum-exp of every row (O(T * D) per head). Where the fused
CPU kernels run and no block is padded (`block_starts`), they read the token tensors
in place and write the output's tokens, and the backward's gradients likewise: no gather
into blocks, no scatter back.
backward: re-runs the UT transform under autograd, runs the backward scan (FlashAttention-2
style recomputation), and pulls the gradients of (Q~, K~, Pt, in-block logits) back to
(q, k, w, beta) with torch.autograd.grad. Gate and value gradients come from the scan.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from ..common.block_size import cached_layout
from ..common.heads import compute_dtype, kv_tokens, row_blocks, rows_to_tokens
from ..common.layout import BlockLayout, block_starts
from .blockwise import ScanGrads
from .cpu import (
    fused_block_ut,
    fused_token_backward_scan,
    fused_token_scan,
    fused_token_ut,
    fused_ut_applies,
    kernel_block_size,
    load_kernels,
    scan_backward,
    scan_forward,
    token_ut_backward,
    ut_backward,
    ut_forward,
)
from .gates import block_gates, gate_grad
from .stages import block_inputs, suffix_transitions
from .ut import BlockUT, block_ut

__all__ = ["blockwise_fwd", "blockwise_bwd", "blockwise_fwd_keys", "blockwise_attention",
           "forward_with_keys", "blocks_backward"]


def _forward_blocks(lay: BlockLayout, qb, kb, wb, bb, vb, gates, scale: float,
                    kernels: bool):
    """UT transform and forward scan of block tensors (one head group). Returns o_rows
    [NB, H, R, Dv] and lse [NB, H, R]."""
    ut = ut_forward(qb, kb, wb, bb, scale, kernels)
    return scan_forward(lay, ut, vb, gates, wb, bb, kernels)


def _token_starts(q: torch.Tensor, lay: BlockLayout, kernels: bool) -> torch.Tensor | None:
    """The blocks' first tokens when the forward reads the token tensors in place (fused CPU
    kernels allowed and built, no padded block: `block_starts`), else None."""
    if not (kernels and q.device.type == "cpu" and load_kernels()):
        return None
    return block_starts(lay)


def _token_rows(x: torch.Tensor, N: int, heads: int, cd: torch.dtype) -> torch.Tensor:
    """Token tensor [B, T, heads, ...] -> [N, heads, F] in dtype cd (a view where the
    strides allow), unit stride along F as the kernels read it."""
    x = x.reshape(N, heads, -1).to(cd)
    return x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()


def _ut_tokens(q, k, w, beta, cd: torch.dtype):
    """The UT transform's token inputs: q [N, HQ, D], k [N, H, D], w [N, H, R * D],
    beta [N, H, R] (`_token_rows`)."""
    B, T, HQ, _ = q.shape
    H, N = k.shape[2], B * T
    return [_token_rows(x, N, heads, cd) for x, heads in ((q, HQ), (k, H), (w, H), (beta, H))]


def _forward_tokens(lay: BlockLayout, start: torch.Tensor, q, k, v, w, beta, g,
                    scale: float):
    """The forward by the fused CPU kernels, read straight from the token tensors (inputs as
    `blockwise_fwd`; start = `_token_starts`). Returns o [N, HQ, Dv] and lse [N, HQ] in the
    compute dtype (N = B * T), and the UT quantities (`BlockUT`, block tensors): the
    numbers of the block path."""
    B, T, HQ, _ = q.shape
    H, N = k.shape[2], B * T
    cd = compute_dtype(q.dtype)
    ut = fused_token_ut(*_ut_tokens(q, k, w, beta, cd), start, lay.C, scale)
    gates = None if g is None else block_gates(g.reshape(N, HQ), lay, H)
    o, lse = fused_token_scan(lay, start, ut.qt, ut.kt, ut.pt, ut.s_diag,
                              _token_rows(v, N, H, cd), gates)
    return o, lse, ut


def _backward_tokens(lay: BlockLayout, start: torch.Tensor, do, q, k, v, w, beta, g, o, lse,
                     scale: float):
    """The backward by the fused CPU kernels on the token tensors, as `_forward_tokens`:
    re-runs the UT transform, the backward scan and the UT transform's backward, reading
    the inputs, do, o and lse in place and writing token gradients. Returns (dq, dk, dv, dw,
    dbeta, dg) as `blockwise_bwd`, the numbers of the block path."""
    B, T, HQ, _ = q.shape
    H, N = k.shape[2], B * T
    cd = compute_dtype(q.dtype)
    toks = _ut_tokens(q, k, w, beta, cd)
    ut = fused_token_ut(*toks, start, lay.C, scale)
    do_t = _token_rows(do, N, HQ, cd)
    delta = (do_t * _token_rows(o, N, HQ, cd)).sum(-1)  # [N, HQ]
    gates = None if g is None else block_gates(g.reshape(N, HQ), lay, H)
    grads = fused_token_backward_scan(lay, start, ut.qt, ut.kt, ut.pt, ut.s_diag,
                                      _token_rows(v, N, H, cd), gates, do_t,
                                      lse.reshape(N, HQ), delta)
    dq, dk, dw, dbeta = token_ut_backward(*toks, start, lay.C, scale, grads.dqt, grads.dkt,
                                          grads.dpt, grads.ds_diag)
    return (dq.view(q.shape).to(q.dtype), dk.view(k.shape).to(k.dtype),
            grads.dv.view(v.shape).to(v.dtype), dw.view(w.shape).to(w.dtype),
            dbeta.view(beta.shape).to(beta.dtype), _gate_input_grad(grads, lay, g, q))


def _gate_input_grad(grads: ScanGrads, lay: BlockLayout, g, q) -> torch.Tensor:
    """dg [B, T, HQ] in g's dtype from the scan's gate column sums; an empty tensor (q's
    dtype) without gates."""
    if g is None:
        return q.new_empty(0)
    return gate_grad(grads.dgate_col, lay).view(g.shape).to(g.dtype)


def blocks_backward(lay: BlockLayout, qb, kb, wb, bb, vb, gates, do_rows, lse, delta,
                    scale: float, kernels: bool, extra=None):
    """The in-block backward shared by the op and context parallelism: gradients of the
    block tensors (one head group) from do_rows [NB, H, R, Dv], lse and delta
    [NB, H, R]. The UT transform is differentiated by the fused CPU kernel where it applies
    (`fused_ut_applies`), by autograd through `block_ut` otherwise (`torch.func.vjp`, which
    also runs inside the custom ops, where the autograd dispatch keys are off).

    extra: optional `extra(ut, grads) -> (outs, cots)`, called under autograd after the
    scan's backward with the UT quantities (differentiable) and the scan's `ScanGrads`:
    further outputs computed from `ut` and their cotangents, pulled back with the scan's
    (context parallelism's shard terms).

    Returns (dqb, dkb, dwb, dbb, grads): grads holds dv and the gate column sums.
    """
    fused = fused_ut_applies(qb, kb, wb, kernels)
    with torch.enable_grad():
        if fused:  # autograd only from the UT quantities on, when extra needs it
            ut = fused_block_ut(qb, kb, wb, bb, scale)
            leaves = [ut.qt, ut.kt, ut.pt]
            if extra is not None:
                leaves = [x.requires_grad_() for x in leaves]
        elif extra is None:  # a function transform: it also differentiates inside the op
            ut, pull_back = torch.func.vjp(lambda *x: tuple(block_ut(*x, scale)),
                                           qb, kb, wb, bb)
            ut = BlockUT(*ut)
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
    elif extra is None:
        dqb, dkb, dwb, dbb = pull_back((grads.dqt, grads.dkt, grads.dpt, grads.ds_diag))
    else:
        dqb, dkb, dwb, dbb = torch.autograd.grad(
            [ut.qt, ut.kt, ut.pt, ut.s_diag, *outs], leaves,
            [grads.dqt, grads.dkt, grads.dpt, grads.ds_diag, *cots])
    return dqb, dkb, dwb, dbb, grads


# ------------------------------------------------------------------ custom ops
#
# The blockwise path as torch.library custom ops, so that torch.compile (fullgraph, dynamic
# shapes, cu_seqlens) sees one opaque node per pass: the block layout reads cu_seqlens and
# picks the block size from the sequence lengths, which traced code cannot do without
# reading tensor values back to the host. Each op builds the layout itself, and every
# output's shape follows from the input shapes: the forward returns the output and the
# row log-sum-exp per token, in the compute dtype, and the backward maps them back to the
# block rows (exact: a gather).


def blockwise_layout(q: torch.Tensor, cu_seqlens: torch.Tensor | None,
                     block_size: int | None, kernels: bool = False,
                     kv_heads: int | None = None) -> BlockLayout:
    """The block layout of the blockwise backends for q [B, T, HQ, ...] (B * T > 0):
    `pathattn.ops.common.block_size.cached_layout`, whose largest block is, where the fused
    CPU kernels run (kernels=True and q on the CPU), `kernel_block_size` of the longest
    sequence and HQ / kv_heads query heads per key head (kv_heads: HQ when not given)."""
    largest = None
    if block_size is None and kernels and q.device.type == "cpu":
        q_per_kv = q.shape[2] // kv_heads if kv_heads else 1
        largest = functools.partial(kernel_block_size, q_per_kv=q_per_kv)
    return cached_layout(q, cu_seqlens, block_size, largest)


@torch.library.custom_op("pathattn::blockwise_fwd", mutates_args=())
def blockwise_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor,
                  beta: torch.Tensor, g: Optional[torch.Tensor],  # noqa: UP045
                  cu_seqlens: Optional[torch.Tensor], scale: float,  # noqa: UP045
                  block_size: Optional[int], kernels: bool  # noqa: UP045
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward of the blockwise op: o [B, T, HQ, Dv] and the log-sum-exp of every output
    row, lse [B, T, HQ], both in the compute dtype. Inputs as `pathattn.path_attn`,
    validated, finite, B * T > 0; kernels: run the fused C++ kernels where they apply
    ("cpu") or PyTorch ops only ("torch")."""
    B, T, HQ, _ = q.shape
    Dv = v.shape[-1]
    lay = blockwise_layout(q, cu_seqlens, block_size, kernels, k.shape[2])
    with torch.no_grad(), torch.autocast(q.device.type, enabled=False):
        start = _token_starts(q, lay, kernels)
        if start is not None:
            o, lse, _ = _forward_tokens(lay, start, q, k, v, w, beta, g, scale)
            return o.view(B, T, HQ, Dv), lse.view(B, T, HQ)
        bi = block_inputs(q, k, v, w, beta, g, lay)
        o_rows, lse = _forward_blocks(lay, *bi.ut, bi.vb, bi.gates, scale, kernels)
        o = rows_to_tokens(o_rows, lay, (B, T, HQ, Dv))
        lse = rows_to_tokens(lse[..., None], lay, (B, T, HQ, 1))
    return o, lse.view(B, T, HQ)


@blockwise_fwd.register_fake
def _(q, k, v, w, beta, g, cu_seqlens, scale, block_size, kernels):
    B, T, HQ, _ = q.shape
    cd = compute_dtype(q.dtype)
    return q.new_empty(B, T, HQ, v.shape[-1], dtype=cd), q.new_empty(B, T, HQ, dtype=cd)


def _lse_rows(lse: torch.Tensor, lay: BlockLayout, H: int) -> torch.Tensor:
    """lse [B, T, HQ] -> block rows [NB, H, Gr * C]. Padding rows get the largest finite
    value: their probabilities exp(S - lse) are exactly 0 (their output gradient is zero,
    so they contribute nothing either way; this keeps them from overflowing)."""
    HQ = lse.shape[-1]
    pad = lse.new_full((1, HQ), torch.finfo(lse.dtype).max)
    flat = torch.cat([lse.reshape(-1, HQ), pad])  # [B * T + 1, HQ]: padding slots -> last
    rows = flat.index_select(0, lay.slot_token).view(lay.NB, lay.C, H, HQ // H)
    return rows.permute(0, 2, 3, 1).reshape(lay.NB, H, -1)  # [NB, H, Gr * C]


@torch.library.custom_op("pathattn::blockwise_bwd", mutates_args=())
def blockwise_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  w: torch.Tensor, beta: torch.Tensor,
                  g: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor],  # noqa: UP045
                  o: torch.Tensor, lse: torch.Tensor, scale: float,
                  block_size: Optional[int], kernels: bool  # noqa: UP045
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                             torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv, dw, dbeta, dg) of the blockwise op from do [B, T, HQ, Dv]
    and the forward's o and lse, each in its input's dtype; dg is an empty tensor when g is
    None. Re-runs the UT transform and the backward scan (FlashAttention-2 style
    recomputation)."""
    lay = blockwise_layout(q, cu_seqlens, block_size, kernels, k.shape[2])
    H = k.shape[2]
    cd = compute_dtype(q.dtype)
    # a backward run inside an autocast region keeps the op's own precision rule
    with torch.no_grad(), torch.autocast(q.device.type, enabled=False):
        start = _token_starts(q, lay, kernels)
        if start is not None:
            return _backward_tokens(lay, start, do, q, k, v, w, beta, g, o, lse, scale)
        # autograd starts at the block tensors: the token <-> slot maps are bijective
        # on real tokens, so their gradients map back with a gather (no scatter-add)
        bi = block_inputs(q, k, v, w, beta, g, lay)
        do_rows = row_blocks(do, lay, H, cd).flatten(2, 3)  # [NB, H, R, Dv]
        o_rows = row_blocks(o, lay, H, cd).flatten(2, 3)  # [NB, H, R, Dv]
        delta = (do_rows * o_rows).sum(-1)  # [NB, H, R]
        dqb, dkb, dwb, dbb, grads = blocks_backward(
            lay, *bi.ut, bi.vb, bi.gates, do_rows, _lse_rows(lse, lay, H), delta, scale,
            kernels)
        dq = rows_to_tokens(dqb.flatten(2, 3), lay, q.shape)
        dk, dw, dv, dbeta = (kv_tokens(x, lay, ref.shape)
                             for x, ref in ((dkb, k), (dwb, w), (grads.dv, v), (dbb, beta)))
        dg = _gate_input_grad(grads, lay, g, q)
    return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dw.to(w.dtype),
            dbeta.to(beta.dtype), dg)


@blockwise_bwd.register_fake
def _(do, q, k, v, w, beta, g, cu_seqlens, o, lse, scale, block_size, kernels):
    # contiguous, as the real gradients (empty_like would keep the inputs' strides, whose
    # memory-format checks specialise the sequence length under dynamic shapes)
    dg = q.new_empty(0) if g is None else g.new_empty(g.shape)
    return tuple(x.new_empty(x.shape) for x in (q, k, v, w, beta)) + (dg,)


def _setup_context(ctx, inputs, output):
    q, k, v, w, beta, g, cu_seqlens, scale, block_size, kernels = inputs
    o, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, w, beta, g, cu_seqlens, o, lse)
    ctx.scale, ctx.block_size, ctx.kernels = scale, block_size, kernels
    ctx.has_g = g is not None


def _backward(ctx, do, _dlse):
    q, k, v, w, beta, g, cu_seqlens, o, lse = ctx.saved_tensors
    dq, dk, dv, dw, dbeta, dg = blockwise_bwd(do, q, k, v, w, beta, g, cu_seqlens, o, lse,
                                              ctx.scale, ctx.block_size, ctx.kernels)
    return dq, dk, dv, dw, dbeta, (dg if ctx.has_g else None), None, None, None, None


blockwise_fwd.register_autograd(_backward, setup_context=_setup_context)


def blockwise_attention(q, k, v, w, beta, g, scale: float, cu_seqlens, block_size,
                        kernels: bool = True) -> torch.Tensor:
    """The blockwise op (`blockwise_fwd`, differentiable): o [B, T, HQ, Dv] in q's dtype.
    Arguments as `blockwise_fwd`."""
    o, _ = blockwise_fwd(q, k, v, w, beta, g, cu_seqlens, scale, block_size, kernels)
    return o.to(q.dtype)


@torch.library.custom_op("pathattn::blockwise_fwd_keys", mutates_args=())
def blockwise_fwd_keys(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor,
                       beta: torch.Tensor, g: Optional[torch.Tensor],  # noqa: UP045
                       cu_seqlens: Optional[torch.Tensor], scale: float,  # noqa: UP045
                       block_size: Optional[int], kernels: bool  # noqa: UP045
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """`forward_with_keys` as an op (no autograd): o [B, T, HQ, Dv] in q's dtype and the
    transformed keys [B, T, H, D] in the compute dtype."""
    lay = blockwise_layout(q, cu_seqlens, block_size, kernels, k.shape[2])
    with torch.autocast(q.device.type, enabled=False):
        return forward_with_keys(q, k, v, w, beta, g, scale, lay, kernels)


@blockwise_fwd_keys.register_fake
def _(q, k, v, w, beta, g, cu_seqlens, scale, block_size, kernels):
    B, T, HQ, D = q.shape
    H, Dv = k.shape[2], v.shape[-1]
    return (q.new_empty(B, T, HQ, Dv), q.new_empty(B, T, H, D, dtype=compute_dtype(q.dtype)))


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
    start = _token_starts(q, lay, kernels)
    if start is not None:
        o, _, ut = _forward_tokens(lay, start, q, k, v, w, beta, g, scale)
        o = o.view(B, T, HQ, Dv)
    else:
        bi = block_inputs(q, k, v, w, beta, g, lay)
        ut = ut_forward(*bi.ut, scale, kernels)
        o_rows, _ = scan_forward(lay, ut, bi.vb, bi.gates, bi.wb, bi.bb, kernels)
        o = rows_to_tokens(o_rows, lay, (B, T, HQ, Dv))
    keys = kv_tokens(ut.kt @ suffix_transitions(lay, ut.pt), lay, (B, T, H, D))
    return o.to(q.dtype), keys
