"""Left-padded prompts as packed sequences, with shapes that depend on B and T only, and the
check of the `attention_mask` that describes them.

A prefill with `attention_mask` [B, T] (1 = token, 0 = padding on the left) runs as one
packed batch of the B * T tokens in which row b is two sequences: its pad_b padding tokens,
then its T - pad_b real tokens. The cut points (`cu_seqlens` [2B + 1], with an empty
sequence where a row has no padding) are computed on the device, so no token index is read
back to the host and torch.compile keeps one graph; each real sequence is computed exactly
as if it ran alone, and the padding sequences are computed and then zeroed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .validation import assert_in_graph

__all__ = ["LeftPadding", "check_attention_mask"]


@dataclass(frozen=True)
class LeftPadding:
    """mask: bool [B, T], True at real tokens, padding (False) on the left only."""

    mask: torch.Tensor

    @property
    def start(self) -> torch.Tensor:
        """int64 [B]: each row's number of padding tokens (its first real position)."""
        return self.mask.shape[1] - self.mask.sum(1)

    @property
    def cu_seqlens(self) -> torch.Tensor:
        """int64 [2B + 1]: 0, then for row b the ends b * T + pad_b and (b + 1) * T."""
        B, T = self.mask.shape
        ends = torch.arange(1, B + 1, device=self.mask.device) * T  # [B]
        cuts = torch.stack([ends - T + self.start, ends], 1).reshape(-1)  # [2B]
        return torch.cat([cuts.new_zeros(1), cuts])

    def pack(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """[B, T, *F] -> [1, B * T, *F] (a view; None stays None)."""
        if x is None:
            return None
        B, T = self.mask.shape
        return x.reshape((1, B * T) + x.shape[2:])

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """[1, B * T, *F] -> [B, T, *F], zero at padding (whatever was computed there)."""
        B, T = self.mask.shape
        x = x.reshape((B, T) + x.shape[2:])
        keep = self.mask.reshape((B, T) + (1,) * (x.ndim - 2))
        return torch.where(keep, x, x.new_zeros(()))


def check_attention_mask(mask, B: int, T: int, device) -> torch.Tensor | None:
    """attention_mask -> bool [B, T] (None when absent; eager code also returns None for a
    mask without padding). Shape, dtype and device are checked on the host; the values (0 /
    1, padding on the left) too in eager code, and inside the graph under torch.compile
    (no value is read back to the host, so a compiled prefill keeps one graph)."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != (B, T):
        shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"attention_mask must be a tensor of shape [B, T] = {(B, T)}, "
                         f"got {shape}")
    if mask.dtype.is_complex or mask.dtype.is_floating_point:
        raise ValueError(f"attention_mask must be bool or integer (1 = token, 0 = padding), "
                         f"got {mask.dtype}")
    if mask.device != device:
        raise ValueError(f"attention_mask is on {mask.device} but q is on {device}")
    binary = "attention_mask must hold only 0 (padding) and 1 (token)"
    left = ("attention_mask: padding must be on the left (each row 0 ... 0 1 ... 1); right "
            "padding needs no mask, just ignore those rows")
    if torch.compiler.is_compiling():
        assert_in_graph(((mask == 0) | (mask == 1)).all(), binary)
        mask = mask.bool()
        assert_in_graph((mask[:, 1:] >= mask[:, :-1]).all(), left)
        return mask
    if bool(((mask != 0) & (mask != 1)).any()):
        raise ValueError(binary)
    mask = mask.bool()
    if T > 1 and bool((mask[:, 1:] < mask[:, :-1]).any()):
        raise ValueError(left)
    return None if bool(mask.all()) else mask
