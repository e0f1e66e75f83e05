"""Error measures shared by the op tests."""

from __future__ import annotations

import torch

__all__ = ["rel_err"]


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64 (the absolute error ||x - ref|| when ref is zero)."""
    diff = (x.double() - ref.double()).norm()
    den = ref.double().norm()
    return float(diff / den) if den > 0 else float(diff)
