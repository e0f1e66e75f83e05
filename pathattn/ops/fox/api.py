"""Public forgetting-attention op (FoX, Lin et al. 2025; PaTH paper section 2.2 with
identity transforms) and its backends."""

from __future__ import annotations

import torch

from ..common.heads import default_scale
from ..path import path_attn
from . import triton as fox_triton
from .validation import check_fox_attn_inputs

__all__ = ["fox_attn", "BACKENDS", "select_backend"]

BACKENDS = ("triton", "path")


def select_backend(backend: str, q: torch.Tensor) -> str:
    """The backend that runs q for `backend`: "auto" picks "triton" for CUDA tensors of
    16 or 32 bits when Triton is installed, else "path" (the PaTH op with identity
    transforms, whose own auto rule picks the fused CPU kernels on CPU). ValueError for an
    unknown name, or "triton" on inputs it cannot run."""
    if backend not in ("auto",) + BACKENDS:
        raise ValueError(f"backend must be one of {('auto',) + BACKENDS}, got {backend!r}")
    fits = q.dtype != torch.float64 and fox_triton.available()
    if backend == "auto":
        return "triton" if fits and q.is_cuda else "path"
    if backend == "triton" and not fits:
        raise ValueError("backend='triton' needs the triton package and float32, bfloat16 "
                         f"or float16 inputs, got {q.dtype}")
    return backend


def fox_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, *,
             scale: float | None = None, cu_seqlens: torch.Tensor | None = None,
             block_size: int | None = None, backend: str = "auto") -> torch.Tensor:
    """Causal forgetting attention.

    For query i and key j <= i of the same sequence, with G_i = sum_{t <= i} g_t:
    logit(i, j) = scale * q_i . k_j + G_i - G_j, o_i = sum_j softmax_j(logit(i, j)) v_j.
    The same as `path_attn(q, k, v, w=0, beta=0, g)`.

    Args:
        q: [B, T, HQ, D]; k: [B, T, H, D] with HQ a multiple of H (query head h uses
            key/value head h // (HQ // H)); v: [B, T, H, Dv].
        g: [B, T, HQ] log forget gates (<= 0), any float dtype (float32 is usual with 16-bit
            q); its gradient comes back in its dtype.
        scale: default D ** -0.5; multiplies q . k only, not G_i - G_j.
        cu_seqlens: int tensor [S + 1] of packed sequence boundaries (B must be 1).
        block_size: "triton": the tile length, a power of two in [16, 128] (default per
            head dim); "path": the PaTH op's block length.
        backend: "auto", "triton" (the kernels; CPU tensors need TRITON_INTERPRET=1) or
            "path" (`select_backend`).

    q, k, v share a float dtype; 16-bit inputs accumulate in float32. Returns o
    [B, T, HQ, Dv] in q's dtype, differentiable in q, k, v and g. ValueError names any bad
    argument. Autocast does not reach inside. Kernel design and exactness: docs/fox.md.
    """
    device = q.device.type if isinstance(q, torch.Tensor) else "cpu"  # bad q: checked below
    with torch.autocast(device, enabled=False):
        check_fox_attn_inputs(q, k, v, g, scale, cu_seqlens)
        impl = select_backend(backend, q)
        B, T, HQ, D = q.shape
        if impl == "path":
            w = torch.zeros_like(k)  # [B, T, H, D]: H_t = I
            beta = k.new_zeros(k.shape[:3], dtype=g.dtype)  # [B, T, H]
            return path_attn(q, k, v, w, beta, g, scale=scale, cu_seqlens=cu_seqlens,
                             block_size=block_size)
        if B * T == 0:
            return q.new_zeros(B, T, HQ, v.shape[-1]) + 0 * (q.sum() + k.sum() + v.sum()
                                                             + g.sum())
        return fox_triton.fox_attn_triton(q, k, v, g, default_scale(D, scale), cu_seqlens,
                                          block_size)
