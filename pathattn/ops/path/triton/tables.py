"""The index tables of a call: blocks, segment slots, segment-pair bases.

`call_tables` builds them on the device (`_common.block_table`, `segments.segment_slots`,
`crossings.segment_pairs`): about 40 small PyTorch operations, each a kernel launch. For a
dense batch they depend only on (B, T, block size, segment length), so they are built once
per shape, device and stream and kept (`CACHE_SIZE` entries, the oldest dropped first; a
few KB each); the kernels only read them. Packed batches (cu_seqlens) build them on every
call, since their values are on the device. Nothing is kept while a CUDA graph is being
captured.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import NamedTuple

import torch

from ._common import block_table
from .crossings import segment_pairs
from .segments import segment_slots

__all__ = ["CallTables", "call_tables", "default_seg", "CACHE_SIZE"]

CACHE_SIZE = 32
_CACHE: OrderedDict = OrderedDict()


class CallTables(NamedTuple):
    """table int32 [NB, 3] and n_max (`block_table`), seg (blocks per segment), slots int32
    [NB] and n_slots (`segment_slots`), pairs (pair bases int32 [NB], rows;
    `segment_pairs`) or None when not asked for."""

    table: torch.Tensor
    n_max: int
    seg: int
    slots: torch.Tensor
    n_slots: int
    pairs: tuple[torch.Tensor, int] | None


def default_seg(n_max: int, multiple: int = 1) -> int:
    """Blocks per segment when the call gives none, for sequences of at most n_max blocks:
    about sqrt(n_max), the smallest s with s * s >= n_max (1 for n_max <= 1), rounded up to
    a multiple of `multiple` (`config.LaunchConfig.seg_multiple`) but not past n_max."""
    if multiple < 1:
        raise ValueError(f"multiple must be at least 1, got {multiple}")
    s = math.isqrt(max(n_max - 1, 0)) + 1
    return max(1, min(-(-s // multiple) * multiple, n_max)) if multiple > 1 else s


def _build(B: int, T: int, cu_seqlens, BT: int, seg: int, device, pairs: bool,
           seg_multiple: int = 1) -> CallTables:
    table, n_max = block_table(B, T, cu_seqlens, BT, device)
    seg = seg if seg > 0 else default_seg(n_max, seg_multiple)
    n_seq = B if cu_seqlens is None else cu_seqlens.numel() - 1
    slots, n_slots = segment_slots(table, seg, BT, n_seq)
    return CallTables(table, n_max, seg, slots, n_slots,
                      segment_pairs(table, seg, BT, n_max) if pairs else None)


def _stream_key(device: torch.device):
    if device.type != "cuda":
        return None
    if torch.cuda.is_current_stream_capturing():
        return False
    return torch.cuda.current_stream(device).stream_id


def call_tables(B: int, T: int, cu_seqlens: torch.Tensor | None, BT: int, seg: int,
                device: torch.device, pairs: bool = False,
                seg_multiple: int = 1) -> CallTables:
    """The tables of a call on B sequences of T tokens (or the packed cu_seqlens) in blocks
    of BT tokens, seg blocks per segment (0: `default_seg`, about sqrt of the blocks per
    sequence rounded up to a multiple of seg_multiple), on `device`; pairs: also the
    segment-pair bases (the backward's)."""
    stream = _stream_key(torch.device(device))
    if cu_seqlens is not None or stream is False:
        return _build(B, T, cu_seqlens, BT, seg, device, pairs, seg_multiple)
    key = (str(device), stream, B, T, BT, seg, seg_multiple)
    hit = _CACHE.get(key)
    if hit is None:
        hit = _CACHE[key] = _build(B, T, None, BT, seg, device, True, seg_multiple)
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
    return hit if pairs else hit._replace(pairs=None)
