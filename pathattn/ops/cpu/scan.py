"""Forward and backward scans on the CPU: the fused kernels (scan_fwd.cpp, scan_bwd.cpp) when
they are available, the PyTorch scans (`blockwise.forward_scan`, `blockwise.backward_scan`)
otherwise. Same arguments, same results."""

from __future__ import annotations

import torch

from ..blockwise import ScanGrads, backward_scan, block_growth, forward_scan
from ..gates import BlockGates
from ..layout import BlockLayout
from ..ut import BlockUT
from .build import load_kernels

__all__ = ["scan_forward", "scan_backward", "fused_forward_scan", "fused_backward_scan",
           "predecessors", "fused_scan_applies"]


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


def fused_forward_scan(lay: BlockLayout, qt, kt, pt, s_diag, vb, gates: BlockGates | None):
    """The fused kernel. Shapes as `forward_scan`; s_diag is only read. Returns o [NB, H, R,
    Dv] and lse [NB, H, R]."""
    return torch.ops.pathattn_cpu.scan_fwd(*_kernel_args(lay, qt, kt, pt, s_diag, vb, gates))


def _kernel_args(lay, qt, kt, pt, s_diag, vb, gates):
    G = None if gates is None else gates.G.contiguous()
    return (qt.contiguous(), kt.contiguous(), pt.contiguous(), s_diag.contiguous(),
            vb.contiguous(), predecessors(lay), G)


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
                        do, lse, delta) -> ScanGrads:
    """The fused backward kernel. Arguments and result as `blockwise.backward_scan`;
    s_diag is only read."""
    dt = qt.dtype
    dqt, dkt, dpt, ds_diag, dv, dcol = torch.ops.pathattn_cpu.scan_bwd(
        *_kernel_args(lay, qt, kt, pt, s_diag, vb, gates), do.to(dt).contiguous(),
        lse.to(dt).contiguous(), delta.to(dt).contiguous())
    return ScanGrads(dqt, dkt, dpt, ds_diag, dv, None if gates is None else dcol)


def scan_backward(lay: BlockLayout, qt, kt, pt, s_diag, vb, gates: BlockGates | None,
                  do, lse, delta, kernels: bool = True) -> ScanGrads:
    """`blockwise.backward_scan` (same arguments and outputs), run by the fused CPU kernel
    where it applies (`fused_scan_applies`)."""
    if fused_scan_applies(qt, kernels):
        return fused_backward_scan(lay, qt, kt, pt, s_diag, vb, gates, do, lse, delta)
    return backward_scan(lay, qt, kt, pt, s_diag, vb, gates, do, lse, delta)
