"""Forward and backward scans on the CPU: the fused kernels (scan_fwd.cpp, scan_bwd.cpp) when
they are available, the PyTorch scans (`blockwise.forward_scan`, `blockwise.backward_scan`)
otherwise. Same arguments, same results."""

from __future__ import annotations

import math

import torch

from ...common.layout import BlockLayout
from ..blockwise import ScanGrads, backward_scan, block_growth, forward_scan
from ..gates import BlockGates
from ..ut import BlockUT
from .build import load_kernels

__all__ = ["scan_forward", "scan_backward", "fused_forward_scan", "fused_backward_scan",
           "fused_token_scan", "fused_token_backward_scan",
           "predecessors", "fused_scan_applies", "scan_group", "kernel_block_size",
           "LONG_BLOCK_FROM"]

# Largest logit tile [R, group * C] the kernels aim for, in entries: 768 KiB of float32.
_GROUP_TILE = 3 * 65536
# The fused kernels' default block: 256 tokens from this sequence length on, else 128.
LONG_BLOCK_FROM = 4096


def kernel_block_size(longest: int, q_per_kv: int = 1) -> int:
    """Default block size of the fused CPU kernels for a longest sequence of `longest`
    tokens and q_per_kv query heads per key/value head: 256 from LONG_BLOCK_FROM tokens on
    without grouped queries, else 128. Larger blocks halve the scans' state updates ([D, D]
    products per key block) and cost more in the UT transform and the diagonal blocks,
    whose work per token grows with C. Measured on 2 cores at T = 4096, D = 64, 8 query
    heads (`benchmarks/bench_path_attn_cpu.py --block-size`): with 8 key heads, 256 is
    faster forward (149 against 156 ms) and forward + backward (541-552 against 558-568
    ms), and at T = 8192 too; below 4096 tokens 128 is as fast or faster; with 4 key heads
    (a task's logit tiles twice as tall) 256 is 2 % faster forward and 3 %
    slower forward + backward, with 2 key heads 4 % slower forward + backward."""
    return 256 if longest >= LONG_BLOCK_FROM and q_per_kv == 1 else 128


def predecessors(lay: BlockLayout) -> torch.Tensor:
    """pred [NB] int64: the scan row of the block just before each block in its sequence,
    -1 for a sequence's first block."""
    pred = torch.full((lay.NB,), -1, dtype=torch.long)
    if lay.n_max > 1:
        pred[: lay.counts[1]] = lay.key_rows[1].to("cpu", torch.long)
    return pred


def fused_scan_applies(qt: torch.Tensor, kernels: bool = True) -> bool:
    """True when the fused kernel handles these block tensors: kernels allowed (the "cpu"
    backend; "torch" passes False), CPU, float32 / float64, kernel built."""
    return (kernels and qt.device.type == "cpu"
            and qt.dtype in (torch.float32, torch.float64) and load_kernels())


def scan_group(R: int, C: int, n_max: int) -> int:
    """Key blocks per step of the fused scans for R query rows, blocks of C keys and
    sequences of at most n_max blocks. Each step moves the query state past all its g
    blocks with one [D, D] product, so that the state updates cost n^2 / (2 g) products
    per sequence of n blocks, while the group tiles cost about g products per block: the
    sum is least at g = sqrt(n / 2). That, rounded, within [2, 4], and at most what keeps
    the step's [R, g C] logit tile within 3 * 2^16 entries (768 KiB of float32)."""
    best = round(math.sqrt(max(n_max, 1) / 2))
    return max(2, min(4, best, _GROUP_TILE // max(1, R * C)))


def fused_forward_scan(lay: BlockLayout, qt, kt, pt, s_diag, vb, gates: BlockGates | None,
                       group: int | None = None):
    """The fused kernel. Shapes as `forward_scan`; s_diag is only read; group: key blocks
    per step (default `scan_group`; any value in [1, 8] gives the same numbers up to
    rounding). Returns o [NB, H, R, Dv] and lse [NB, H, R]."""
    return torch.ops.pathattn_cpu.scan_fwd(*_kernel_args(lay, qt, kt, pt, s_diag, vb, gates),
                                           _group(lay, qt, kt, group))


def fused_token_scan(lay: BlockLayout, start: torch.Tensor, qt, kt, pt, s_diag, v,
                     gates: BlockGates | None, group: int | None = None):
    """`fused_forward_scan` reading the values from, and writing its outputs to, token
    tensors: v [N, H, Dv] (unit stride along Dv); start [NB] int64, block n holding tokens
    [start[n], start[n] + C) (`pathattn.ops.common.layout.block_starts`). Returns o [N, HQ, Dv]
    and lse [N, HQ] (HQ = H * R / C, query head h * Gr + g), the same numbers as
    `fused_forward_scan` of those blocks."""
    return torch.ops.pathattn_cpu.scan_fwd_tokens(
        *_kernel_args(lay, qt, kt, pt, s_diag, v, gates, start), _group(lay, qt, kt, group))


def _group(lay, qt, kt, group):
    return scan_group(qt.shape[2], kt.shape[2], lay.n_max) if group is None else group


def _kernel_args(lay, qt, kt, pt, s_diag, vb, gates, start=None):
    """The scan kernels' common arguments: block values vb made contiguous, or (start given)
    token values vb [N, H, Dv] as they are, followed by start."""
    G = None if gates is None else gates.G.contiguous()
    values = (vb.contiguous(),) if start is None else (vb, start)
    return (qt.contiguous(), kt.contiguous(), pt.contiguous(), s_diag.contiguous(),
            *values, predecessors(lay), G)


def scan_forward(lay: BlockLayout, ut: BlockUT, vb, gates: BlockGates | None, wb, bb,
                 kernels: bool = True):
    """`blockwise.forward_scan` of the UT quantities `ut`, run by the fused CPU kernel where
    it applies (`fused_scan_applies`). wb [NB, H, C, D] and bb [NB, H, C] give the PyTorch
    scan its norm bounds (`block_growth`; the kernel needs none). Returns o [NB, H, R, Dv]
    and lse [NB, H, R]."""
    if fused_scan_applies(ut.qt, kernels):
        return fused_forward_scan(lay, ut.qt, ut.kt, ut.pt, ut.s_diag, vb, gates)
    return forward_scan(lay, ut.qt, ut.kt, ut.pt, ut.s_diag, vb, gates, block_growth(wb, bb))


def fused_backward_scan(lay: BlockLayout, qt, kt, pt, s_diag, vb, gates: BlockGates | None,
                        do, lse, delta, group: int | None = None) -> ScanGrads:
    """The fused backward kernel. Arguments and result as `blockwise.backward_scan`;
    s_diag is only read; group as `fused_forward_scan`."""
    dt = qt.dtype
    dqt, dkt, dpt, ds_diag, dv, dcol = torch.ops.pathattn_cpu.scan_bwd(
        *_kernel_args(lay, qt, kt, pt, s_diag, vb, gates), do.to(dt).contiguous(),
        lse.to(dt).contiguous(), delta.to(dt).contiguous(), _group(lay, qt, kt, group))
    return ScanGrads(dqt, dkt, dpt, ds_diag, dv, None if gates is None else dcol)


def fused_token_backward_scan(lay: BlockLayout, start: torch.Tensor, qt, kt, pt, s_diag, v,
                              gates: BlockGates | None, do, lse, delta,
                              group: int | None = None) -> ScanGrads:
    """`fused_backward_scan` with token tensors, as `fused_token_scan`: v [N, H, Dv],
    do [N, HQ, Dv], lse and delta [N, HQ] (unit stride along the last dim), start [NB]
    int64. Returns `ScanGrads` whose dv is token values [N, H, Dv] (the other fields block
    tensors, as `fused_backward_scan`'s)."""
    dt = qt.dtype
    dqt, dkt, dpt, ds_diag, dv, dcol = torch.ops.pathattn_cpu.scan_bwd_tokens(
        *_kernel_args(lay, qt, kt, pt, s_diag, v, gates, start), do.to(dt),
        lse.to(dt).contiguous(), delta.to(dt).contiguous(), _group(lay, qt, kt, group))
    return ScanGrads(dqt, dkt, dpt, ds_diag, dv, None if gates is None else dcol)


def scan_backward(lay: BlockLayout, qt, kt, pt, s_diag, vb, gates: BlockGates | None,
                  do, lse, delta, kernels: bool = True) -> ScanGrads:
    """`blockwise.backward_scan` (same arguments and outputs), run by the fused CPU kernel
    where it applies (`fused_scan_applies`)."""
    if fused_scan_applies(qt, kernels):
        return fused_backward_scan(lay, qt, kt, pt, s_diag, vb, gates, do, lse, delta)
    return backward_scan(lay, qt, kt, pt, s_diag, vb, gates, do, lse, delta)
