"""Public PaTH / PaTH-FoX attention op (paper sections 2.2 and 3.3)."""

from __future__ import annotations

import torch

from ..common.heads import compute_dtype, default_scale
from ..common.validation import check_block_size
from .backends import keys_backend, select_backend
from .nonfinite import isolate_nonfinite, poison_keys, poison_rows
from .stages import num_reflections, single_reflection
from .validation import check_path_attn_inputs

__all__ = ["path_attn", "path_attn_with_keys"]


def path_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor,
              beta: torch.Tensor, g: torch.Tensor | None = None, *,
              scale: float | None = None, cu_seqlens: torch.Tensor | None = None,
              block_size: int | None = None, backend: str = "auto") -> torch.Tensor:
    """Causal PaTH attention (PaTH-FoX when forget gates are given).

    For query i and key j <= i of the same sequence, with H_t = I - beta_t w_t w_t^T and
    G_i = sum_{t <= i} g_t: logit(i, j) = scale * k_j^T H_{j+1} ... H_i q_i + G_i - G_j,
    o_i = sum_j softmax_j(logit(i, j)) v_j.

    Args:
        q: [B, T, HQ, D]; k: [B, T, H, D] with HQ a multiple of H (query head h uses
            key/value head h // (HQ // H)); v: [B, T, H, Dv].
        w: [B, T, H, D] Householder directions, or [B, T, H, R, D] for R reflections per
            token; beta: [B, T, H] strengths (or [B, T, H, R]).
        g: [B, T, HQ] log forget gates (<= 0), or None.
        scale: default D ** -0.5; multiplies the PaTH term only, not G_i - G_j.
        cu_seqlens: int tensor [N + 1] of packed sequence boundaries (B must be 1).
        block_size: block length (at most 1024; "triton": a power of two in [16, 128]).
        backend: "auto" or a registered backend ("cpu", "torch", "triton").

    q, k, v, w share a float dtype; 16-bit inputs accumulate in float32. Returns o
    [B, T, HQ, Dv] in q's dtype, differentiable in every input. Non-finite tokens make NaN
    only the rows the definition reaches. ValueError names any bad argument. Backends,
    block sizes, precision and torch.compile: docs/ops.md.
    """
    device = q.device.type if isinstance(q, torch.Tensor) else "cpu"  # bad q: checked below
    with torch.autocast(device, enabled=False):
        return _path_attn(q, k, v, w, beta, g, scale, cu_seqlens, block_size, backend)


def _path_attn(q, k, v, w, beta, g, scale, cu_seqlens, block_size, backend):
    check_path_attn_inputs(q, k, v, w, beta, g, scale, cu_seqlens)
    w, beta = single_reflection(w, beta)  # R = 1 runs as w [B, T, H, D]
    impl = select_backend(backend, q, num_reflections(w))
    check_block_size(block_size)
    B, T, HQ, D = q.shape
    if B * T == 0:
        return q.new_zeros(B, T, HQ, v.shape[-1]) + 0 * (q.sum() + k.sum() + v.sum())
    (q, k, v, w, beta, g), bad = isolate_nonfinite(q, k, v, w, beta, g, cu_seqlens,
                                                   clean=not impl.sanitizes)
    o = impl.attention(q, k, v, w, beta, g, default_scale(D, scale), cu_seqlens, block_size)
    return poison_rows(o, bad)


def path_attn_with_keys(q, k, v, w, beta, g=None, *, scale=None, cu_seqlens=None,
                        block_size=None, backend: str = "auto"
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """`path_attn` (no autograd) plus every key transformed by all later tokens of its
    sequence: keys[b, j] = H_{T-1} ... H_{j+1} k_j (T the sequence's length; row form
    k_j^T H_{j+1} ... H_{T-1}, the definition when R > 1 reflections per token make H_t
    non-symmetric), the cache of `path_attn_prefill`. Arguments as `path_attn`; the
    backend must provide the keys (`pathattn.ops.path.backends`: "cpu" and "torch" do; "auto"
    picks one that does).

    Returns o [B, T, HQ, Dv] in q's dtype and keys [B, T, H, D] in the compute dtype
    (float32, or float64 for float64 inputs).
    """
    check_path_attn_inputs(q, k, v, w, beta, g, scale, cu_seqlens)
    w, beta = single_reflection(w, beta)  # R = 1 runs as w [B, T, H, D]
    impl = keys_backend(backend, q, reflections=num_reflections(w))
    check_block_size(block_size)
    B, T, HQ, D = q.shape
    if B * T == 0:
        return (q.new_zeros(B, T, HQ, v.shape[-1]),
                k.new_zeros(B, T, k.shape[2], D, dtype=compute_dtype(q.dtype)))
    clean, bad = isolate_nonfinite(q, k, v, w, beta, g, cu_seqlens)
    with torch.autocast(q.device.type, enabled=False):
        o, keys = impl.with_keys(*clean, default_scale(D, scale), cu_seqlens, block_size)
    if bad is None:
        return o, keys
    return poison_rows(o, bad), poison_keys(keys, k, v, w, beta, cu_seqlens)
