"""Public stick-breaking attention op (Tan et al. 2024, "Scaling Stick-Breaking Attention"),
a baseline beside PaTH attention."""

from __future__ import annotations

import torch

from ..common.heads import default_scale
from ..common.validation import check_block_size
from . import triton as sb_triton
from .function import sb_attention
from .validation import check_sb_attn_inputs

__all__ = ["sb_attn", "BACKENDS", "select_backend"]

BACKENDS = ("triton", "blockwise")


def select_backend(backend: str, q: torch.Tensor) -> str:
    """The backend that runs q for `backend`: "auto" picks "triton" for CUDA tensors of 16 or
    32 bits when Triton is installed, else "blockwise" (the PyTorch implementation, any
    device and dtype). ValueError for an unknown name, or "triton" on inputs it cannot
    run."""
    if backend not in ("auto",) + BACKENDS:
        raise ValueError(f"backend must be one of {('auto',) + BACKENDS}, got {backend!r}")
    fits = q.dtype != torch.float64 and sb_triton.available()
    if backend == "auto":
        return "triton" if fits and q.is_cuda else "blockwise"
    if backend == "triton" and not fits:
        raise ValueError("backend='triton' needs the triton package and float32, bfloat16 "
                         f"or float16 inputs, got {q.dtype}")
    return backend


def sb_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
            scale: float | None = None, cu_seqlens: torch.Tensor | None = None,
            attend_current: bool = False, block_size: int | None = None,
            backend: str = "auto") -> torch.Tensor:
    """Causal stick-breaking attention (docs/ops.md, "Stick-breaking attention").

    With z_ij = scale * q_i . k_j over the allowed keys j < i (j <= i with attend_current):
    A_ij = sigmoid(z_ij) * prod_{allowed k > j} (1 - sigmoid(z_ik)), o_i = sum_j A_ij v_j.

    Args:
        q: [B, T, HQ, D]; k: [B, T, H, D] with HQ a multiple of H (GQA / MQA: query head h
            uses key/value head h // (HQ // H)); v: [B, T, H, Dv].
        scale: logit scale, default D ** -0.5.
        cu_seqlens: int tensor [N + 1] of packed sequence boundaries (B must be 1).
        attend_current: whether query i attends to key i too.
        block_size: "blockwise": the tile length C, at most 1024; default 128, or the
            longest sequence rounded up to a multiple of 16 when that is shorter.
            "triton": a power of two in [16, 128] (default per head dim and dtype).
        backend: "auto", "triton" (the Triton kernels; CPU tensors need
            TRITON_INTERPRET=1) or "blockwise" (`select_backend`: "auto" takes "triton"
            for CUDA tensors, else "blockwise").

    q, k, v share a float dtype; low precision inputs compute in float32. Returns o
    [B, T, HQ, Dv] in q's dtype, differentiable in q, k and v; ValueError names any bad
    argument. Autocast does not reach inside; non-finite inputs are not isolated. Kernel
    design and exactness of "triton": docs/sba.md.
    """
    device = q.device.type if isinstance(q, torch.Tensor) else "cpu"  # bad q: checked below
    with torch.autocast(device, enabled=False):
        check_sb_attn_inputs(q, k, v, scale, cu_seqlens, attend_current)
        impl = select_backend(backend, q)
        if impl == "triton":
            sb_triton.check_block_size(block_size)
        else:
            block_size = check_block_size(block_size)
        B, T, HQ, D = q.shape
        if B * T == 0:
            return q.new_zeros(B, T, HQ, v.shape[-1]) + 0 * (q.sum() + k.sum() + v.sum())
        if impl == "triton":
            return sb_triton.sb_attn_triton(q, k, v, default_scale(D, scale), cu_seqlens,
                                            attend_current, block_size)
        return sb_attention(q, k, v, default_scale(D, scale), cu_seqlens, attend_current,
                            block_size)
