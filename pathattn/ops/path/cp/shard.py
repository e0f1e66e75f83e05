"""Per-shard pieces of context-parallel PaTH attention (paper section 3.5, "Compatibility
with context-parallelism"), built from the op's blockwise building blocks.

A rank holds a contiguous shard of the sequence. With H_t = I - beta_t w_t w_t^T and the
shard's first / last tokens f and l, the shard-level boundary-adjusted quantities are
(row form, one row per token, as in `pathattn.ops.path.ut`):

    Qs_i = H_f ... H_i q_i          (scaled: scale * Q~ of the whole shard)
    Ks_j = H_l ... H_{j+1} k_j      (K~ of the whole shard)
    Pt   = (H_f ... H_l)^T          (row-form transition of the whole shard)

For a query i in shard r and a key j in an earlier shard s,

    scale * k_j^T H_{j+1} ... H_i q_i = Qs_i Pt_{r-1} Pt_{r-2} ... Pt_{s+1} Ks_j^T,

so the query rows are updated by the row-form transitions of the shards in between,
exactly the scan of `pathattn.ops.path.blockwise` at the granularity of shards. The shard-level
quantities come from the per-block UT transform: with the blocks 0 .. n-1 of the shard and
their row-form transitions Pt_b,

    Qs (block b) = Q~_b Pt_{b-1} ... Pt_0,    Ks (block b) = K~_b Pt_{b+1}^T ... Pt_{n-1}^T,
    Pt = Pt_{n-1} ... Pt_0.

Forget gates (PaTH-FoX): G_i - G_j = a_i + b_j with the query term
a_i = Gl_i + (sum of the shard totals in between) and the key term b_j = Gtot_s - Gl_j,
Gl the inclusive cumulative sum of g inside a shard and Gtot its last value (float64).

Cross-shard tiles use the token-head layout: queries [B, H, Gr, T, D] (Gr = HQ // H query
heads per key/value head), keys / values [B, H, T, D] / [B, H, T, Dv].
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ...common.layout import BlockLayout, from_blocks
from ..blockwise import exp_cutoff_
from ..ut import BlockUT

__all__ = ["ShardTerms", "shard_terms", "shard_gates", "rows_to_heads", "heads_to_rows",
           "cross_forward", "cross_backward", "merge_partial"]

# elements of one cross-shard logit tile [B, H, Gr, rows, Tk] kept in memory at a time
TILE_ELEMENTS = 1 << 22


class ShardTerms(NamedTuple):
    qs: torch.Tensor  # [B, H, Gr, T, D]  scale * Q~ of the shard
    ks: torch.Tensor  # [B, H, T, D]      K~ of the shard
    pt: torch.Tensor  # [B, H, D, D]      row-form transition of the shard


def _local_order(x: torch.Tensor, nb: int, B: int) -> torch.Tensor:
    """Dense-batch blocks in scan order [NB, ...] -> [nb, B, ...] by local block index.

    Scan order sorts blocks by local index descending, ties by sequence (`layout`), so a
    dense batch's row (nb - 1 - l) * B + b holds block l of sequence b.
    """
    return x.view((nb, B) + tuple(x.shape[1:])).flip(0)


def shard_terms(lay: BlockLayout, ut: BlockUT, B: int, T: int, HQ: int) -> ShardTerms:
    """Shard-level (Qs, Ks, Pt) from the per-block UT quantities of a dense [B, T] layout.
    Differentiable (plain matmuls): the backward pass runs it under autograd."""
    NB, H, R, D = ut.qt.shape
    nb, Gr = NB // B, HQ // H
    qt = _local_order(ut.qt, nb, B)  # [nb, B, H, R, D]
    kt = _local_order(ut.kt, nb, B)  # [nb, B, H, C, D]
    pt = _local_order(ut.pt, nb, B)  # [nb, B, H, D, D]
    eye = torch.eye(D, dtype=pt.dtype, device=pt.device).expand_as(pt[0])
    prefix = [eye]  # prefix[b] = Pt_{b-1} ... Pt_0
    for b in range(nb):
        prefix.append(pt[b] @ prefix[-1])
    suffix = [eye]  # built backwards: suffix[b] = Pt_{b+1}^T ... Pt_{n-1}^T
    for b in range(nb - 1, 0, -1):
        suffix.append(pt[b].transpose(-1, -2) @ suffix[-1])
    suffix.reverse()
    qs = qt @ torch.stack(prefix[:nb])  # [nb, B, H, R, D]
    ks = kt @ torch.stack(suffix)  # [nb, B, H, C, D]
    C = ks.shape[-2]
    # back to scan order, then to tokens (dropping padding slots)
    qs = qs.flip(0).reshape(NB, H, Gr, C, D).permute(0, 3, 1, 2, 4)  # [NB, C, H, Gr, D]
    qs = from_blocks(qs, lay).view(B, T, H, Gr, D).permute(0, 2, 3, 1, 4)  # [B, H, Gr, T, D]
    ks = from_blocks(ks.flip(0).reshape(NB, H, C, D).transpose(1, 2), lay)  # [B*T, H, D]
    ks = ks.view(B, T, H, D).transpose(1, 2)  # [B, H, T, D]
    return ShardTerms(qs=qs, ks=ks, pt=prefix[nb])


def shard_gates(g: torch.Tensor, H: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """g [B, T, HQ] -> (a0, b, tot) in float64: a0 [B, H, Gr, T] the inclusive cumulative
    sum inside the shard (query term before any shard is passed), b [B, H, Gr, T] the key
    term tot - a0, tot [B, H, Gr] the shard's total."""
    B, T, HQ = g.shape
    gl = g.to(torch.float64).cumsum(1).view(B, T, H, HQ // H).permute(0, 2, 3, 1)
    tot = gl[..., -1].contiguous()
    return gl.contiguous(), tot[..., None] - gl, tot


def rows_to_heads(x: torch.Tensor, H: int) -> torch.Tensor:
    """Tokens [B, T, HQ, F] -> token-head layout [B, H, Gr, T, F]."""
    B, T, HQ, F = x.shape
    return x.view(B, T, H, HQ // H, F).permute(0, 2, 3, 1, 4)


def heads_to_rows(x: torch.Tensor) -> torch.Tensor:
    """Token-head layout [B, H, Gr, T, F] -> tokens [B, T, HQ, F]."""
    B, H, Gr, T, F = x.shape
    return x.permute(0, 3, 1, 2, 4).reshape(B, T, H * Gr, F)


def _chunks(Q: torch.Tensor, Tk: int):
    """Slices of the query axis of Q [B, H, Gr, Tq, D] whose tiles fit TILE_ELEMENTS."""
    B, H, Gr, Tq, _ = Q.shape
    step = max(1, TILE_ELEMENTS // max(1, B * H * Gr * Tk))
    return [slice(i, min(i + step, Tq)) for i in range(0, Tq, step)]


def _tile_logits(Q, K, a, b):
    """Q [B, H, Gr, tq, D] @ K^T + gate terms -> S [B, H, Gr, tq, Tk]."""
    S = Q @ K[:, :, None].transpose(-1, -2)
    if a is not None:
        S += (a[..., :, None] + b[..., None, :]).to(S.dtype)
    return S


def cross_forward(Q, K, V, a=None, b=None):
    """Softmax attention of every query row to every key of an earlier shard (no mask).

    Q [B, H, Gr, Tq, D] (query states, scaled); K [B, H, Tk, D]; V [B, H, Tk, Dv];
    a [B, H, Gr, Tq], b [B, H, Gr, Tk] float64 gate terms or None.
    Returns the normalised partial output [B, H, Gr, Tq, Dv] and its lse [B, H, Gr, Tq].
    """
    B, H, Gr, Tq, _ = Q.shape
    o = Q.new_empty(B, H, Gr, Tq, V.shape[-1])
    lse = Q.new_empty(B, H, Gr, Tq)
    for sl in _chunks(Q, K.shape[2]):
        S = _tile_logits(Q[..., sl, :], K, None if a is None else a[..., sl], b)
        m = S.amax(-1)
        exp_cutoff_(S.sub_(m[..., None]))
        den = S.sum(-1)
        o[..., sl, :] = (S @ V[:, :, None]) / den[..., None]
        lse[..., sl] = m + den.log()
    return o, lse


def merge_partial(o, lse, o_part, lse_part):
    """Combine two normalised partial softmax outputs by their log-sum-exps, in place in
    o and lse. o [.., T, Dv], lse [.., T]."""
    new = torch.logaddexp(lse, lse_part)
    o.mul_((lse - new).exp_()[..., None]).add_(o_part * (lse_part - new).exp()[..., None])
    lse.copy_(new)


class CrossGrads(NamedTuple):
    dq: torch.Tensor  # [B, H, Gr, Tq, D] gradient of the query states
    dk: torch.Tensor  # [B, H, Tk, D]
    dv: torch.Tensor  # [B, H, Tk, Dv]
    dcol: torch.Tensor | None  # [B, H, Gr, Tk] column sums of dS (gate gradient)


def cross_backward(Q, K, V, a, b, do, lse, delta) -> CrossGrads:
    """FlashAttention-2 backward of `cross_forward` with the *global* lse and
    delta = rowsum(dO * O) [B, H, Gr, Tq] of the full softmax rows; do [B, H, Gr, Tq, Dv]."""
    dq = torch.empty_like(Q)
    dk = torch.zeros_like(K)
    dv = torch.zeros_like(V)
    dcol = None if a is None else Q.new_zeros(b.shape)
    Vt = V[:, :, None].transpose(-1, -2)  # [B, H, 1, Dv, Tk]
    for sl in _chunks(Q, K.shape[2]):
        Qc, doc = Q[..., sl, :], do[..., sl, :]
        P = _tile_logits(Qc, K, None if a is None else a[..., sl], b)
        exp_cutoff_(P.sub_(lse[..., sl, None]))  # [B, H, Gr, tq, Tk]
        dv += (P.transpose(-1, -2) @ doc).sum(2)
        dS = (doc @ Vt).sub_(delta[..., sl, None]).mul_(P)
        del P
        dk += (dS.transpose(-1, -2) @ Qc).sum(2)
        if dcol is not None:
            dcol += dS.sum(-2)
        dq[..., sl, :] = dS @ K[:, :, None]
    return CrossGrads(dq, dk, dv, dcol)
