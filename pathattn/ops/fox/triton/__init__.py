"""Triton kernels of forgetting attention (FlashAttention-2 with a gate term), behind
`fox_attn(backend="triton")`.

Importing this package does not import Triton: `fox_attn_triton` loads the kernels on
first use. On CPU tensors the kernels run only under Triton's interpreter
(TRITON_INTERPRET=1, set before Triton is imported).

Files: `_common.py` (tile loads, products, the gate term), `gates.py` (per-sequence
cumulative sums of the gates), `fwd.py` (forward), `bwd.py` (the two backward kernels),
`op.py` (torch.library custom ops with autograd), `config.py` (tile length, warps and
stages), `fit.py` (the specializations the launcher runs, for ahead-of-time compilation).
"""

from __future__ import annotations

import importlib.util

import torch

__all__ = ["available", "fox_attn_triton"]


def available() -> bool:
    """True when the triton package is installed."""
    return importlib.util.find_spec("triton") is not None


def fox_attn_triton(*args, **kwargs) -> torch.Tensor:
    """The kernels on validated inputs; see `op.fox_attn_triton`."""
    from .op import fox_attn_triton as run

    return run(*args, **kwargs)
