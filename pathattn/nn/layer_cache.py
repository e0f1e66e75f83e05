"""`LayerCache`: the decode state of a PaTH layer (paper section 3.4): the op's key cache
(`PaTHCache`) and the short convolution's state, the last K-1 real inputs of the conv.

Truncation goes back as far as the op's cache allows (its pending window, or any length
when it keeps its history): the conv inputs since that point are kept with the state before
them, so the state at any kept length is rebuilt as the last K-1 real inputs before it
(masked tokens, which the conv skips, are zero inputs with key_mask False).
"""

from __future__ import annotations

import numbers

import torch

from ..ops import PaTHCache
from ..ops.common.padding import last_real_rows
from .fused_projection import FusedProjection

__all__ = ["LayerCache"]


class LayerCache:
    """Decode state of `PaTHAttention`: the `PaTHCache` of the attention op (`attn`) and the
    short conv's state (`conv_state` [B, K-1, C]: the last K-1 real conv inputs of each
    row, zeros before its first). `projection`: the layer's input projections stacked into
    one matrix (`PaTHAttention.fused_projection`), built by the first decode step and used
    by every later one, so that a generation runs on the weights its first step saw.

    `reorder(index)` selects batch rows of both parts (beam search). `truncate(n)` goes back
    to any length in [min_len, current length] (min_len: the op cache's, 0 with history).

    Args: attn; conv_state [B, K-1, C]; conv_inputs: None, or the conv inputs of every
    position [B, T, C] (zero at masked tokens) when attn keeps its history.
    """

    def __init__(self, attn: PaTHCache, conv_state: torch.Tensor,
                 conv_inputs: torch.Tensor | None = None):
        self.attn = attn
        self.projection: FusedProjection | None = None  # set by the first decode step
        self.conv_state = conv_state
        if conv_inputs is None:  # the inputs since _base (none yet) and the state before
            self._base, self._state0 = len(attn), conv_state
            self._u = conv_state.new_zeros(conv_state.shape[0], 0, conv_state.shape[2])
        else:
            self._base, self._state0 = 0, torch.zeros_like(conv_state)
            self._u = conv_inputs
        self._n = self._u.shape[1]  # valid rows of the buffer _u

    def __len__(self) -> int:
        return len(self.attn)

    @property
    def seq_len(self) -> int:
        return len(self.attn)

    @property
    def key_mask(self) -> torch.Tensor:
        """[B, T] bool: False at masked positions."""
        return self.attn.key_mask

    @property
    def min_len(self) -> int:
        """Smallest length `truncate` accepts."""
        return max(self._base, self.attn.min_len)

    def update(self, u: torch.Tensor, conv_state: torch.Tensor) -> None:
        """After a step (the op cache already holds it): u [B, m, C] its conv inputs (zero at
        masked tokens), conv_state [B, K-1, C] the state after it."""
        m = u.shape[1]
        if self._n + m > self._u.shape[1]:  # grow the buffer (doubling)
            grown = self._u.new_zeros(self._u.shape[0], max(2 * self._u.shape[1], self._n + m),
                                      self._u.shape[2])
            grown[:, : self._n] = self._u[:, : self._n]
            self._u = grown
        self._u[:, self._n: self._n + m] = u
        self._n += m
        self.conv_state = conv_state
        keep_from = self.attn.min_len
        if keep_from > self._base:  # the op cache cannot go back before keep_from any more
            self._state0 = self._state_at(keep_from)
            self._u = self._u[:, keep_from - self._base: self._n].clone()
            self._n -= keep_from - self._base
            self._base = keep_from

    def _state_at(self, n: int) -> torch.Tensor:
        """[B, K-1, C]: the last K-1 real conv inputs before position n (>= _base)."""
        K1, B = self._state0.shape[1], self._state0.shape[0]
        inputs = torch.cat([self._state0, self._u[:, : n - self._base]], dim=1)
        keep = torch.cat([self.key_mask.new_ones(B, K1), self.key_mask[:, self._base: n]], 1)
        return last_real_rows(inputs, keep, K1)

    def reorder(self, index: torch.Tensor) -> None:
        """Row b becomes old row index[b] (index [B'] int32 / int64) in both parts."""
        self.attn.reorder(index)  # validates index
        index = index.to(self.conv_state.device, torch.long)
        self.conv_state, self._state0, self._u = (
            x.index_select(0, index) for x in (self.conv_state, self._state0, self._u))

    def truncate(self, new_len: int) -> None:
        """Keep the first new_len positions; new_len in [min_len, length]."""
        if isinstance(new_len, bool) or not isinstance(new_len, numbers.Integral) or not (
                self.min_len <= new_len <= len(self)):
            raise ValueError(f"new_len={new_len!r} is out of range: a LayerCache can only be "
                             f"truncated to a length in [{self.min_len}, {len(self)}] (back "
                             "to the start of the op cache's pending window at most; any "
                             "length when it was prefilled with history=True)")
        n = int(new_len)
        if n == len(self):
            return
        self.attn.truncate(n)
        self._n = n - self._base
        self.conv_state = self._state_at(n)
