"""Tile helpers of the FoX kernels: interpreter switch, strided tile loads, the product with
16-bit operands, rounding to 16 bits, and the gate term of the logits.

Logits are kept in base-2 units (scaled by log2(e)) so that the softmax uses exp2, and the
saved log-sum-exp is in the same units.

Gate term (docs/fox.md, "Exactness"): G is the per-sequence cumulative sum of the log
forget gates, held in float64. A tile of query rows i (its first token a) against keys j
forms G_i - G_j from float64 differences to the reference point G_a:

* keys before the query tile (j < a <= i): (G_i - G_a) and (G_a - G_j) are each rounded to
  float32 once; with g <= 0 both are <= 0, so their float32 sum is as exact as the float64
  difference rounded once, however large the gates between j and i;
* the diagonal tile (a <= j <= i): both terms may be large with a small difference, so each
  relative term d = G - G_a is split into float32 hi + lo parts, (hi_i - hi_j) +
  (lo_i - lo_j): again the difference to float32 accuracy, on this one tile only.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

__all__ = ["interpreting", "helper", "TL_DTYPE", "LOG2E"]

LOG2E = 1.4426950408889634
TL_DTYPE = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def interpreting() -> bool:
    """True when Triton runs its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def helper(fn):
    """A device function of the kernels: jitted for a GPU, a plain Python function under the
    interpreter (which would otherwise re-patch triton.language on every call of it)."""
    return fn if interpreting() else triton.jit(fn)


@helper
def load_rows(ptr, rows, rmask, stride_n, col0, cols, cmask):
    """x[rows, col0 + cols] in x's own dtype, zero where masked; rows index tokens (row
    stride stride_n), offsets in int64 (N * H * D can pass 2**31)."""
    offs = rows.to(tl.int64)[:, None] * stride_n + col0 + cols[None, :]
    return tl.load(ptr + offs, mask=rmask[:, None] & cmask[None, :], other=0.0)


@helper
def store_rows(ptr, x, rows, rmask, stride_n, col0, cols, cmask):
    """x[rows, col0 + cols] = x (tl.store casts to the pointer's dtype) where masked in."""
    offs = rows.to(tl.int64)[:, None] * stride_n + col0 + cols[None, :]
    tl.store(ptr + offs, x, mask=rmask[:, None] & cmask[None, :])


@helper
def load_gates(ptr, rows, rmask, HQ, hq, other):
    """G[rows, hq] of G [N, HQ] (float64); `other` where masked."""
    return tl.load(ptr + rows.to(tl.int64) * HQ + hq, mask=rmask, other=other)


@helper
def dot(a, b, PREC: tl.constexpr, EMULATE: tl.constexpr):
    """a @ b with float32 accumulation: 16-bit operands on the tensor cores, float32 ones at
    precision PREC. EMULATE (the interpreter, whose 16-bit dot is not IEEE) multiplies the
    16-bit values in float32, the same products exactly."""
    if EMULATE:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif a.dtype == tl.float32:
        return tl.dot(a, b, input_precision=PREC)
    else:
        return tl.dot(a, b)


@helper
def rounded(x, DT: tl.constexpr, EMULATE: tl.constexpr):
    """float32 x rounded to DT (to nearest, ties to even): the operand of a 16-bit product or
    a value to store. The interpreter's float32 -> bfloat16 cast truncates instead, so
    under EMULATE bfloat16 rounding is done on the bits (the result stays float32, holding
    a bfloat16 value, which the interpreter then converts exactly)."""
    if EMULATE and DT == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(DT)


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
