"""Reference stick-breaking attention (Tan et al. 2024): the oracle of the tests.

For each sequence and query head, with z_ij = scale * q_i . k_j and beta_ij = sigmoid(z_ij):

    A_ij = beta_ij * prod_{j < k < i} (1 - beta_ik)        j < i      (attend_current=False)
    A_ij = beta_ij * prod_{j < k <= i} (1 - beta_ik)       j <= i     (attend_current=True)
    o_i  = sum_j A_ij v_j                                  (no normalisation)

Query i breaks a stick of length 1 from the nearest allowed key backwards: key j gets the
fraction beta_ij of what the keys between j and i left over. The weights of a row sum to at
most 1, and a row with no allowed key (row 0 without attend_current) is zero.

Written for clarity, not speed: the product is formed over an [HQ, T, T, T] tensor of
factors, in float64 by default. Shapes as `pathattn.ops.sb_attn`: q [B, T, HQ, D]; k
[B, T, H, D]; v [B, T, H, Dv]; cu_seqlens [N + 1] with B == 1 for packed sequences.
"""

from __future__ import annotations

import torch

from ..common.heads import default_scale, expand_kv_heads

__all__ = ["sb_attn_naive", "sb_attn_weights"]


def sb_attn_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                  scale: float | None = None, cu_seqlens: torch.Tensor | None = None,
                  attend_current: bool = False,
                  dtype: torch.dtype | None = torch.float64) -> torch.Tensor:
    """Stick-breaking attention by its definition (module docstring).

    Args:
        q: [B, T, HQ, D]; k: [B, T, H, D]; v: [B, T, H, Dv] (HQ a multiple of H: query head
            h reads key/value head h // (HQ // H)).
        scale: logit scale, default D ** -0.5.
        cu_seqlens: None or int [N + 1] packed sequence boundaries (B == 1).
        attend_current: whether query i also attends to key i.
        dtype: the computation's dtype (float64 by default); None computes in the inputs'
            own dtype ("plain PyTorch at that precision").

    Returns o [B, T, HQ, Dv] in `dtype` (q's dtype when None), differentiable.
    """
    B, T, HQ, D = q.shape
    groups = HQ // k.shape[2]
    s = default_scale(D, scale)
    if dtype is not None:
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    rows = []
    for b, start, end in _segments(B, T, cu_seqlens):
        ks, vs = (expand_kv_heads(x[b, start:end], groups) for x in (k, v))  # [L, HQ, D]
        rows.append((b, _one_sequence(q[b, start:end], ks, vs, s, attend_current)))
    if not rows:
        return q.new_zeros(B, T, HQ, v.shape[-1])
    return torch.stack([torch.cat([o for bb, o in rows if bb == b], dim=0)
                        for b in range(B)])  # [B, T, HQ, Dv]


def _segments(B: int, T: int, cu_seqlens: torch.Tensor | None) -> list[tuple[int, int, int]]:
    """(batch row, start, end) of every non-empty sequence, in order."""
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)] if T else []
    bounds = [int(x) for x in cu_seqlens.tolist()]
    return [(0, s, e) for s, e in zip(bounds[:-1], bounds[1:], strict=True) if e > s]


def _one_sequence(q, k, v, scale: float, attend_current: bool) -> torch.Tensor:
    """q, k [L, HQ, D]; v [L, HQ, Dv] -> o [L, HQ, Dv]."""
    L = q.shape[0]
    beta = torch.sigmoid(scale * torch.einsum("ihd,jhd->hij", q, k))  # [HQ, L, L]
    i = torch.arange(L, device=q.device)
    allowed = (i[None, :] <= i[:, None]) if attend_current else (i[None, :] < i[:, None])
    # factor (i, j, k) of A_ij: 1 - beta_ik for the allowed keys k after j, else 1
    between = (i[None, None, :] > i[None, :, None]) & allowed[:, None, :]  # [L, L, L]
    factors = torch.where(between, 1 - beta[:, :, None, :], torch.ones_like(beta[:, :, None]))
    A = torch.where(allowed, beta * factors.prod(dim=-1), torch.zeros_like(beta))  # [HQ, L, L]
    return torch.einsum("hij,jhd->ihd", A, v)


def sb_attn_weights(q: torch.Tensor, k: torch.Tensor, *, scale: float | None = None,
                    attend_current: bool = False, key_mask: torch.Tensor | None = None,
                    dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The stick-breaking weights A_ij (module docstring) of the last m positions of one
    sequence per row (m = T: the whole prompt).

    Args:
        q: [B, m, HQ, D] queries of positions T - m .. T - 1; k: [B, T, H, D].
        scale, attend_current: as `sb_attn_naive`.
        key_mask: None or bool [B, T]: False marks positions that are no key (masked
            tokens): they get no weight and break no stick.
        dtype: the computation's dtype (float64 by default).

    Returns A [B, HQ, m, T] in `dtype`; a row sums to at most 1 (what is left of the stick
    goes nowhere). The product over the keys between j and i is a sum of
    log(1 - sigmoid(z)) (a suffix sum over the allowed keys, O(m * T) memory per head).
    """
    B, m, HQ, D = q.shape
    T = k.shape[1]
    s = default_scale(D, scale)
    kq = expand_kv_heads(k.to(dtype).transpose(1, 2), HQ // k.shape[2])  # [B, HQ, T, D]
    z = s * (q.to(dtype).transpose(1, 2) @ kq.mT)  # [B, HQ, m, T]
    pos = torch.arange(T - m, T, device=q.device)[:, None]  # [m, 1]
    j = torch.arange(T, device=q.device)[None, :]  # [1, T]
    allowed = (j <= pos) if attend_current else (j < pos)  # [m, T]
    allowed = allowed[None, None]
    if key_mask is not None:
        allowed = allowed & key_mask.to(torch.bool)[:, None, None, :]
    ln = torch.where(allowed, torch.nn.functional.logsigmoid(-z), z.new_zeros(()))
    later = ln.flip(-1).cumsum(-1).flip(-1) - ln  # sum over the allowed keys after j
    log_a = torch.nn.functional.logsigmoid(z) + later
    return torch.where(allowed, log_a.exp(), z.new_zeros(()))
