"""Tile helpers of the FoX kernels: the gate term of the logits. The generic tile helpers
(interpreter switch, strided tile loads, the product with 16-bit operands, rounding to 16
bits) live in `pathattn.ops.common.triton_tiles`, shared with the stick-breaking kernels,
and are imported here for the FoX kernels.

Logits are kept in base-2 units (scaled by log2(e)) so that the softmax uses exp2, and the
saved log-sum-exp is in the same units.

Gate term (docs/fox.md, "Exactness"): G is the per-sequence cumulative sum of the log
forget gates, held in float64. A tile of query rows i (its first token a) against keys j
forms G_i - G_j from float64 differences to the reference point G_a:

* keys before the query tile (j < a <= i): (G_i - G_a) and (G_a - G_j) are each rounded to
  float32 once; with g <= 0 both are <= 0, so their float32 sum is as exact as the float64
  difference rounded once, however large the gates between j and i. The second is itself
  (G_a - G_b1) - (G_j - G_b1) with b1 the key tile's last token: one float64 difference
  per tile pair and per-token float32 offsets read from memory (`key_gates`), so that no
  float64 arithmetic runs per key in the loops;
* the diagonal tile (a <= j <= i): both terms may be large with a small difference, so each
  relative term d = G - G_a is split into float32 hi + lo parts, (hi_i - hi_j) +
  (lo_i - lo_j): again the difference to float32 accuracy, on this one tile only.
"""

from __future__ import annotations

import triton.language as tl

from ...common.triton_tiles import (  # noqa: F401 - the kernels import them from here
    LOG2E,
    TL_DTYPE,
    dot,
    gate_ptrs,
    helper,
    interpreting,
    load_rows,
    rounded,
    store_rows,
)

__all__ = ["interpreting", "helper", "TL_DTYPE", "LOG2E"]


@helper
def load_gates(ptr, rows, rmask, HQ, hq, other):
    """G[rows, hq] of G [N, HQ] (float64); `other` where masked."""
    return tl.load(ptr + rows.to(tl.int64) * HQ + hq, mask=rmask, other=other)


@helper
def key_gates(G_ptr, ge_ptr, ks, Ga, HQ, hq, NTOK, BT: tl.constexpr):
    """(G_a - G_j) log2(e) [BT] float32 for the full key tile of tokens ks .. ks + BT - 1
    and the reference point G_a (float64) of a later query tile: (G_a - G_b1) - (G_j - G_b1)
    with b1 the key tile's last token, the second term read from the tile offsets ge
    [HQ, NTOK] (`pathattn.ops.common.token_blocks.block_gate_offsets`). With g <= 0 both
    are <= 0: one float64 difference per tile pair, none per key."""
    gab = (Ga - tl.load(G_ptr + tl.cast(ks + BT - 1, tl.int64) * HQ + hq)).to(tl.float32)
    ge = tl.load(gate_ptrs(ge_ptr, hq, NTOK, ks, tl.arange(0, BT)))
    return (gab - ge) * 1.4426950408889634


@helper
def split(d):
    """float64 d -> (hi, lo) float32 with hi + lo = d to about 2**-48 relative."""
    hi = d.to(tl.float32)
    return hi, (d - hi.to(tl.float64)).to(tl.float32)


@helper
def diagonal_gate(hi_i, lo_i, hi_j, lo_j):
    """(G_i - G_j) * log2(e) [len(i), len(j)] from the split relative terms of the rows i
    and columns j of the diagonal tile (module docstring)."""
    d = (hi_i[:, None] - hi_j[None, :]) + (lo_i[:, None] - lo_j[None, :])
    return d * 1.4426950408889634
