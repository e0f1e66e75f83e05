"""Row dot products of token tensors in one kernel: the backward's delta = rowsum(dO * O).

`row_dot(a, b, b_lo)` reads a and b (and b_lo) once in their own dtype and writes float32
sums; the PyTorch expression (a.float() * b.float()).sum(-1) makes three float32 copies
of [N, H, D] on the way. `row_dot_reference` is the float64 definition. This module
imports Triton (on CPU tensors the kernel runs under its interpreter).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_launch import launch_kernel
from .triton_tiles import interpreting, padded_dim

__all__ = ["row_dot", "row_dot_reference"]

# elements of a and of b per program: 64 rows at D = 64; the interpreter runs fewer,
# larger programs (its cost is per program)
_ELEMENTS = {False: 4096, True: 65536}


@triton.jit
def _row_dot_kernel(a_ptr, b_ptr, lo_ptr, out_ptr, n_rows, H, D, sa_n, sa_h, sa_d, sb_n,
                    sb_h, sb_d, sl_n, sl_h, sl_d, HAS_LO: tl.constexpr, ROWS: tl.constexpr,
                    BD: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BD).to(tl.int64)
    rmask = rows < n_rows
    mask = rmask[:, None] & (cols < D)[None, :]
    n, h = (rows // H).to(tl.int64), (rows % H).to(tl.int64)
    a = tl.load(a_ptr + (n * sa_n + h * sa_h)[:, None] + cols[None, :] * sa_d, mask=mask,
                other=0.0)
    b = tl.load(b_ptr + (n * sb_n + h * sb_h)[:, None] + cols[None, :] * sb_d, mask=mask,
                other=0.0).to(tl.float32)
    if HAS_LO:
        b += tl.load(lo_ptr + (n * sl_n + h * sl_h)[:, None] + cols[None, :] * sl_d,
                     mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows, tl.sum(a.to(tl.float32) * b, axis=1), mask=rmask)


def row_dot(a: torch.Tensor, b: torch.Tensor, b_lo: torch.Tensor | None = None
            ) -> torch.Tensor:
    """a, b (and b_lo, added to b in float32) [N, H, D], any strides and float dtypes ->
    float32 [N, H], sum_d a * (b + b_lo), products and sum in float32. ValueError when the
    shapes differ or are not 3-d."""
    for name, x in (("a", a), ("b", b), ("b_lo", b_lo)):
        if x is not None and (x.ndim != 3 or x.shape != a.shape):
            raise ValueError(f"row_dot: {name} must be [N, H, D] as a {tuple(a.shape)}, got "
                             f"{tuple(x.shape)}")
    N, H, D = a.shape
    out = torch.empty(N, H, dtype=torch.float32, device=a.device)
    if out.numel() == 0:
        return out
    BD = padded_dim(D)
    rows = max(1, _ELEMENTS[interpreting()] // BD)
    lo = b if b_lo is None else b_lo
    launch_kernel(_row_dot_kernel, (triton.cdiv(N * H, rows),))(
        a, b, lo, out, N * H, H, D, *a.stride(), *b.stride(), *lo.stride(),
        HAS_LO=b_lo is not None, ROWS=rows, BD=BD)
    return out


def row_dot_reference(a: torch.Tensor, b: torch.Tensor, b_lo: torch.Tensor | None = None
                      ) -> torch.Tensor:
    """`row_dot` in float64: [N, H]."""
    b = b.double() if b_lo is None else b.double() + b_lo.double()
    return (a.double() * b).sum(-1)
