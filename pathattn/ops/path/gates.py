"""Forget-gate bookkeeping for PaTH-FoX (paper section 2.2, "Extension: PaTH-FoX").

The gate adds G_i - G_j to logit(i, j), where G is the cumulative sum over time of the log
forget gates g within each sequence. The term is not multiplied by the softmax scale.

Two choices keep the term exact:

* Sequences never share a sum. G restarts at every sequence (batch row or packed segment)
  by a segmented scan that only ever adds values of the same sequence: a huge or
  non-finite gate in one sequence cannot reach another through rounding, inf - inf or NaN.
  (Subtracting a running sum over the whole flattened batch would.)
* G is accumulated in float64 and every logit's term G_i - G_j is formed in float64 before
  it is cast to the compute dtype, in every tile. Taking differences of values cast to
  float32 instead would lose the term near the query whenever a large gate lies between
  the block's reference point and the key (a gate of -1e6 costs 0.06 absolute in float32).
  The Triton kernels keep float64 out of their block-pair loops with reference points on
  either side of the gap (`pathattn.ops.common.token_blocks.block_gate_offsets`).

Gradient: each softmax row sums to one, so the row term's gradient (the row sum of dS) is
identically zero; hence dL/dG_j = -(column sum of dS at key j) and
dL/dg_t = sum_{s >= t} dL/dG_s within the sequence (a segmented suffix sum).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..common.layout import BlockLayout

__all__ = ["BlockGates", "block_gates", "gate_grad", "sequence_cumsum"]


class BlockGates(NamedTuple):
    G: torch.Tensor  # [NB, H, Gr, C] float64, G at every slot (padding repeats the last value)


def sequence_cumsum(x: torch.Tensor, seq_start: torch.Tensor, seq_end: torch.Tensor,
                    reverse: bool = False, row_length: int | None = None,
                    longest: int | None = None) -> torch.Tensor:
    """Inclusive cumulative sum of x [N, *F] along the token axis, restarting at every
    sequence (prefix sums; with reverse=True suffix sums, sum over s >= t).

    seq_start, seq_end [N] int64: first token and one past the last token of each token's
    sequence (`BlockLayout.token_seq_start`, `token_seq_end`). row_length: T when the
    sequences are the rows of a dense [B, T] batch (one cumsum along T). Otherwise a
    Hillis-Steele scan of ceil(log2(longest)) passes (longest: an upper bound of the
    sequence lengths, default N) in which every addition reads the same sequence only.
    Neither case reads values back to the host.
    """
    N = x.shape[0]
    if row_length is not None and N % max(row_length, 1) == 0:
        rows = x.reshape((N // max(row_length, 1), row_length) + tuple(x.shape[1:]))
        if reverse:
            return rows.flip(1).cumsum(1).flip(1).reshape(x.shape)
        return rows.cumsum(1).reshape(x.shape)
    out = x.clone()
    idx = torch.arange(N, device=x.device)
    keep = (N,) + (1,) * (x.dim() - 1)
    shift, longest = 1, N if longest is None else longest
    while shift < longest:
        if reverse:
            src = idx + shift
            ok = src < seq_end
        else:
            src = idx - shift
            ok = src >= seq_start
        add = out.index_select(0, src.clamp(0, max(N - 1, 0)))
        out = out + add.masked_fill(~ok.view(keep), 0)
        shift *= 2
    return out


def block_gates(g: torch.Tensor, lay: BlockLayout, H: int) -> BlockGates:
    """g [B * T, HQ] (log forget gates, tokens flattened) -> BlockGates."""
    HQ = g.shape[-1]
    G_tok = sequence_cumsum(g.to(torch.float64), lay.token_seq_start, lay.token_seq_end,
                            row_length=lay.row_length, longest=lay.n_max * lay.C)
    G = G_tok.index_select(0, lay.slot_source).view(lay.NB, lay.C, H, HQ // H)
    return BlockGates(G=G.permute(0, 2, 3, 1).contiguous())  # [NB, H, Gr, C]


def gate_grad(dcol: torch.Tensor, lay: BlockLayout) -> torch.Tensor:
    """Column sums of dS [NB, H, Gr, C] -> dL/dg over tokens [B * T, HQ] (float64)."""
    NB, H, Gr, C = dcol.shape
    slots = dcol.to(torch.float64).permute(0, 3, 1, 2).reshape(NB * C, H * Gr)  # [NB*C, HQ]
    dG = -slots.index_select(0, lay.token_slot)  # [B*T, HQ]
    return sequence_cumsum(dG, lay.token_seq_start, lay.token_seq_end, reverse=True,
                           row_length=lay.row_length, longest=lay.n_max * lay.C)

