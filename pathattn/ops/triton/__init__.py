"""Triton kernels of PaTH attention (forward and backward), behind `path_attn(backend=...)`.

Importing this package does not import Triton: `path_attn_triton` loads the kernels on
first use, so pathattn works without Triton installed. On CPU tensors the kernels run only
under Triton's interpreter (TRITON_INTERPRET=1, set before Triton is imported).

Files: `ut.py` (per-block UT transform and its backward), `fwd.py` (forward scan with online
softmax), `bwd.py` (backward scan), `op.py` (torch.library custom ops with fake and
autograd registrations; the public `path_attn_triton`).
"""

from __future__ import annotations

import importlib.util
import os

import torch

__all__ = ["available", "path_attn_triton", "select_backend", "BACKENDS"]

BACKENDS = ("auto", "torch", "triton")


def available() -> bool:
    """True when the triton package is installed."""
    return importlib.util.find_spec("triton") is not None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def select_backend(backend, q) -> str:
    """Resolve path_attn's `backend` argument to "torch" or "triton".

    "auto": "triton" for CUDA tensors of float32 / bfloat16 / float16 when Triton is
    installed, else "torch". "triton" on CPU tensors needs TRITON_INTERPRET=1.
    """
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        ok = (isinstance(q, torch.Tensor) and q.is_cuda and q.dtype != torch.float64
              and available())
        return "triton" if ok else "torch"
    if backend == "triton":
        if not available():
            raise ValueError("backend='triton' needs the triton package "
                             "(pip install 'pathattn[triton]')")
        if isinstance(q, torch.Tensor) and not q.is_cuda and not _interpreting():
            raise ValueError("backend='triton' needs CUDA tensors, or TRITON_INTERPRET=1 "
                             "(set before importing triton) to run the kernels on the CPU "
                             f"interpreter; got a tensor on {q.device}")
    return backend


def path_attn_triton(*args, **kwargs) -> torch.Tensor:
    """`pathattn.path_attn` on the Triton kernels; see `op.path_attn_triton`."""
    from .op import path_attn_triton as run

    return run(*args, **kwargs)
