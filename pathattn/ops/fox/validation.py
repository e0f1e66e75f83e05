"""Input checks of the FoX op: every failure is a ValueError naming the argument."""

from __future__ import annotations

import torch

from ..common.validation import (
    assert_in_graph,
    check_cu_seqlens,
    check_heads,
    check_one_device,
    check_same,
    check_scale,
    check_tensor,
)

__all__ = ["check_fox_attn_inputs"]


def check_fox_attn_inputs(q, k, v, g, scale, cu_seqlens) -> None:
    """Validate the arguments of `fox_attn` (shapes in its docstring). cu_seqlens on a GPU
    is checked on the host for shape and dtype and inside the device's stream for its
    values (a RuntimeError when the kernels run): reading it back would make every call
    wait for the GPU."""
    check_tensor("q", q, 4, "[B, T, HQ, D]")
    check_tensor("k", k, 4, "[B, T, H, D]")
    check_tensor("v", v, 4, "[B, T, H, Dv]")
    check_tensor("g", g, 3, "[B, T, HQ]")
    B, T, HQ, D = q.shape
    H = k.shape[2]
    check_same("k", tuple(k.shape[:2]), (B, T), "[B, T] equal to q's")
    check_same("k", k.shape[3], D, "head dim D equal to q's")
    check_same("v", tuple(v.shape[:3]), (B, T, H), "[B, T, H] equal to k's")
    check_same("g", tuple(g.shape), (B, T, HQ), "shape [B, T, HQ]")
    check_heads(HQ, H, D, v.shape[3])
    for name, x in (("k", k), ("v", v)):
        check_same(name, x.dtype, q.dtype, "dtype equal to q's")
    check_one_device(q, {"k": k, "v": v, "g": g})
    check_scale(scale)
    if cu_seqlens is None:
        return
    if cu_seqlens.device.type == "cuda" and not torch.compiler.is_compiling():
        _check_cu_seqlens_async(cu_seqlens, B, T)
    else:
        check_cu_seqlens(cu_seqlens, B, T)


def _check_cu_seqlens_async(cu, B: int, T: int) -> None:
    """`check_cu_seqlens` with the value checks queued on the device."""
    if cu.ndim != 1 or cu.dtype not in (torch.int32, torch.int64) or cu.numel() < 2:
        check_cu_seqlens(cu.cpu(), B, T)  # raises the host check's ValueError
    if B != 1:
        raise ValueError(f"cu_seqlens needs packed inputs with B == 1, got B={B}")
    assert_in_graph((cu[0] == 0) & (cu[-1] == T) & (cu[1:] >= cu[:-1]).all(),
                    f"cu_seqlens must start at 0, end at T={T} and be non-decreasing")
