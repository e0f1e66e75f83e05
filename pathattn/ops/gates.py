"""Forget-gate bookkeeping for PaTH-FoX (paper section 2.2, "Extension: PaTH-FoX").

The gate adds G_i - G_j to logit(i, j), where G is the cumulative sum over time of the log
forget gates g within each sequence. The term is not multiplied by the softmax scale.

G can be large in magnitude (thousands on long sequences), so it is accumulated in float64
and only differences between nearby positions are cast to the compute dtype: relative to
ref_b, the value of G at the first token of block b,

    G_i - G_j = (G_i - ref_b) - (G_j - ref_b)     for key j in block b,

the column term gl_j = G_j - ref_b is a within-block quantity, and the row term
G_i - ref_b is formed in float64 for each (query block, key block) pair.

Gradient: each softmax row sums to one, so the row term's gradient (the row sum of dS) is
identically zero; hence dL/dG_j = -(column sum of dS at key j) and
dL/dg_t = sum_{s >= t} dL/dG_s within the sequence.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .layout import BlockLayout

__all__ = ["BlockGates", "block_gates", "gate_grad"]


class BlockGates(NamedTuple):
    G: torch.Tensor  # [NB, H, Gr, C] float64, G at every slot (padding repeats the last value)
    ref: torch.Tensor  # [NB, H, Gr] float64, G at each block's first slot
    gl: torch.Tensor  # [NB, H, Gr, C] compute dtype, G - ref (within-block)


def block_gates(g: torch.Tensor, lay: BlockLayout, H: int, dtype: torch.dtype) -> BlockGates:
    """g [B * T, HQ] (log forget gates, tokens flattened) -> BlockGates."""
    HQ = g.shape[-1]
    cs = torch.cat([g.new_zeros(1, HQ, dtype=torch.float64), g.to(torch.float64).cumsum(0)])
    G_tok = cs[1:] - cs.index_select(0, lay.token_seq_start)  # [B*T, HQ], restarts per sequence
    G = G_tok.index_select(0, lay.slot_source).view(lay.NB, lay.C, H, HQ // H)
    G = G.permute(0, 2, 3, 1).contiguous()  # [NB, H, Gr, C]
    ref = G[..., 0]
    return BlockGates(G=G, ref=ref, gl=(G - ref[..., None]).to(dtype))


def gate_grad(dcol: torch.Tensor, lay: BlockLayout) -> torch.Tensor:
    """Column sums of dS [NB, H, Gr, C] -> dL/dg over tokens [B * T, HQ] (float64)."""
    NB, H, Gr, C = dcol.shape
    slots = dcol.to(torch.float64).permute(0, 3, 1, 2).reshape(NB * C, H * Gr)  # [NB*C, HQ]
    dG = -slots.index_select(0, lay.token_slot)  # [B*T, HQ]
    suffix = dG.flip(0).cumsum(0).flip(0)  # sum over s >= t along the whole flat axis
    suffix = torch.cat([suffix, suffix.new_zeros(1, H * Gr)], dim=0)
    return suffix[:-1] - suffix.index_select(0, lay.token_seq_end)
