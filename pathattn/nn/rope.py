"""Rotary position embedding (RoPE), the fixed-rotation special case of PaTH (paper section
2.1): a query or key at position t is rotated in the planes (d, d + D/2) by the angles
t * base^(-2d/D), d < D/2 (the "rotate half" layout of GPT-NeoX / Llama).
"""

from __future__ import annotations

import torch
import torch.nn as nn

__all__ = ["RotaryEmbedding", "apply_rotary"]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D] rotated by angles with cos, sin [B, T, 1, D] (or broadcastable):
    x * cos + rotate_half(x) * sin, with rotate_half(x) = cat(-x[D/2:], x[:D/2])."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class RotaryEmbedding(nn.Module):
    """Rotary embedding on a head dim D (even) with the given base (10000).

    `forward(x, positions)`: x [B, T, H, D], positions [B, T] or [T] integer (0-based).
    The angles are computed in float32 (float64 for float64 x); x keeps its dtype.
    """

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {head_dim}")
        self.head_dim, self.base = head_dim, float(base)
        exponent = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
        self.register_buffer("inv_freq", self.base ** -exponent, persistent=False)  # [D/2]

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base}"

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cd = torch.float64 if x.dtype == torch.float64 else torch.float32
        pos = positions.to(device=x.device, dtype=torch.float64)
        pos = pos.expand(x.shape[0], x.shape[1]) if pos.ndim == 1 else pos  # [B, T]
        ang = pos[..., None] * self.inv_freq.to(x.device)  # [B, T, D/2] float64
        ang = torch.cat([ang, ang], dim=-1)[:, :, None, :]  # [B, T, 1, D]
        cos, sin = ang.cos().to(cd), ang.sin().to(cd)
        return apply_rotary(x.to(cd), cos, sin).to(x.dtype)
