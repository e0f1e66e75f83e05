"""Optional backend "fla": flash-linear-attention's PaTH kernels (`fla-core`,
`fla.ops.path_attn.parallel_path_attn`, another implementation of the paper's blockwise
algorithm, section 3.3) behind `path_attn(..., backend="fla")`, to compare with our own.

Registered always, never picked by "auto". `refuses` names what is missing: fla-core not
installed, a tensor off CUDA, float64, a head dim fla's kernels lack. The adapter maps
path_attn's contract onto fla's:

- w and beta reach fla in float32 (fla asserts it); their gradients flow back through the
  casts, in the caller's dtypes.
- fla multiplies the gate term by the scale too (fla(g=g_fla) is path_attn(g=g_fla *
  scale)), so g reaches it as g / scale, in float32.
- cu_seqlens as int64; GQA as is (fla takes HQ a multiple of H); block_size is ignored
  (fla picks its own chunk lengths); one reflection per token only (the registry refuses
  w [B, T, H, R, D] with R > 1).
- Value head dims outside fla's set raise a ValueError (the registry's `refuses` sees q
  only); o comes back in q's dtype.

fla wraps its function in torch.compiler.disable: under torch.compile this backend runs
eagerly, behind graph breaks. It has no `with_keys`, so `path_attn_with_keys`, the prefill
and context parallelism refuse it. See docs/ops.md, "Backends and the auto rule".
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

__all__ = ["HEAD_DIMS", "DEVICE_TYPES", "kernel", "refuses", "attention"]

HEAD_DIMS = (16, 32, 64, 128)  # fla asserts q's and v's head dims are among these
DEVICE_TYPES = ("cuda",)  # fla's Triton kernels launch on CUDA tensors
INSTALL = "needs fla-core (pip install fla-core)"


def kernel() -> tuple[Callable | None, str | None]:
    """(fla's parallel_path_attn, None), or (None, why) when fla-core cannot be imported."""
    try:
        module = importlib.import_module("fla.ops.path_attn")
    except ModuleNotFoundError as e:
        if e.name is not None and e.name.split(".")[0] != "fla":  # a dependency of fla
            return None, f"{INSTALL}; importing it failed: {e}"
        return None, INSTALL
    except Exception as e:  # noqa: BLE001 - any failure to import means "not available"
        return None, f"{INSTALL}; importing it failed: {e!r}"
    fn = getattr(module, "parallel_path_attn", None)
    if fn is None:
        return None, f"{INSTALL}: fla.ops.path_attn has no parallel_path_attn"
    return fn, None


def refuses(q: torch.Tensor) -> str | None:
    """Why fla cannot run tensors like q [B, T, HQ, D], or None."""
    fn, why = kernel()
    if fn is None:
        return why
    if q.device.type not in DEVICE_TYPES:
        return f"fla's kernels take CUDA tensors, got a tensor on {q.device}"
    if q.dtype == torch.float64:
        return "fla's kernels compute in float32: float64 inputs need backend='torch'"
    if q.shape[-1] not in HEAD_DIMS:
        return f"fla's kernels take head dims {HEAD_DIMS}, got head dim D={q.shape[-1]}"
    return None


def attention(q, k, v, w, beta, g, scale: float, cu_seqlens, block_size) -> torch.Tensor:
    """The registry's entry (`Backend.attention`): o [B, T, HQ, Dv] in q's dtype from fla's
    parallel_path_attn; ValueError when Dv is not in `HEAD_DIMS`. block_size is ignored."""
    if v.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"backend='fla': fla's kernels take value head dims {HEAD_DIMS}, "
                         f"got head dim Dv={v.shape[-1]}")
    fn, why = kernel()
    if fn is None:
        raise ValueError(f"backend='fla': {why}")
    g_fla = None if g is None else g.float() / scale  # [B, T, HQ]: fla scales G_i - G_j
    cu = None if cu_seqlens is None else cu_seqlens.long()
    o, _ = fn(q, k, v, w.float(), beta.float(), g_fla, scale=scale, cu_seqlens=cu)
    return o.to(q.dtype)
