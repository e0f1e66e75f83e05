"""The block length of the blockwise algorithms and the layouts they reuse.

Without a `block_size`, a batch runs in blocks of DEFAULT_BLOCK_SIZE tokens (an op may ask
for another largest block), or fewer when every sequence is shorter: the longest sequence
rounded up to a multiple of 16, since every sequence is padded to whole blocks and a
10-token sequence in a 128-token block would cost 12x its work.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch

from .layout import BlockLayout, make_layout
from .validation import check_cu_seqlens

__all__ = ["DEFAULT_BLOCK_SIZE", "longest_sequence", "default_block_size", "cached_layout"]

DEFAULT_BLOCK_SIZE = 128

# (B, T, device, C, bounds) -> BlockLayout, the most recent last
_LAYOUTS: OrderedDict = OrderedDict()
_KEEP_LAYOUTS = 4


def longest_sequence(T: int, cu_seqlens: torch.Tensor | None = None) -> int:
    """Tokens in the longest sequence: T, or the largest gap of cu_seqlens."""
    if cu_seqlens is None or cu_seqlens.numel() < 2:
        return T
    return int((cu_seqlens[1:] - cu_seqlens[:-1]).max())


def default_block_size(T: int, cu_seqlens: torch.Tensor | None = None,
                       largest: int = DEFAULT_BLOCK_SIZE) -> int:
    """`largest`, or the longest sequence rounded up to a multiple of 16 when that is less."""
    return _fitted(longest_sequence(T, cu_seqlens), largest)


def _fitted(longest: int, largest: int) -> int:
    return min(largest, max(16, -(-longest // 16) * 16))


def cached_layout(q: torch.Tensor, cu_seqlens: torch.Tensor | None, block_size: int | None,
                  largest: Callable[[int], int] | None = None) -> BlockLayout:
    """The block layout of q [B, T, ...] (B * T > 0): blocks of `block_size` tokens, or of
    `default_block_size` with largest = `largest(longest sequence)` (DEFAULT_BLOCK_SIZE
    when None). Checks cu_seqlens (ValueError). The latest few layouts are kept: a
    backward, and every layer of a model, meet the forward's again."""
    B, T = q.shape[:2]
    bounds = None
    if cu_seqlens is not None:  # under torch.compile the public checks run in the graph
        check_cu_seqlens(cu_seqlens, B, T)
        bounds = tuple(cu_seqlens.tolist())
    longest = T if bounds is None else max(b - a for a, b in zip(bounds, bounds[1:], strict=False))
    cap = block_size or (largest(longest) if largest is not None else DEFAULT_BLOCK_SIZE)
    C = _fitted(longest, cap)
    key = (B, T, q.device, C, bounds)
    lay = _LAYOUTS.pop(key, None)
    if lay is None:
        lay = make_layout(B, T, C, cu_seqlens, q.device)
    _LAYOUTS[key] = lay
    while len(_LAYOUTS) > _KEEP_LAYOUTS:
        _LAYOUTS.popitem(last=False)
    return lay
