"""Tile helpers shared by the Triton kernels of the FoX and stick-breaking ops: the
interpreter switch, strided tile loads and stores over the flattened token axis, the
product with 16-bit operands and float32 accumulation, and rounding to 16 bits; and the
gate offsets' pointers, which the PaTH kernels use too.

This module imports Triton; the ops import it only from their `triton` packages, on first
use of a kernel. On CPU tensors the kernels run under Triton's interpreter
(TRITON_INTERPRET=1, set before Triton is imported).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

__all__ = ["interpreting", "helper", "load_rows", "store_rows", "gate_ptrs", "dot", "rounded",
           "TL_DTYPE", "LOG2E", "padded_dim"]

LOG2E = 1.4426950408889634
TL_DTYPE = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def interpreting() -> bool:
    """True when Triton runs its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def padded_dim(D: int) -> int:
    """A kernel's tile width for head dim D: the next power of two, at least 16."""
    return max(16, 1 << (max(D, 1) - 1).bit_length())


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
def gate_ptrs(ptr, hq, NTOK, r0, lr):
    """Pointers of x[hq, r0 + lr] of a head-major [HQ, NTOK] array (the gate offsets of
    `token_blocks.block_gate_offsets`) for a scalar first token r0."""
    return ptr + (hq.to(tl.int64) * NTOK + r0) + lr


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
