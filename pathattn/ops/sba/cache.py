"""`SBACache`: the key/value cache of stick-breaking attention inference.

Stick-breaking attention needs nothing but the raw keys and values of the past (no running
state: the product over the keys between j and i is recomputed for each new query), so the
cache is a plain KV cache in the op's layout, plus a key mask (False at masked tokens: left
padding or zeros anywhere in the attention mask, which are absent keys). Keys and values
stay in the inputs' dtype; the op computes in its own compute dtype. Any prefix can be kept
(`truncate`), and rows can be reordered (beam search).
"""

from __future__ import annotations

import numbers

import torch

from ..common.validation import batch_index

__all__ = ["SBACache"]


class SBACache:
    """Keys k [B, n, H, D], values v [B, n, H, Dv] and key_mask [B, n] (bool, False at masked
    tokens; None: every position a key). `start` [B]: first real position of each row."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor,
                 key_mask: torch.Tensor | None = None):
        self.k, self.v = k, v
        self.key_mask = torch.ones(k.shape[:2], dtype=torch.bool, device=k.device) \
            if key_mask is None else key_mask.to(device=k.device, dtype=torch.bool)

    @property
    def start(self) -> torch.Tensor:
        """[B] int64: first real position of each row (n for a row without one)."""
        m = self.key_mask
        return torch.where(m.any(1), m.to(torch.uint8).argmax(1), m.shape[1])

    def __len__(self) -> int:
        return self.k.shape[1]

    @property
    def seq_len(self) -> int:
        """Positions held (left padding included)."""
        return self.k.shape[1]

    def append(self, k: torch.Tensor, v: torch.Tensor,
               keep: torch.Tensor | None = None) -> None:
        """k [B, m, H, D], v [B, m, H, Dv] of m new tokens (cast to the cache's dtype);
        keep: None (all keys) or bool [B, m], False at masked tokens."""
        self.k = torch.cat([self.k, k.to(self.k.dtype)], dim=1)
        self.v = torch.cat([self.v, v.to(self.v.dtype)], dim=1)
        if keep is None:
            keep = self.key_mask.new_ones(k.shape[:2])
        self.key_mask = torch.cat([self.key_mask, keep.to(torch.bool)], dim=1)

    def reorder(self, index: torch.Tensor) -> None:
        """Row b becomes old row index[b] (index [B'] int32 / int64), in place."""
        index = batch_index(index, self.k.shape[0], self.k.device)
        self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)
        self.key_mask = self.key_mask.index_select(0, index)

    def truncate(self, new_len: int) -> None:
        """Keep the first new_len positions (any new_len in [0, len])."""
        if isinstance(new_len, bool) or not isinstance(new_len, numbers.Integral) or not (
                0 <= new_len <= len(self)):
            raise ValueError(f"new_len={new_len!r} must be an int in [0, {len(self)}]")
        n = int(new_len)
        self.k, self.v, self.key_mask = self.k[:, :n], self.v[:, :n], self.key_mask[:, :n]

    @property
    def min_len(self) -> int:
        """Smallest length `truncate` accepts: 0 (any prefix)."""
        return 0
