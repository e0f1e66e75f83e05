"""The compute dtype of a run or an evaluation, by name: "float32" (no autocast) or
"bfloat16" (torch.autocast to bfloat16, parameters and losses stay float32)."""

from __future__ import annotations

import contextlib

import torch

__all__ = ["DTYPES", "autocast_context"]

DTYPES = ("float32", "bfloat16")


def autocast_context(dtype: str, device: torch.device):
    """autocast to bfloat16 on `device` for dtype "bfloat16", otherwise a no-op context."""
    if dtype == "bfloat16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
