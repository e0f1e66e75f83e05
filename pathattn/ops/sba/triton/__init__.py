"""Triton kernels of stick-breaking attention (log space, right-to-left key tiles), behind
`sb_attn(backend="triton")`.

Importing this package does not import Triton: `sb_attn_triton` loads the kernels on first
use. On CPU tensors the kernels run only under Triton's interpreter (TRITON_INTERPRET=1,
set before Triton is imported).

Files: `_common.py` (the tile math in base-2 log space), `fwd.py` (forward), `bwd.py` (the
query-parallel and key-parallel backward kernels), `op.py` (torch.library custom ops with
autograd), `config.py` (tile lengths, warps and stages), `fit.py` (the specializations the
launcher runs, for ahead-of-time compilation). Design and exactness: docs/sba.md.
"""

from __future__ import annotations

import importlib.util

import torch

__all__ = ["available", "sb_attn_triton", "check_block_size"]


def available() -> bool:
    """True when the triton package is installed."""
    return importlib.util.find_spec("triton") is not None


def sb_attn_triton(*args, **kwargs) -> torch.Tensor:
    """The kernels on validated inputs; see `op.sb_attn_triton`."""
    from .op import sb_attn_triton as run

    return run(*args, **kwargs)


def check_block_size(block_size) -> None:
    """ValueError unless block_size is None or a power of two in [16, 128]; see
    `op.check_block_size`."""
    from .op import check_block_size as check

    check(block_size)
