"""Public stages of the blockwise pipeline (paper section 3.3), shared by the op
(`pathattn.ops.path.function`), the inference prefill and context parallelism:

    tokens [B, T, ...] --block_inputs--> block tensors --UT--> scan --rows_to_tokens /
    kv_tokens--> tokens

Block tensors are those of `pathattn.ops.common.heads`: keys, values, w, beta per
key/value head [NB, H, C, ...]; queries and outputs per key/value head and group of query
heads [NB, H, Gr, C, ...].

Several reflections per token (w [B, T, H, R, D], beta [B, T, H, R]): the block holds the
C * R reflections in order, wb [NB, H, C * R, D] and bb [NB, H, C * R], reflection
l = t * R + r of the block's token t (H_t = H_{t,1} ... H_{t,R}). The UT transform
(`pathattn.ops.path.ut`) reads R from these shapes; nothing after it depends on R.

Also decided here, once: the suffix products of block transitions (`suffix_transitions`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..common.heads import compute_dtype, kv_blocks, row_blocks
from ..common.layout import BlockLayout
from .gates import BlockGates, block_gates

__all__ = ["ut_blocks", "num_reflections", "single_reflection", "BlockInputs", "block_inputs",
           "suffix_transitions", "chain_suffix_products"]


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
    compute dtype (gate sums in float64, `pathattn.ops.path.gates`)."""
    B, T, HQ, _ = q.shape
    H = k.shape[2]
    cd = compute_dtype(q.dtype)
    qb, kb, wb, bb = ut_blocks(q, k, w, beta, lay, cd)
    gates = None if g is None else block_gates(g.reshape(B * T, HQ), lay, H)
    return BlockInputs(qb, kb, wb, bb, kv_blocks(v, lay, cd), gates)


def chain_suffix_products(pt: torch.Tensor) -> torch.Tensor:
    """The same suffix products for a dense chain of blocks: pt [..., nb, D, D] (block b's
    row-form transition) -> R [..., nb, D, D] with R_b = Pt_{b+1}^T R_{b+1}, R_{nb-1} = I
    (`pathattn.ops.path.cache.key_transforms`)."""
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
