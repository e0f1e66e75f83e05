"""Public stages of the blockwise pipeline (paper section 3.3), shared by the op
(`pathattn.ops.function`), the inference prefill and context parallelism:

    tokens [B, T, ...] --block_inputs--> block tensors --UT--> scan --rows_to_tokens /
    kv_tokens--> tokens

Block tensors put the C tokens of a block next to each other, blocks in the scan order of
`BlockLayout` (`pathattn.ops.layout`): keys, values, w, beta per key/value head
[NB, H, C, ...]; queries and outputs per key/value head and group of query heads
[NB, H, Gr, C, ...] (GQA: Gr = HQ // H query heads share a key/value head).

Several reflections per token (w [B, T, H, R, D], beta [B, T, H, R]): the block holds the
C * R reflections in order, wb [NB, H, C * R, D] and bb [NB, H, C * R], reflection
l = t * R + r of the block's token t (H_t = H_{t,1} ... H_{t,R}). The UT transform
(`pathattn.ops.ut`) reads R from these shapes; nothing after it depends on R.

Also decided here, once: the compute dtype (`compute_dtype`), the default logit scale
(`default_scale`) and the suffix products of block transitions (`suffix_transitions`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .gates import BlockGates, block_gates
from .layout import BlockLayout, from_head_blocks, to_head_blocks

__all__ = ["compute_dtype", "default_scale", "expand_kv_heads", "kv_blocks", "row_blocks",
           "rows_to_tokens", "kv_tokens", "ut_blocks", "num_reflections", "single_reflection",
           "BlockInputs", "block_inputs", "suffix_transitions", "chain_suffix_products"]


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
    Reflections [NB, H, C * R, *F] -> tokens [B, T, H, R, *F] (inverse of `ut_blocks`)."""
    if xb.shape[2] != lay.C:
        xb = xb.unflatten(2, (lay.C, -1))  # [NB, H, C, R, *F]
    return from_head_blocks(xb, lay).view(shape)


def num_reflections(w: torch.Tensor) -> int:
    """R, the reflections per token: 1 for w [B, T, H, D], w.shape[3] for w
    [B, T, H, R, D]."""
    return 1 if w.ndim == 4 else w.shape[3]


def single_reflection(w: torch.Tensor, beta: torch.Tensor):
    """(w, beta) with R = 1 given as [B, T, H, 1, D] and [B, T, H, 1] -> [B, T, H, D] and
    [B, T, H] (views; gradients flow back to the 5-D tensors): every backend then runs the
    one-reflection path. Other shapes are returned as they are."""
    if w.ndim == 5 and w.shape[3] == 1:
        return w.squeeze(3), beta.squeeze(3)
    return w, beta


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


def ut_blocks(q, k, w, beta, lay: BlockLayout, cd: torch.dtype):
    """The UT transform's inputs as blocks: qb [NB, H, Gr, C, D], kb and wb [NB, H, C, D],
    bb [NB, H, C]; with R reflections per token (w [B, T, H, R, D], beta [B, T, H, R])
    wb [NB, H, C * R, D] and bb [NB, H, C * R] (module docstring)."""
    H = k.shape[2]
    wb, bb = kv_blocks(w, lay, cd), kv_blocks(beta, lay, cd)
    if w.ndim == 5:  # [NB, H, C, R, D] -> [NB, H, C * R, D], reflection l = t * R + r
        wb, bb = wb.flatten(2, 3), bb.flatten(2, 3)
    return row_blocks(q, lay, H, cd), kv_blocks(k, lay, cd), wb, bb


class BlockInputs(NamedTuple):
    """Every op input as blocks (see `block_inputs`)."""

    qb: torch.Tensor  # [NB, H, Gr, C, D]
    kb: torch.Tensor  # [NB, H, C, D]
    wb: torch.Tensor  # [NB, H, C * R, D]
    bb: torch.Tensor  # [NB, H, C * R]
    vb: torch.Tensor  # [NB, H, C, Dv]
    gates: BlockGates | None

    @property
    def ut(self):
        """(qb, kb, wb, bb): the UT transform's arguments."""
        return self.qb, self.kb, self.wb, self.bb


def block_inputs(q, k, v, w, beta, g, lay: BlockLayout) -> BlockInputs:
    """Tokens q [B, T, HQ, D], k [B, T, H, D], w [B, T, H, D] or [B, T, H, R, D],
    v [B, T, H, Dv], beta [B, T, H] or [B, T, H, R], g [B, T, HQ] or None -> blocks in the
    compute dtype (gate sums in float64, `pathattn.ops.gates`)."""
    B, T, HQ, _ = q.shape
    H = k.shape[2]
    cd = compute_dtype(q.dtype)
    qb, kb, wb, bb = ut_blocks(q, k, w, beta, lay, cd)
    gates = None if g is None else block_gates(g.reshape(B * T, HQ), lay, H)
    return BlockInputs(qb, kb, wb, bb, kv_blocks(v, lay, cd), gates)


def chain_suffix_products(pt: torch.Tensor) -> torch.Tensor:
    """The same suffix products for a dense chain of blocks: pt [..., nb, D, D] (block b's
    row-form transition) -> R [..., nb, D, D] with R_b = Pt_{b+1}^T R_{b+1}, R_{nb-1} = I
    (`pathattn.ops.cache.key_transforms`)."""
    nb, D = pt.shape[-3], pt.shape[-1]
    R = torch.empty_like(pt)
    R[..., nb - 1, :, :] = torch.eye(D, dtype=pt.dtype, device=pt.device)
    for b in range(nb - 2, -1, -1):
        torch.matmul(pt[..., b + 1, :, :].mT, R[..., b + 1, :, :], out=R[..., b, :, :])
    return R


def suffix_transitions(lay: BlockLayout, pt: torch.Tensor) -> torch.Tensor:
    """R [NB, H, D, D] per block: the row-form transition of all later blocks of its
    sequence, R_l = Pt_{l+1}^T R_{l+1}, R_last = I (paper section 3.4, "reuse the suffix
    cumulative product"). pt [NB, H, D, D]; blocks in scan order."""
    NB, D = pt.shape[0], pt.shape[-1]
    R = torch.empty_like(pt)
    n1 = lay.counts[1] if lay.n_max > 1 else 0
    pred = lay.key_rows[1] if n1 else None  # pred[r]: row of the block before row r (r < n1)
    has_next = torch.zeros(NB, dtype=torch.bool, device=pt.device)
    if n1:
        has_next[pred] = True
    frontier = (~has_next).nonzero().squeeze(1)  # last block of every sequence
    R[frontier] = torch.eye(D, dtype=pt.dtype, device=pt.device)
    while True:
        frontier = frontier[frontier < n1]  # blocks that have a block before them
        if frontier.numel() == 0:
            return R
        prev = pred[frontier]
        R[prev] = pt[frontier].transpose(-1, -2) @ R[frontier]
        frontier = prev
