"""Shared pieces of the Triton kernels: block table, tile loads, matrix products.

Token-major layout: every kernel sees the batch flattened to N = B * T tokens, q [N, HQ, D],
k [N, H, D], v [N, H, Dv] (contiguous), and a dense batch is the packed batch with
boundaries 0, T, 2T, ... . Blocks of BT tokens start at each sequence's first token, so only
a sequence's last block can be partial and no block straddles two sequences.

Reflections: with R per token, w [N * R, H, D] and beta [N * R, H] hold reflection r of
token t in row t * R + r (R = 1: one row per token), and so do the per-reflection work
buffers (U, M and their gradients). A block's BT * R reflections are handled as one tile of
BTR = next power of two rows; the rows past BT * R (R not a power of two) are masked and
load as w = 0, beta = 0, identities that change nothing. Reflection l of a block belongs to
its token l // R (`reflection_tokens`).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ...common.triton_tiles import gate_ptrs  # noqa: F401 - the scans import it from here

__all__ = ["block_table", "interpreting", "tile_kwargs", "reflection_tile", "device_fn",
           "tile_offsets", "row_offsets", "e_offsets", "transition_dtype"]


def interpreting() -> bool:
    """True when Triton runs its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def device_fn(fn):
    """`triton.jit` for the device functions the kernels call. Under the interpreter they stay
    plain Python functions (the kernel's body already runs as Python with triton.language
    patched): the interpreter re-patches triton.language on every call of a jitted device
    function, which made the CPU tests several times slower."""
    return fn if interpreting() else triton.jit(fn)


def block_table(B: int, T: int, cu_seqlens: torch.Tensor | None, BT: int,
                device: torch.device) -> tuple[torch.Tensor, int]:
    """Blocks of BT tokens over the flattened batch, built on the device (no value is read
    back to the host, so a call does not wait for the GPU).

    Returns (table, n_max): table int32 [NB, 3] with each block's first token, its
    sequence's first token and one past its sequence's last token, blocks of a sequence in
    consecutive rows, left to right; n_max an upper bound of the blocks of one sequence.
    With cu_seqlens, NB is an upper bound too, cdiv(B * T, BT) + N: the rows past the last
    block are empty (all three 0), and the kernels skip them.
    """
    if cu_seqlens is None:
        nb = -(-T // BT)
        blk = torch.arange(B * nb, device=device)
        s0 = blk // nb * T
        table = torch.stack([s0 + blk % nb * BT, s0, s0 + T], dim=1)  # [NB, 3]
        return table.to(torch.int32), nb
    cu = cu_seqlens.to(device=device, dtype=torch.int64)
    n_blocks = (cu[1:] - cu[:-1] + BT - 1) // BT  # [N_seq]
    ends = n_blocks.cumsum(0)  # one past each sequence's last table row
    rows = -(-(B * T) // BT) + n_blocks.shape[0]
    blk = torch.arange(rows, device=device)
    seq = torch.searchsorted(ends, blk, right=True).clamp_(max=n_blocks.shape[0] - 1)
    s0, s1 = cu[seq], cu[seq + 1]
    table = torch.stack([s0 + (blk - ends[seq] + n_blocks[seq]) * BT, s0, s1], dim=1)
    table = torch.where((blk < ends[-1])[:, None], table, 0)  # [NB, 3]
    return table.to(torch.int32), -(-(B * T) // BT)


def transition_dtype(dtype: torch.dtype) -> torch.dtype:
    """Operand dtype of the products with the transitions (W, U and the states they move):
    float16 for 16-bit inputs (its 10-bit mantissa; |w| <= 1 keeps W and U in range),
    float32 for float32 inputs."""
    return torch.float32 if dtype == torch.float32 else torch.float16


def tile_kwargs(D: int, Dv: int) -> dict:
    """Padded (power of two, at least 16) head dims of the kernels."""
    return {"BD": max(16, triton.next_power_of_2(D)), "BDV": max(16, triton.next_power_of_2(Dv))}


def reflection_tile(BT: int, R: int) -> int:
    """BTR: rows of the tile holding the BT * R reflections of a block (a power of two)."""
    return triton.next_power_of_2(BT * R)


# Offsets that grow with the number of tokens are formed in int64: B * T * H * D elements
# pass 2**31 long before the token count does (e.g. 2**24 tokens x 8 heads x 16 dims), and an
# int32 product would wrap around. Every token-indexed load and store of the kernels goes
# through these three helpers.


@device_fn
def tile_offsets(rows, stride, col0, cols):
    """int64 offsets of x[rows, col0 + cols] ([R, C]); stride is the row stride."""
    return rows.to(tl.int64)[:, None] * stride + col0 + cols[None, :]


@device_fn
def row_offsets(rows, stride, col):
    """int64 offsets of x[rows, col] ([R]), e.g. beta [N, H] or lse [N, HQ]."""
    return rows.to(tl.int64) * stride + col


@device_fn
def e_offsets(blk, h, H, rows, cols, BD: tl.constexpr):
    """int64 offsets of E[blk, h, rows, cols] in the segment products [NB, H, BD, BD]."""
    return (blk * H + h).to(tl.int64) * BD * BD + rows[:, None] * BD + cols[None, :]


@device_fn
def e_ptrs(ptr, blk, h, H, rows, cols, BD: tl.constexpr):
    """Pointers of E[blk, h, rows, cols] as `e_offsets` places it: one int64 base and int32
    offsets inside the tile (fewer registers, as `block_ptrs`)."""
    return (ptr + (blk * H + h).to(tl.int64) * BD * BD) + (rows[:, None] * BD + cols[None, :])


@device_fn
def load_tile(ptr, rows, rmask, stride, col0, cols, cmask):
    """x[rows, col0 + cols] as float32 (zero where masked); stride is the row stride."""
    return load_raw(ptr, rows, rmask, stride, col0, cols, cmask).to(tl.float32)


@device_fn
def exp_ftz(x):
    """exp(x) as exp2(x log2(e)): Triton lowers tl.exp2 to one flush-to-zero ex2
    instruction, tl.exp to one that keeps subnormal results, which ptxas wraps in a
    compare and two predicated multiplies per element. Results below 2**-126 are 0 here
    (probabilities that small do not change a float32 sum)."""
    return tl.exp2(x * 1.4426950408889634)


@device_fn
def finite_or_zero(x):
    """x with every NaN and inf entry replaced by 0 (NaN fails the comparison too): the
    kernels read the inputs' non-finite entries as 0 (`Backend.sanitizes`)."""
    return tl.where(tl.abs(x) < float("inf"), x, 0.0)


@device_fn
def load_input(ptr, rows, rmask, stride, col0, cols, cmask):
    """`load_raw` of an input of the op (q, k, v, w), its non-finite entries read as 0."""
    return finite_or_zero(load_raw(ptr, rows, rmask, stride, col0, cols, cmask))


@device_fn
def load_raw(ptr, rows, rmask, stride, col0, cols, cmask):
    """x[rows, col0 + cols] in x's own dtype (zero where masked): operands of 16-bit
    products stay 16-bit."""
    offs = tile_offsets(rows, stride, col0, cols)
    return tl.load(ptr + offs, mask=rmask[:, None] & cmask[None, :], other=0.0)


@device_fn
def block_ptrs(ptr, r0, lr, stride, col0, cols):
    """Pointers of x[r0 + lr, col0 + cols] ([R, C]) for a scalar first row r0: one int64
    base and int32 offsets inside the tile (fewer registers than `tile_ptrs`)."""
    return (ptr + (r0.to(tl.int64) * stride + col0)) + (lr[:, None] * stride + cols[None, :])


@device_fn
def load_block(ptr, r0, BT: tl.constexpr, stride, col0, cols, cmask):
    """x[r0 .. r0 + BT - 1, col0 + cols] of a full block starting at the scalar row r0, in
    x's dtype (zero past cmask): one int64 base and loop-invariant int32 offsets, so a loop
    over blocks computes one address per block instead of one per element."""
    return tl.load(block_ptrs(ptr, r0, tl.arange(0, BT), stride, col0, cols),
                   mask=cmask[None, :], other=0.0)


@device_fn
def tile_ptrs(ptr, rows, stride, col0, cols):
    """Pointers of x[rows, col0 + cols]."""
    return ptr + tile_offsets(rows, stride, col0, cols)


@device_fn
def mm(a, b, PREC: tl.constexpr):
    """float32 product a @ b (PREC "ieee", or "tf32" for low precision inputs)."""
    return tl.dot(a, b, input_precision=PREC)


@device_fn
def mm_lp(a, b, DT: tl.constexpr, PREC: tl.constexpr, EMULATE: tl.constexpr):
    """a @ b with operands rounded to DT (the input dtype: tensor cores for bf16 / fp16),
    float32 accumulation. EMULATE (interpreter) rounds and multiplies in float32: the
    interpreter's bf16 dot multiplies raw bits."""
    if DT == tl.float32:
        return tl.dot(a, b, input_precision=PREC)
    elif EMULATE:
        return tl.dot(a.to(DT).to(tl.float32), b.to(DT).to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a.to(DT), b.to(DT))


@device_fn
def block_reflections(t0, s1, BT: tl.constexpr, R: tl.constexpr, BTR: tl.constexpr):
    """Rows of the reflections of the block starting at token t0 ([BTR], rows of w [N * R,
    H, D]) and their mask (the sequence ends at token s1; the block may be partial)."""
    lr = tl.arange(0, BTR)
    if R == 1:
        rows = t0 + lr
        mask = rows < s1
    elif BT * R == BTR:
        rows = t0 * R + lr
        mask = rows < s1 * R
    else:
        rows = t0 * R + lr
        mask = (lr < BT * R) & (rows < s1 * R)
    return rows, mask


@device_fn
def full_block_reflections(tb, BT: tl.constexpr, R: tl.constexpr, BTR: tl.constexpr):
    """`block_reflections` of a full block starting at token tb (every key block before
    the query block is full): the rows and their mask (all true but the padding)."""
    lr = tl.arange(0, BTR)
    if R == 1:
        rows = tb + lr
        mask = rows >= 0
    elif BT * R == BTR:
        rows = tb * R + lr
        mask = rows >= 0
    else:
        rows = tb * R + lr
        mask = lr < BT * R
    return rows, mask


@device_fn
def reflection_tokens(R: tl.constexpr, BTR: tl.constexpr):
    """Token of each reflection of a block ([BTR]): l // R (BT and beyond for padding)."""
    lr = tl.arange(0, BTR)
    if R != 1:
        lr = lr // R
    return lr
