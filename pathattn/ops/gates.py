"""Forget-gate bookkeeping for PaTH-FoX (paper section 2.2, "Extension: PaTH-FoX").

The gate adds G_i - G_j to logit(i, j), where G is the cumulative sum over time of the log
forget gates g (within each sequence). The term is not multiplied by the softmax scale.

G can be large in magnitude (thousands on long sequences), so it is accumulated in float64
and only differences between nearby positions are cast to the compute dtype: relative to
ref_b, the value of G at the first token of block b,

    G_i - G_j = (G_i - ref_b) - (G_j - ref_b)     for key j in block b,

the column term gl_j = G_j - ref_b is a within-block quantity, and the row term
G_i - ref_b is formed in float64 for each (query block, key block) pair.

Gradient: since each softmax row sums to one, the row term's gradient, the row sum of dS,
is identically zero, so dL/dG_j = -(column sum of dS at key j) and dL/dg_t = sum_{s >= t}
dL/dG_s within the sequence.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .layout import BlockLayout, to_blocks

__all__ = ["BlockGates", "block_gates", "gate_grad"]


class BlockGates(NamedTuple):
    G: torch.Tensor  # [NB, H, G, C] float64, G at every slot (padding repeats the last value)
    ref: torch.Tensor  # [NB, H, G] float64, G at each block's first slot
    gl: torch.Tensor  # [NB, H, G, C] compute dtype, G - ref (within-block)


def block_gates(g: torch.Tensor, lay: BlockLayout, H: int, dtype: torch.dtype) -> BlockGates:
    """g [B * T, HQ] (log forget gates, tokens flattened) -> BlockGates."""
    HQ = g.shape[-1]
    gb = to_blocks(g.to(torch.float64), lay)  # [NB, C, HQ]
    G_loc = gb.cumsum(dim=1)  # [NB, C, HQ] relative to the end of the previous block
    block_sum = G_loc[:, -1]  # [NB, HQ]
    before = block_sum.cumsum(dim=0) - block_sum  # exclusive cumsum over all blocks
    offset = before - before.index_select(0, lay.seq_first_block)  # restart at each sequence
    G = (G_loc + offset[:, None]).permute(0, 2, 1).reshape(lay.NB, H, HQ // H, lay.C)
    ref = G[..., 0]
    return BlockGates(G=G, ref=ref, gl=(G - ref[..., None]).to(dtype))


def gate_grad(dcol: torch.Tensor, lay: BlockLayout) -> torch.Tensor:
    """Column sums of dS [NB, H, G, C] -> dL/dg over tokens [B * T, HQ] (float64)."""
    NB, H, Gr, C = dcol.shape
    slots = dcol.to(torch.float64).reshape(NB, H * Gr, C).permute(0, 2, 1)  # [NB, C, HQ]
    dG = -slots.reshape(NB * C, H * Gr).index_select(0, lay.token_slot)  # [B*T, HQ]
    suffix = dG.flip(0).cumsum(0).flip(0)  # sum over s >= t of the whole flat axis
    suffix = torch.cat([suffix, suffix.new_zeros(1, H * Gr)], dim=0)
    return suffix[:-1] - suffix.index_select(0, lay.token_seq_end)
