"""Masked tokens: an `attention_mask` [B, T] (1 = token, 0 = masked) with zeros anywhere in a
row, as packed sequences with shapes that depend on B and T only, and its check.

A masked token is removed from its row's sequence: it is neither a key nor (for PaTH) a
transform, and every real token computes what it computes with the masked ones deleted.
Left padding is the case where the zeros come first. `MaskedRows` runs a batch as one packed
batch of the B * T tokens in which row b is two sequences: its masked tokens, then its real
tokens, each group in its original order (a stable sort of the row by mask value, the
identity for left padding). The cut points (`cu_seqlens` [2B + 1], with an empty sequence
where a row has no masked token) and the permutation are computed on the device, so no
token index is read back to the host and torch.compile keeps one graph; each real sequence
is computed exactly as if it ran alone, and the masked sequences are computed and then
zeroed.
"""

from __future__ import annotations

import torch

from .validation import assert_in_graph

__all__ = ["MaskedRows", "check_attention_mask", "last_real_rows"]


class MaskedRows:
    """mask: bool [B, T], True at real tokens, False at masked tokens (anywhere in a row).

    `order` [B, T] int64: each row's masked positions, then its real positions, each in
    order (`compact` applies it, `restore` undoes it)."""

    def __init__(self, mask: torch.Tensor):
        self.mask = mask
        # stable sort by value: zeros (masked) first, each group keeping its order
        self.order = torch.sort(mask.to(torch.uint8), dim=1, stable=True).indices  # [B, T]
        self._inverse = torch.argsort(self.order, dim=1)  # [B, T]

    @property
    def start(self) -> torch.Tensor:
        """int64 [B]: each row's number of masked tokens (its first real position once
        compacted)."""
        return self.mask.shape[1] - self.mask.sum(1)

    @property
    def cu_seqlens(self) -> torch.Tensor:
        """int64 [2B + 1]: 0, then for row b the ends b * T + start_b and (b + 1) * T."""
        B, T = self.mask.shape
        ends = torch.arange(1, B + 1, device=self.mask.device) * T  # [B]
        cuts = torch.stack([ends - T + self.start, ends], 1).reshape(-1)  # [2B]
        return torch.cat([cuts.new_zeros(1), cuts])

    @staticmethod
    def _take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """x [B, T, *F] with rows permuted by index [B, T]."""
        idx = index.reshape(index.shape + (1,) * (x.ndim - 2)).expand(x.shape)
        return torch.gather(x, 1, idx)

    def compact(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, *F] -> [B, T, *F]: each row's masked tokens first, then its real tokens."""
        return self._take(x, self.order)

    def restore(self, x: torch.Tensor) -> torch.Tensor:
        """Inverse of `compact`: [B, T, *F] back in the original positions."""
        return self._take(x, self._inverse)

    def pack(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """[B, T, *F] -> [1, B * T, *F], compacted (None stays None)."""
        if x is None:
            return None
        B, T = self.mask.shape
        return self.compact(x).reshape((1, B * T) + x.shape[2:])

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """[1, B * T, *F] -> [B, T, *F] in the original positions, zero at masked tokens
        (whatever was computed there)."""
        B, T = self.mask.shape
        x = self.restore(x.reshape((B, T) + x.shape[2:]))
        keep = self.mask.reshape((B, T) + (1,) * (x.ndim - 2))
        return torch.where(keep, x, x.new_zeros(()))


def last_real_rows(x: torch.Tensor, keep: torch.Tensor, n: int) -> torch.Tensor:
    """The last n rows of x [B, S, C] whose keep [B, S] (bool) is True, per row, in order:
    [B, n, C]; zeros in front when a row has fewer than n."""
    B, S, C = x.shape
    if n == 0:
        return x.new_zeros(B, 0, C)
    xz = torch.cat([x.new_zeros(B, n, C), x * keep[..., None].to(x.dtype)], dim=1)
    valid = torch.cat([keep.new_ones(B, n), keep], dim=1)  # [B, n + S]
    order = torch.sort(valid.to(torch.uint8), dim=1, stable=True).indices[:, -n:]  # [B, n]
    return torch.gather(xz, 1, order[..., None].expand(B, n, C))


def check_attention_mask(mask, B: int, T: int, device) -> torch.Tensor | None:
    """attention_mask -> bool [B, T] (None when absent; eager code also returns None for a
    mask without zeros). Zeros may stand anywhere (module docstring). Shape, dtype and
    device are checked on the host; the values (0 / 1) too in eager code, and inside the
    graph under torch.compile (no value is read back to the host, so a compiled prefill
    keeps one graph)."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != (B, T):
        shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"attention_mask must be a tensor of shape [B, T] = {(B, T)}, "
                         f"got {shape}")
    if mask.dtype.is_complex or mask.dtype.is_floating_point:
        raise ValueError(f"attention_mask must be bool or integer (1 = token, 0 = masked), "
                         f"got {mask.dtype}")
    if mask.device != device:
        raise ValueError(f"attention_mask is on {mask.device} but q is on {device}")
    binary = "attention_mask must hold only 0 (masked) and 1 (token)"
    if torch.compiler.is_compiling():
        assert_in_graph(((mask == 0) | (mask == 1)).all(), binary)
        return mask.bool()
    if bool(((mask != 0) & (mask != 1)).any()):
        raise ValueError(binary)
    mask = mask.bool()
    return None if bool(mask.all()) else mask
