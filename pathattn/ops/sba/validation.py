"""Input checks of the stick-breaking ops: every failure is a ValueError naming the argument."""

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

__all__ = ["check_sb_attn_inputs", "check_attend_current", "check_start"]


def check_attend_current(attend_current) -> None:
    if not isinstance(attend_current, bool):
        raise ValueError(f"attend_current must be a bool, got {attend_current!r}")


def check_sb_attn_inputs(q, k, v, scale, cu_seqlens, attend_current, *,
                         decode: bool = False) -> None:
    """Validate q [B, Tq, HQ, D], k [B, T, H, D], v [B, T, H, Dv] and the options.

    Tq must equal T, except with decode=True where q holds the queries of the last Tq <= T
    positions (`sb_attn_step`); cu_seqlens is checked against q's [B, T].
    """
    check_tensor("q", q, 4, "[B, T, HQ, D]")
    check_tensor("k", k, 4, "[B, T, H, D]")
    check_tensor("v", v, 4, "[B, T, H, Dv]")
    B, Tq, HQ, D = q.shape
    check_same("k", k.shape[0], B, "batch size B equal to q's")
    if decode:
        if Tq > k.shape[1]:
            raise ValueError(f"q: {Tq} new queries need at least as many keys, got "
                             f"k with T={k.shape[1]}")
    else:
        check_same("k", k.shape[1], Tq, "length T equal to q's")
    H = k.shape[2]
    check_same("k", k.shape[3], D, "head dim D equal to q's")
    check_same("v", tuple(v.shape[:3]), tuple(k.shape[:3]), "[B, T, H] equal to k's")
    check_heads(HQ, H, D, v.shape[3])
    for name, x in (("k", k), ("v", v)):
        check_same(name, x.dtype, q.dtype, "dtype equal to q's")
    check_one_device(q, {"k": k, "v": v})
    check_scale(scale)
    check_attend_current(attend_current)
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, B, Tq)


def check_start(start, B: int, n: int, device: torch.device) -> None:
    """start: int tensor [B] of first real positions in [0, n]."""
    if not isinstance(start, torch.Tensor) or start.dtype not in (torch.int32, torch.int64) \
            or tuple(start.shape) != (B,):
        raise ValueError(f"start must be an int32 / int64 tensor [B] = [{B}], got "
                         f"{getattr(start, 'dtype', type(start).__name__)} "
                         f"{tuple(getattr(start, 'shape', ()))}")
    if start.device != device:
        raise ValueError(f"start is on {start.device} but q is on {device}")
    if torch.compiler.is_compiling():  # checked in the graph, no host read
        assert_in_graph(((start >= 0) & (start <= n)).all(),
                        f"start: entries must lie in [0, {n}]")
    elif B and (int(start.min()) < 0 or int(start.max()) > n):
        raise ValueError(f"start: entries must lie in [0, {n}], got {start.tolist()}")
