"""Per-block UT transform: everything the blockwise scan needs from one block (section 3.3).

For a block of C tokens with W [C, D] (rows w_t) and beta [C], the UT transform gives

    A = (I + strictLower(diag(beta) W W^T))^{-1} diag(beta)          [C, C], lower triangular

and for positions s <= e inside the block (local indices)

    H_e ... H_s = I - sum_{s <= l <= k <= e} w_k A_kl w_l^T.

With it (row form, one row per token; our A is the paper's T^{-1}):

    boundary-adjusted queries  Q~ = Q - tril(Q W^T) A W               q~_i = H_first ... H_i q_i
    boundary-adjusted keys     K~ = K - (A strictLower(W K^T))^T W    k~_j = H_last ... H_{j+1} k_j
    block transition           Pt = I - W^T A W                        (Pt = P^T, P = H_first...H_last)
    in-block logits            S  = Q K^T - tril(Q W^T) A strictLower(W K^T)   (for j <= i)

so that for query i in block a and key j in block b < a

    logit(i, j) = k~_j^T P_{b+1} ... P_{a-1} q~_i,

which the scan evaluates right to left by updating the query rows q~ <- q~ Pt_b after each
key block b. Everything here is plain differentiable PyTorch: the backward pass re-runs it
under autograd to turn gradients of (Q~, K~, Pt, S) into gradients of (q, k, w, beta).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["BlockUT", "block_ut"]


class BlockUT(NamedTuple):
    qt: torch.Tensor  # [NB, H, G*C, D]  scale * Q~ (query rows of the G heads sharing a KV head)
    kt: torch.Tensor  # [NB, H, C, D]    K~
    pt: torch.Tensor  # [NB, H, D, D]    Pt = P^T, the row-form block transition
    s_diag: torch.Tensor  # [NB, H, G*C, C] scale * in-block logits (upper triangle not masked)


def block_ut(qb: torch.Tensor, kb: torch.Tensor, wb: torch.Tensor, bb: torch.Tensor,
             scale: float) -> BlockUT:
    """UT transform of every block.

    qb [NB, H, G, C, D]; kb, wb [NB, H, C, D]; bb [NB, H, C]; all of one floating dtype.
    """
    NB, H, G, C, D = qb.shape
    eye_c = torch.eye(C, dtype=qb.dtype, device=qb.device)
    WWt = wb @ wb.transpose(-1, -2)  # [NB, H, C, C]
    Tm = eye_c + torch.tril(bb[..., :, None] * WWt, diagonal=-1)
    Tinv = torch.linalg.solve_triangular(Tm, eye_c.expand_as(Tm), upper=False,
                                         unitriangular=True)
    A = Tinv * bb[..., None, :]  # [NB, H, C, C] = Tm^{-1} diag(beta)
    QW = torch.tril(qb @ wb[:, :, None].transpose(-1, -2))  # [NB, H, G, C, C], k <= i
    U = QW @ A[:, :, None]  # [NB, H, G, C, C]
    q_tilde = qb - U @ wb[:, :, None]  # [NB, H, G, C, D]
    WK = torch.tril(wb @ kb.transpose(-1, -2), diagonal=-1)  # [NB, H, C, C], l > j
    s_diag = qb @ kb[:, :, None].transpose(-1, -2) - U @ WK[:, :, None]  # [NB, H, G, C, C]
    k_tilde = kb - (A @ WK).transpose(-1, -2) @ wb  # [NB, H, C, D]
    eye_d = torch.eye(D, dtype=qb.dtype, device=qb.device)
    pt = eye_d - wb.transpose(-1, -2) @ (A @ wb)  # [NB, H, D, D]
    return BlockUT(
        qt=(q_tilde * scale).reshape(NB, H, G * C, D),
        kt=k_tilde,
        pt=pt,
        s_diag=(s_diag * scale).reshape(NB, H, G * C, C),
    )
