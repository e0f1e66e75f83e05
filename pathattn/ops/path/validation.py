"""Input checks of the PaTH op: every failure is a ValueError naming the argument."""

from __future__ import annotations

import torch

from ..common.validation import (
    check_cu_seqlens,
    check_heads,
    check_one_device,
    check_same,
    check_scale,
    check_tensor,
)

__all__ = ["check_path_attn_inputs"]


def _reflections(w) -> int | None:
    """R of w [B, T, H, R, D] (R >= 1 reflections per token), None for w [B, T, H, D]."""
    if not isinstance(w, torch.Tensor) or w.ndim != 5:
        return None
    check_tensor("w", w, 5, "[B, T, H, R, D]")
    if w.shape[3] < 1:
        raise ValueError("w: the number of reflections per token R = w.shape[3] of "
                         f"w [B, T, H, R, D] must be at least 1, got shape {tuple(w.shape)}")
    return w.shape[3]


def check_path_attn_inputs(q, k, v, w, beta, g, scale, cu_seqlens) -> None:
    """Validate the arguments of `path_attn` (shapes in its docstring)."""
    check_tensor("q", q, 4, "[B, T, HQ, D]")
    check_tensor("k", k, 4, "[B, T, H, D]")
    check_tensor("v", v, 4, "[B, T, H, Dv]")
    R = _reflections(w)  # None: one reflection per token, w [B, T, H, D]
    if R is None:
        check_tensor("w", w, 4, "[B, T, H, D] (or [B, T, H, R, D] for R reflections per token)")
        check_tensor("beta", beta, 3, "[B, T, H] (w is [B, T, H, D])")
    else:
        check_tensor("beta", beta, 4, "[B, T, H, R] (w is [B, T, H, R, D])")
    B, T, HQ, D = q.shape
    check_same("k", tuple(k.shape[:2]), (B, T), "[B, T] equal to q's")
    H = k.shape[2]
    check_same("k", k.shape[3], D, "head dim D equal to q's")
    if R is None:
        check_same("w", tuple(w.shape), tuple(k.shape), "shape [B, T, H, D] equal to k's")
    else:
        check_same("w", tuple(w.shape[:3]) + tuple(w.shape[4:]), tuple(k.shape),
              "[B, T, H] and D of w [B, T, H, R, D] equal to k's")
    check_same("v", tuple(v.shape[:3]), (B, T, H), "[B, T, H] equal to k's")
    if R is None:
        check_same("beta", tuple(beta.shape), (B, T, H), "shape [B, T, H]")
    else:
        check_same("beta", tuple(beta.shape), (B, T, H, R), "shape [B, T, H, R] (w's first four)")
    check_heads(HQ, H, D, v.shape[3], "q, k, w")
    for name, x in (("k", k), ("v", v), ("w", w)):
        check_same(name, x.dtype, q.dtype, "dtype equal to q's")
    if g is not None:
        check_tensor("g", g, 3, "[B, T, HQ]")
        check_same("g", tuple(g.shape), (B, T, HQ), "shape [B, T, HQ]")
    check_one_device(q, {"k": k, "v": v, "w": w, "beta": beta, "g": g})
    check_scale(scale)
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, B, T)


