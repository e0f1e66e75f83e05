"""Public stick-breaking attention op (Tan et al. 2024, "Scaling Stick-Breaking Attention"),
a baseline beside PaTH attention."""

from __future__ import annotations

import torch

from ..common.heads import default_scale
from ..common.validation import check_block_size
from .function import sb_attention
from .validation import check_sb_attn_inputs

__all__ = ["sb_attn"]


def sb_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
            scale: float | None = None, cu_seqlens: torch.Tensor | None = None,
            attend_current: bool = False, block_size: int | None = None) -> torch.Tensor:
    """Causal stick-breaking attention (docs/ops.md, "Stick-breaking attention").

    With z_ij = scale * q_i . k_j over the allowed keys j < i (j <= i with attend_current):
    A_ij = sigmoid(z_ij) * prod_{allowed k > j} (1 - sigmoid(z_ik)), o_i = sum_j A_ij v_j.

    Args:
        q: [B, T, HQ, D]; k: [B, T, H, D] with HQ a multiple of H (GQA / MQA: query head h
            uses key/value head h // (HQ // H)); v: [B, T, H, Dv].
        scale: logit scale, default D ** -0.5.
        cu_seqlens: int tensor [N + 1] of packed sequence boundaries (B must be 1).
        attend_current: whether query i attends to key i too.
        block_size: tile length C, at most 1024; default 128, or the longest sequence
            rounded up to a multiple of 16 when that is shorter.

    q, k, v share a float dtype; low precision inputs compute in float32. Returns o
    [B, T, HQ, Dv] in q's dtype, differentiable in q, k and v; ValueError names any bad
    argument. Autocast does not reach inside; non-finite inputs are not isolated.
    """
    device = q.device.type if isinstance(q, torch.Tensor) else "cpu"  # bad q: checked below
    with torch.autocast(device, enabled=False):
        check_sb_attn_inputs(q, k, v, scale, cu_seqlens, attend_current)
        block_size = check_block_size(block_size)
        B, T, HQ, D = q.shape
        if B * T == 0:
            return q.new_zeros(B, T, HQ, v.shape[-1]) + 0 * (q.sum() + k.sum() + v.sum())
        return sb_attention(q, k, v, default_scale(D, scale), cu_seqlens, attend_current,
                            block_size)
