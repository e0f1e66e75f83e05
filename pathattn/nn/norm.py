"""RMSNorm over the last dimension: the model's block norms and the layers' per-head QK norm."""

from __future__ import annotations

import torch
import torch.nn as nn

__all__ = ["RMSNorm"]


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last dim (weight [size], init 1); computed in float32 for
    16-bit x, returned in x's dtype."""

    def __init__(self, size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., size] -> [..., size]."""
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.to(y.dtype)).to(x.dtype)
