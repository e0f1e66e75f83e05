"""Blockwise stick-breaking attention as torch.library custom ops, so that torch.compile
(fullgraph, dynamic shapes, cu_seqlens) sees one opaque node per pass, as for PaTH's op
(`pathattn.ops.path.function`): each op builds the block layout itself (it reads cu_seqlens)
and every output's shape follows from the input shapes.

forward (`pathattn::sb_fwd`): tokens -> blocks (`pathattn.ops.path.stages`) -> `forward_blocks`
-> o in the compute dtype; autograd saves q, k, v and o (O(T * D) per head).
backward (`pathattn::sb_bwd`): the blocks again (gathers), then `backward_blocks`, which
recomputes every tile (extra memory O(T * HQ * C) for the tiles of one scan step, never
T x T), and the block gradients mapped back to tokens.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..common.block_size import cached_layout
from ..common.heads import compute_dtype, kv_blocks, kv_tokens, row_blocks, rows_to_tokens
from .blockwise import backward_blocks, forward_blocks

__all__ = ["sb_attention", "sb_fwd", "sb_bwd"]


def _query_rows(x: torch.Tensor, lay, H: int, cd: torch.dtype) -> torch.Tensor:
    """Query-side tokens [B, T, HQ, F] -> rows [NB, H, Gr * C, F] in dtype cd."""
    return row_blocks(x, lay, H, cd).flatten(2, 3)  # [NB, H, Gr * C, F]


@torch.library.custom_op("pathattn::sb_fwd", mutates_args=())
def sb_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           cu_seqlens: Optional[torch.Tensor], scale: float,  # noqa: UP045
           attend_current: bool, block_size: Optional[int]  # noqa: UP045
           ) -> torch.Tensor:
    """o [B, T, HQ, Dv] in the compute dtype. Arguments as `pathattn.ops.sb_attn`
    (validated there, B * T > 0)."""
    cd = compute_dtype(q.dtype)
    lay = cached_layout(q, cu_seqlens, block_size)
    with torch.no_grad(), torch.autocast(q.device.type, enabled=False):
        qb = _query_rows(q, lay, k.shape[2], cd)  # [NB, H, R, D]
        kb, vb = kv_blocks(k, lay, cd), kv_blocks(v, lay, cd)  # [NB, H, C, D / Dv]
        ob = forward_blocks(qb, kb, vb, lay, scale, attend_current)  # [NB, H, R, Dv]
        return rows_to_tokens(ob, lay, tuple(q.shape[:3]) + (v.shape[3],))


@sb_fwd.register_fake
def _(q, k, v, cu_seqlens, scale, attend_current, block_size):
    return q.new_empty(tuple(q.shape[:3]) + (v.shape[3],), dtype=compute_dtype(q.dtype))


@torch.library.custom_op("pathattn::sb_bwd", mutates_args=())
def sb_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           o: torch.Tensor, cu_seqlens: Optional[torch.Tensor], scale: float,  # noqa: UP045
           attend_current: bool, block_size: Optional[int]  # noqa: UP045
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv), each in its input's dtype, from do [B, T, HQ, Dv] and the forward's
    o (compute dtype)."""
    lay = cached_layout(q, cu_seqlens, block_size)
    cd, H = o.dtype, k.shape[2]
    with torch.no_grad(), torch.autocast(q.device.type, enabled=False):
        qb = _query_rows(q, lay, H, cd)
        kb, vb = kv_blocks(k, lay, cd), kv_blocks(v, lay, cd)
        ob = _query_rows(o, lay, H, cd)  # [NB, H, R, Dv]
        dob = _query_rows(do, lay, H, cd)  # 0 at padding
        delta = (dob * ob).sum(-1)  # [NB, H, R]
        dqb, dkb, dvb = backward_blocks(qb, kb, vb, dob, delta, lay, scale, attend_current)
        return (rows_to_tokens(dqb, lay, q.shape).to(q.dtype),
                kv_tokens(dkb, lay, k.shape).to(k.dtype),
                kv_tokens(dvb, lay, v.shape).to(v.dtype))


@sb_bwd.register_fake
def _(do, q, k, v, o, cu_seqlens, scale, attend_current, block_size):
    return tuple(x.new_empty(x.shape) for x in (q, k, v))


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens, scale, attend_current, block_size = inputs
    ctx.save_for_backward(q, k, v, output, cu_seqlens)
    ctx.args = (scale, attend_current, block_size)


def _backward(ctx, do):
    q, k, v, o, cu_seqlens = ctx.saved_tensors
    dq, dk, dv = sb_bwd(do, q, k, v, o, cu_seqlens, *ctx.args)
    return dq, dk, dv, None, None, None, None


sb_fwd.register_autograd(_backward, setup_context=_setup_context)


def sb_attention(q, k, v, scale: float, cu_seqlens, attend_current: bool,
                 block_size: int | None) -> torch.Tensor:
    """The blockwise op (`sb_fwd`, differentiable): o [B, T, HQ, Dv] in q's dtype."""
    return sb_fwd(q, k, v, cu_seqlens, scale, attend_current, block_size).to(q.dtype)
