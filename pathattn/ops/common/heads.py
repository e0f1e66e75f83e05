"""Head and dtype helpers shared by the ops: the compute dtype, the default logit scale,
grouped key/value heads (GQA / MQA), and token tensors <-> block tensors per head.

Block tensors put the C tokens of a block next to each other, blocks in the scan order of
`BlockLayout` (`pathattn.ops.common.layout`): key-side tensors per key/value head
[NB, H, C, ...]; query-side rows per key/value head and group of query heads
[NB, H, Gr, C, ...] (Gr = HQ // H query heads share a key/value head).
"""

from __future__ import annotations

import torch

from .layout import BlockLayout, from_head_blocks, to_head_blocks

__all__ = ["compute_dtype", "default_scale", "expand_kv_heads", "kv_blocks", "kv_tokens",
           "row_blocks", "rows_to_tokens"]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype of every backend: float64 stays float64, everything else (float32,
    bfloat16, float16) computes in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def default_scale(D: int, scale: float | None) -> float:
    """The logit scale: `scale` as a float, D ** -0.5 when None. D is read as a plain int
    (under torch.compile with dynamic shapes: the head dim is specialized, so the scale
    stays a constant of the graph)."""
    return int(D)**-0.5 if scale is None else float(scale)


def expand_kv_heads(x: torch.Tensor, groups: int) -> torch.Tensor:
    """Key/value heads on dim 1 -> query heads: [N, H, ...] -> [N, H * groups, ...], query
    head h reading key/value head h // groups (GQA / MQA; groups = HQ // H)."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def kv_blocks(x: torch.Tensor, lay: BlockLayout, cd: torch.dtype) -> torch.Tensor:
    """Key-side tokens [B, T, H, *F] -> blocks [NB, H, C, *F] in dtype cd."""
    return to_head_blocks(x.reshape((-1,) + tuple(x.shape[2:])).to(cd), lay)


def kv_tokens(xb: torch.Tensor, lay: BlockLayout, shape) -> torch.Tensor:
    """Blocks [NB, H, C, *F] -> tokens of `shape` [B, T, H, *F] (inverse of `kv_blocks`).
    R features per token [NB, H, C * R, *F] -> tokens [B, T, H, R, *F]."""
    if xb.shape[2] != lay.C:
        xb = xb.unflatten(2, (lay.C, -1))  # [NB, H, C, R, *F]
    return from_head_blocks(xb, lay).view(shape)


def row_blocks(x: torch.Tensor, lay: BlockLayout, H: int, cd: torch.dtype) -> torch.Tensor:
    """Query-side tokens [B, T, HQ, F] -> [NB, H, Gr, C, F] (Gr = HQ // H) in dtype cd."""
    HQ, F = x.shape[2], x.shape[3]
    xb = to_head_blocks(x.reshape(-1, HQ, F).to(cd), lay)  # [NB, HQ, C, F], hq = h * Gr + g
    return xb.view(lay.NB, H, HQ // H, lay.C, F)


def rows_to_tokens(xb: torch.Tensor, lay: BlockLayout, shape) -> torch.Tensor:
    """Query rows [NB, H, Gr * C, F] -> tokens of `shape` [B, T, HQ, F]."""
    NB, H, R, F = xb.shape
    x = xb.reshape(NB, H * (R // lay.C), lay.C, F)  # [NB, HQ, C, F]
    return from_head_blocks(x, lay).view(shape)
