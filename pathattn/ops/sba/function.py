"""autograd.Function of blockwise stick-breaking attention.

forward: tokens -> blocks (`pathattn.ops.stages`) -> `forward_blocks`; saves the block
inputs and the output rows in the compute dtype (O(T * D) per head).
backward: `backward_blocks` recomputes every tile (extra memory O(T * HQ * C) for the tiles
of one scan step, never T x T) and maps the block gradients back to tokens.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ..path_attn import blockwise_layout
from ..stages import compute_dtype, kv_blocks, kv_tokens, row_blocks, rows_to_tokens
from .blockwise import backward_blocks, forward_blocks

__all__ = ["SBAttnFunction"]


def _query_rows(x: torch.Tensor, lay, H: int, cd: torch.dtype) -> torch.Tensor:
    """Query-side tokens [B, T, HQ, F] -> rows [NB, H, Gr * C, F] in dtype cd."""
    return row_blocks(x, lay, H, cd).flatten(2, 3)  # [NB, H, Gr * C, F]


class SBAttnFunction(torch.autograd.Function):
    """apply(q, k, v, scale, cu_seqlens, attend_current, block_size) -> o [B, T, HQ, Dv] in
    q's dtype; arguments as `pathattn.ops.sb_attn` (validated there, B * T > 0)."""

    @staticmethod
    def forward(ctx, q, k, v, scale: float, cu_seqlens, attend_current: bool,
                block_size: int | None):
        cd = compute_dtype(q.dtype)
        lay = blockwise_layout(q, cu_seqlens, block_size)
        H = k.shape[2]
        qb = _query_rows(q, lay, H, cd)  # [NB, H, R, D]
        kb, vb = kv_blocks(k, lay, cd), kv_blocks(v, lay, cd)  # [NB, H, C, D / Dv]
        ob = forward_blocks(qb, kb, vb, lay, scale, attend_current)  # [NB, H, R, Dv]
        ctx.save_for_backward(qb, kb, vb, ob)
        ctx.lay, ctx.scale, ctx.attend_current = lay, scale, attend_current
        ctx.shapes = (q.shape, k.shape, v.shape)
        ctx.dtypes = (q.dtype, k.dtype, v.dtype)
        o_shape = tuple(q.shape[:3]) + (v.shape[3],)
        return rows_to_tokens(ob, lay, o_shape).to(q.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, do):
        qb, kb, vb, ob = ctx.saved_tensors
        lay = ctx.lay
        with torch.autocast(do.device.type, enabled=False):  # the op's own precision rule
            dob = _query_rows(do, lay, kb.shape[1], ob.dtype)  # [NB, H, R, Dv], 0 at padding
            delta = (dob * ob).sum(-1)  # [NB, H, R]
            dqb, dkb, dvb = backward_blocks(qb, kb, vb, dob, delta, lay, ctx.scale,
                                            ctx.attend_current)
        (q_shape, k_shape, v_shape), (q_dt, k_dt, v_dt) = ctx.shapes, ctx.dtypes
        dq = rows_to_tokens(dqb, lay, q_shape).to(q_dt)
        dk = kv_tokens(dkb, lay, k_shape).to(k_dt)
        dv = kv_tokens(dvb, lay, v_shape).to(v_dt)
        return dq, dk, dv, None, None, None, None
