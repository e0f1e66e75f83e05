"""Input checks shared by the ops: every failure is a ValueError naming the argument."""

from __future__ import annotations

import math
import numbers

import torch

__all__ = ["FLOAT_DTYPES", "MAX_BLOCK_SIZE", "check_block_size", "check_cu_seqlens",
           "batch_index", "check_tensor", "check_same", "check_scale", "check_heads",
           "check_one_device", "assert_in_graph"]

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_tensor(name: str, x, ndim: int, layout: str) -> None:
    """x must be a float tensor (float16, bfloat16, float32, float64) with `ndim` dimensions;
    `layout` names them in the message, e.g. "[B, T, HQ, D]"."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape {layout}, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions {layout}, got shape "
                         f"{tuple(x.shape)}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be float16, bfloat16, float32 or float64, got {x.dtype}")


def check_same(name: str, got, want, what: str) -> None:
    """`got` must equal `want`; the message says "name: expected <what> <want>, got <got>"."""
    if got != want:
        raise ValueError(f"{name}: expected {what} {want}, got {got}")


def check_heads(HQ: int, H: int, D: int, Dv: int, d_args: str = "q, k") -> None:
    """HQ query heads a positive multiple of H key/value heads (GQA / MQA), and positive
    head dims D (of `d_args`) and Dv (of v)."""
    if H == 0 or HQ % H:
        raise ValueError(f"q: number of query heads HQ={HQ} must be a multiple of the number "
                         f"of key/value heads H={H} (GQA/MQA)")
    if D == 0 or Dv == 0:
        raise ValueError(f"head dims must be positive, got D={D} ({d_args}) and Dv={Dv} (v)")


def check_one_device(q: torch.Tensor, others: dict) -> None:
    """Every tensor of `others` (name -> tensor or None) on q's device."""
    for name, x in others.items():
        if x is not None and x.device != q.device:
            raise ValueError(f"{name} is on {x.device} but q is on {q.device}: all inputs "
                             "must be on one device")


def check_scale(scale) -> None:
    """scale: None or a finite positive number (not a bool)."""
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)
                              or not math.isfinite(scale) or scale <= 0):
        raise ValueError("scale must be a positive number or None (finite, not a bool), "
                         f"got {scale!r}")


# A block's UT transform holds C x C matrices per head and its sub-block merges C x D ones;
# beyond this length no sequence gets faster and the memory only grows.
MAX_BLOCK_SIZE = 1024


def check_tile_length(block_size) -> None:
    """block_size of a Triton backend: None or a power of two in [16, 128] (the kernels'
    tile length)."""
    if block_size is None:
        return
    if (isinstance(block_size, bool) or not isinstance(block_size, int)
            or not 16 <= block_size <= 128 or block_size & (block_size - 1)):
        raise ValueError("block_size must be None or a power of two in [16, 128] for "
                         f"backend='triton', got {block_size!r}")


def check_block_size(block_size) -> int:
    """block_size: None or an int in [1, MAX_BLOCK_SIZE] (not bool)."""
    if block_size is None:
        return block_size
    if isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral) \
            or not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise ValueError(f"block_size must be a positive integer at most {MAX_BLOCK_SIZE} "
                         f"or None, got {block_size!r}")
    return int(block_size)


def check_cu_seqlens(cu, B: int, T: int) -> None:
    """cu_seqlens: an int32 / int64 tensor [N + 1] (N >= 1) from 0 to T, non-decreasing,
    with B == 1. Under torch.compile the values are checked in the graph instead of on the
    host (no graph break): a RuntimeError when the compiled code runs (`assert_in_graph`);
    the blockwise op checks them again with this function's ValueError."""
    if not isinstance(cu, torch.Tensor) or cu.ndim != 1:
        raise ValueError("cu_seqlens must be a 1-D integer tensor [N + 1] of sequence "
                         "boundaries")
    if cu.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"cu_seqlens must be int32 or int64, got {cu.dtype}")
    if B != 1:
        raise ValueError(f"cu_seqlens needs packed inputs with B == 1, got B={B}")
    if cu.numel() < 2:
        raise ValueError("cu_seqlens must hold at least 2 boundaries [0, ..., T]")
    if torch.compiler.is_compiling():
        assert_in_graph((cu[0] == 0) & (cu[-1] == T) & (cu[1:] >= cu[:-1]).all(),
                        f"cu_seqlens must start at 0, end at T={T} and be non-decreasing")
        return
    c = cu.detach().cpu()
    if int(c[0]) != 0 or int(c[-1]) != T:
        raise ValueError(f"cu_seqlens must start at 0 and end at T={T}, got "
                         f"{int(c[0])} ... {int(c[-1])}")
    if bool((c[1:] < c[:-1]).any()):
        raise ValueError("cu_seqlens must be non-decreasing")


def assert_in_graph(ok: torch.Tensor, message: str) -> None:
    """A value check inside traced code: ok (a bool tensor with one element) must be True,
    else the compiled code raises a RuntimeError with `message` when it runs. No value is
    read back to the host while tracing, so torch.compile keeps one graph; use it only under
    `torch.compiler.is_compiling()` (eager code raises ValueErrors on the host)."""
    torch._assert_async(ok, message)


def batch_index(index, B: int, device) -> torch.Tensor:
    """The `index` of a cache's `reorder` (beam search: row b becomes old row index[b]),
    checked and as an int64 tensor on `device`: a 1-D int32 / int64 tensor with entries in
    [0, B) (any length)."""
    if not isinstance(index, torch.Tensor) or index.ndim != 1 or index.dtype not in (
            torch.int32, torch.int64):
        raise ValueError("index must be a 1-D int32 or int64 tensor of batch rows")
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= B):
        raise ValueError(f"index: entries must lie in [0, {B}), got {index.tolist()}")
    return index.to(device=device, dtype=torch.long)
