"""Reference forgetting attention (FoX, Lin et al. 2025): the oracle of the tests.

For each sequence and query head, with G_t = g_1 + ... + g_t the cumulative sum of the log
forget gates within the sequence:

    logit(i, j) = scale * q_i . k_j + G_i - G_j          j <= i
    o_i         = sum_j softmax_j(logit(i, .)) v_j

This is PaTH-FoX attention with identity transforms (w = 0 or beta = 0). Written for
clarity, not speed: O(T^2) memory per sequence, float64 by default. Shapes as
`pathattn.ops.fox.fox_attn`: q [B, T, HQ, D]; k [B, T, H, D]; v [B, T, H, Dv]; g
[B, T, HQ]; cu_seqlens [S + 1] with B == 1 for packed sequences.
"""

from __future__ import annotations

import torch

from ..common.heads import default_scale, expand_kv_heads

__all__ = ["fox_attn_naive"]


def fox_attn_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, *,
                   scale: float | None = None, cu_seqlens: torch.Tensor | None = None,
                   dtype: torch.dtype | None = torch.float64) -> torch.Tensor:
    """Forgetting attention by its definition (module docstring).

    Args as `fox_attn`; dtype: the precision of every operation (float64 by default). None
    computes as plain PyTorch would at the inputs' precision: q . k and P V in q's dtype,
    the gates, logits and softmax in g's dtype (promoted), P rounded to v's dtype.
    Returns o [B, T, HQ, Dv] in `dtype` (q's dtype when None), differentiable in q, k, v, g.
    """
    B, T, HQ, D = q.shape
    s = default_scale(D, scale)
    if dtype is not None:
        q, k, v, g = q.to(dtype), k.to(dtype), v.to(dtype), g.to(dtype)
    groups = HQ // k.shape[2]
    out = []
    for b in range(B):
        rows = [_one_sequence(q[b, a:e], expand_kv_heads(k[b, a:e], groups),
                              expand_kv_heads(v[b, a:e], groups), g[b, a:e], s)
                for a, e in _bounds(b, T, cu_seqlens)]
        out.append(torch.cat(rows, dim=0) if rows else q.new_zeros(0, HQ, v.shape[-1]))
    return torch.stack(out)  # [B, T, HQ, Dv]


def _bounds(b: int, T: int, cu_seqlens: torch.Tensor | None) -> list[tuple[int, int]]:
    """(start, end) of the sequences of batch row b, in order (empty ones too)."""
    if cu_seqlens is None:
        return [(0, T)]
    cu = [int(x) for x in cu_seqlens.tolist()]
    return list(zip(cu[:-1], cu[1:], strict=True))


def _one_sequence(q, k, v, g, scale: float) -> torch.Tensor:
    """q, k [L, HQ, D]; v [L, HQ, Dv]; g [L, HQ] -> o [L, HQ, Dv]."""
    L = q.shape[0]
    G = g.cumsum(0).T  # [HQ, L]
    logits = scale * torch.einsum("ihd,jhd->hij", q, k) + G[:, :, None] - G[:, None, :]
    causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    logits = logits.masked_fill(~causal, float("-inf"))  # [HQ, L, L]
    return torch.einsum("hij,jhd->ihd", torch.softmax(logits, dim=-1).to(v.dtype), v)
