"""Triton kernels of PaTH attention (forward and backward), behind `path_attn(backend=...)`.

Importing this package does not import Triton: `path_attn_triton` loads the kernels on
first use, so pathattn works without Triton installed. On CPU tensors the kernels run only
under Triton's interpreter (TRITON_INTERPRET=1, set before Triton is imported).

Files: `ut.py` (per-block UT transform and its backward), `segments.py` (keys moved to their
segment's end and whole-segment transitions, and their backward), `fwd.py` (forward scan
with online softmax), `bwd.py` (backward scan), `op.py` (torch.library custom ops with fake and
autograd registrations; the public `path_attn_triton`), `config.py` (block length,
num_warps and num_stages per head dim, dtype, reflections per token and GPU: every
configuration fits the device's shared memory), `fit.py` (ahead-of-time compilation for
sm_80 / sm_90 that checks it).
"""

from __future__ import annotations

import importlib.util

import torch

__all__ = ["available", "path_attn_triton", "run_kernels"]


def available() -> bool:
    """True when the triton package is installed."""
    return importlib.util.find_spec("triton") is not None


def path_attn_triton(*args, **kwargs) -> torch.Tensor:
    """`pathattn.path_attn` on the Triton kernels; see `op.path_attn_triton`."""
    from .op import path_attn_triton as run

    return run(*args, **kwargs)


def run_kernels(*args, **kwargs) -> torch.Tensor:
    """The kernels on validated inputs; see `op.run_kernels` (the registry's entry)."""
    from .op import run_kernels as run

    return run(*args, **kwargs)
