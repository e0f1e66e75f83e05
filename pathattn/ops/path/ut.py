"""Per-block UT transform: everything the blockwise scan needs from one block (section 3.3).

For a block of c tokens with W [c, D] (rows w_t) and beta [c], the UT transform gives

    A = (I + strictLower(diag(beta) W W^T))^{-1} diag(beta)          [c, c], lower triangular

and for positions s <= e inside the block (local indices)

    H_e ... H_s = I - sum_{s <= l <= k <= e} w_k A_kl w_l^T.

With it (row form, one row per token; our A is the paper's T^{-1}):

    boundary-adjusted queries  Q~ = Q - tril(Q W^T) A W               q~_i = H_first ... H_i q_i
    boundary-adjusted keys     K~ = K - (A strictLower(W K^T))^T W    k~_j = H_last ... H_{j+1} k_j
    block transition           Pt = I - W^T A W           (Pt = P^T, P = H_first ... H_last)
    in-block logits            S  = Q K^T - tril(Q W^T) A strictLower(W K^T)   (for j <= i)

so that for query i in block a and key j in block b < a

    logit(i, j) = k~_j^T P_{b+1} ... P_{a-1} q~_i,

which the scan evaluates right to left by updating the query rows q~ <- q~ Pt_b after each
key block b.

The UT terms cost O(c^2 (c + D)) per block of c tokens, so they are computed on sub-blocks
of c tokens and adjacent sub-blocks (a, b) are merged pairwise until the scan's block size
C is reached (a merge level costs O(c^2 D + c D^2 + D^3) per pair):

    Q~ = [Q~_a ; Q~_b Pt_a],   K~ = [K~_a Pt_b^T ; K~_b],   Pt = Pt_b Pt_a,
    S  = [[S_a, 0], [Q~_b K~_a^T, S_b]],

which is exactly one step of the scan. The sub-block length follows the head dim
(`sub_block_target`). Everything here is plain differentiable PyTorch:
the backward pass re-runs it under autograd to turn gradients of (Q~, K~, Pt, S) into
gradients of (q, k, w, beta).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["BlockUT", "block_ut", "sub_block_size", "sub_block_target"]


class BlockUT(NamedTuple):
    qt: torch.Tensor  # [NB, H, Gr*C, D]  scale * Q~ (rows of the Gr heads sharing a KV head)
    kt: torch.Tensor  # [NB, H, C, D]     K~
    pt: torch.Tensor  # [NB, H, D, D]     Pt = P^T, the row-form block transition
    s_diag: torch.Tensor  # [NB, H, Gr*C, C] scale * in-block logits (upper triangle unmasked)


def sub_block_target(D: int, fused: bool = False) -> int:
    """Longest sub-block for head dim D. Per token the sub-block terms grow with c and the
    merges with D^2 / c. Measured on CPU (fwd + bwd): for this module's batched PyTorch ops
    D / 2 within [16, 64] (1.35x faster than c = 64 at D = 32, 3.8x at D = 16); for the
    fused C++ kernels (fused=True), whose cost per GEMM call matters more, D / 2 within
    [32, 64]."""
    return min(64, max(32 if fused else 16, D // 2))


def sub_block_size(C: int, target: int = 64) -> int:
    """Largest c <= target with C = c * 2^k (C itself when no such c exists)."""
    c = C
    while c > target and c % 2 == 0:
        c //= 2
    return c


class _UnitLowerInverse(torch.autograd.Function):
    """X = Tm^{-1} for unit lower-triangular Tm [.., c, c] (only its strictly lower part is
    read, so only that part gets a gradient).

    Backward from the explicit inverse, dTm = strictLower(-X^T dX X^T) (two batched GEMMs):
    autograd's
    rule for solve_triangular runs a transposed triangular solve that is orders of
    magnitude slower on CPU for batches of small matrices.
    """

    @staticmethod
    def forward(Tm):
        eye = torch.eye(Tm.shape[-1], dtype=Tm.dtype, device=Tm.device).expand_as(Tm)
        return torch.linalg.solve_triangular(Tm, eye, upper=False, unitriangular=True)

    @staticmethod
    def setup_context(ctx, inputs, output):  # separate: torch.func transforms need it
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, dX):
        (X,) = ctx.saved_tensors
        Xt = X.transpose(-1, -2)
        return torch.tril(-(Xt @ dX @ Xt), diagonal=-1)


def _ut_masks(c: int, R: int, dt: torch.dtype, dev):
    """Masks of a sub-block of c tokens with R reflections each (reflection l belongs to
    token l // R): strict [cR, cR] strictly lower (the UT matrix); incl [c, cR], query i
    takes reflection l when l // R <= i (tril for R = 1); later [cR, c], key j takes
    reflection l when l // R > j (strictly lower for R = 1)."""
    token = torch.arange(c * R, device=dev) // R  # [cR]
    pos = torch.arange(c, device=dev)  # [c]
    lower = torch.ones(c * R, c * R, dtype=torch.bool, device=dev).tril()
    strict = (lower & ~torch.eye(c * R, dtype=torch.bool, device=dev)).to(dt)
    incl = (token[None, :] <= pos[:, None]).to(dt)
    later = (token[:, None] > pos[None, :]).to(dt)
    return strict, incl, later


def _ut_small(qb, kb, wb, bb):
    """UT transform of sub-blocks. qb [NB, H, Gr, m, c, D]; kb [NB, H, m, c, D]; wb
    [NB, H, m, c*R, D] and bb [NB, H, m, c*R], the R reflections of each token in order
    (R = 1: one per token). Returns unscaled (Q~, K~, Pt, S) with shapes
    [NB, H, Gr, m, c, D], [NB, H, m, c, D], [NB, H, m, D, D], [NB, H, Gr, m, c, c]."""
    cr, D = wb.shape[-2:]  # c * R reflections
    c = kb.shape[-2]
    dev, dt = wb.device, wb.dtype
    strict, incl, later = _ut_masks(c, cr // c, dt, dev)
    eye_c = torch.eye(cr, dtype=dt, device=dev)
    Tm = (wb @ wb.transpose(-1, -2)).mul_(bb[..., :, None]).mul_(strict).add_(eye_c)  # [.., cR, cR]
    Tinv = _UnitLowerInverse.apply(Tm)
    A = Tinv * bb[..., None, :]  # [NB, H, m, cR, cR] = Tm^{-1} diag(beta)
    AW = A @ wb  # [NB, H, m, cR, D]
    M = A @ (wb @ kb.transpose(-1, -2)).mul_(later)  # A later(W K^T) [NB, H, m, cR, c]
    QW = (qb @ wb[:, :, None].transpose(-1, -2)).mul_(incl)  # incl(Q W^T) [NB, H, Gr, m, c, cR]
    q_tilde = qb - QW @ AW[:, :, None]
    s = qb @ kb[:, :, None].transpose(-1, -2) - QW @ M[:, :, None]
    k_tilde = kb - M.transpose(-1, -2) @ wb
    pt = torch.eye(D, dtype=dt, device=dev) - wb.transpose(-1, -2) @ AW  # [NB, H, m, D, D]
    return q_tilde, k_tilde, pt, s


def _merge_pairs(qt, kt, pt, s):
    """Merge sub-blocks 2i and 2i+1 (one scan step); shapes as `_ut_small` with m -> m / 2
    and c -> 2c."""
    qa, qb = qt[:, :, :, 0::2], qt[:, :, :, 1::2]  # [NB, H, Gr, m/2, c, D]
    ka, kb = kt[:, :, 0::2], kt[:, :, 1::2]  # [NB, H, m/2, c, D]
    pa, pb = pt[:, :, 0::2], pt[:, :, 1::2]  # [NB, H, m/2, D, D]
    sa, sb = s[:, :, :, 0::2], s[:, :, :, 1::2]  # [NB, H, Gr, m/2, c, c]
    cross = qb @ ka[:, :, None].transpose(-1, -2)  # b's queries, a's keys [.., c, c]
    c = sa.shape[-1]
    if torch.is_grad_enabled():  # cat: its backward is free views
        s_new = torch.cat([torch.cat([sa, torch.zeros_like(sa)], dim=-1),
                           torch.cat([cross, sb], dim=-1)], dim=-2)  # [.., 2c, 2c]
    else:  # quadrant writes: one copy of every element
        s_new = sa.new_empty(sa.shape[:-2] + (2 * c, 2 * c))  # [NB, H, Gr, m/2, 2c, 2c]
        s_new[..., :c, :c] = sa
        s_new[..., :c, c:] = 0  # above the diagonal: masked by the scan
        s_new[..., c:, :c] = cross
        s_new[..., c:, c:] = sb
    q_new = torch.cat([qa, qb @ pa[:, :, None]], dim=-2)  # [.., 2c, D]
    k_new = torch.cat([ka @ pb.transpose(-1, -2), kb], dim=-2)
    return q_new, k_new, pb @ pa, s_new  # the scan passes b before a


def block_ut(qb: torch.Tensor, kb: torch.Tensor, wb: torch.Tensor, bb: torch.Tensor,
             scale: float, sub_block: int | None = None) -> BlockUT:
    """UT transform of every block of C tokens, built from sub-blocks of `sub_block` tokens.

    qb [NB, H, Gr, C, D]; kb, wb [NB, H, C, D]; bb [NB, H, C]; one floating dtype. With R
    reflections per token wb is [NB, H, C * R, D] and bb [NB, H, C * R] (reflection
    l = t * R + r of token t, `pathattn.ops.path.stages`): the sub-block's UT runs over its
    c * R reflections, and only its masks read the token of each; the outputs and the
    merges do not depend on R. `sub_block` counts tokens.
    """
    NB, H, Gr, C, D = qb.shape
    R = wb.shape[-2] // C  # reflections per token
    c = sub_block_size(C, sub_block_target(D)) if sub_block is None else sub_block
    m = C // c
    # the scale multiplies every query-side quantity: apply it once to q
    qt, kt, pt, s = _ut_small((qb * scale).view(NB, H, Gr, m, c, D), kb.view(NB, H, m, c, D),
                              wb.view(NB, H, m, c * R, D), bb.view(NB, H, m, c * R))
    while m > 1:
        qt, kt, pt, s = _merge_pairs(qt, kt, pt, s)
        m //= 2
    return BlockUT(
        qt=qt.reshape(NB, H, Gr * C, D),
        kt=kt.reshape(NB, H, C, D),
        pt=pt.reshape(NB, H, D, D),
        s_diag=s.reshape(NB, H, Gr * C, C),
    )
