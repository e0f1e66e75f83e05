"""Backends of the PaTH attention op: a registry of name -> implementation, and the rule
`backend="auto"` follows (docs/ops.md, "Backends and the auto rule"). Registered: "triton",
"cpu", "torch", in auto priority order, and "fla" (fla-core's kernels, `pathattn.ops.path.fla`),
named only; a new backend is one `register_backend(Backend(...))`.
Every entry point that takes `backend=` resolves it here, once.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import cpu, fla
from . import triton as tr
from .function import blockwise_attention, blockwise_fwd_keys

__all__ = ["Backend", "register_backend", "unregister_backend", "get_backend", "backend_names",
           "select_backend", "check_backend_name", "keys_backend"]


@dataclass(frozen=True)
class Backend:
    """One implementation of the op.

    name: the `backend=` value.
    attention: (q, k, v, w, beta, g, scale: float, cu_seqlens, block_size) -> o
        [B, T, HQ, Dv] in q's dtype, differentiable; inputs already validated, finite
        (`pathattn.ops.path.nonfinite`), B * T > 0, scale resolved.
    refuses: q -> None when the backend can run tensors like q, else the reason (a
        sentence naming what it needs).
    with_keys: (q, k, v, w, beta, g, scale, cu_seqlens, block_size) -> (o, keys) without
        autograd (`path_attn_with_keys`), or None.
    auto: q -> whether "auto" may pick it for tensors like q (on top of `refuses`); the
        registration order is the priority.
    reflections: whether it takes several reflections per token (w [B, T, H, R, D] with
        R > 1); a backend without is refused such inputs and "auto" passes over it. R = 1
        reaches every backend as w [B, T, H, D].
    sanitizes: whether `attention` reads every non-finite entry of q, k, v, w, beta and g
        as 0 itself; it then gets the inputs as they are (no cleaned copies) and the op
        still sets the rows the definition makes non-finite to NaN.
    """

    name: str
    attention: Callable
    refuses: Callable[[torch.Tensor], str | None]
    with_keys: Callable | None = None
    auto: Callable[[torch.Tensor], bool] = lambda q: True
    reflections: bool = False
    sanitizes: bool = False


_REGISTRY: dict[str, Backend] = {}


def register_backend(backend: Backend) -> Backend:
    """Add `backend` (a ValueError when its name is taken or is "auto"); returns it."""
    if backend.name == "auto" or backend.name in _REGISTRY:
        raise ValueError(f"backend name {backend.name!r} is taken")
    _REGISTRY[backend.name] = backend
    return backend


def unregister_backend(name: str) -> Backend:
    """Remove the registered backend `name` (a plugin or test undoing its registration);
    returns it, ValueError naming the registered ones when it is not registered."""
    if name == "auto":
        raise ValueError('backend "auto" is the selection rule, not a registered backend')
    backend = get_backend(name)
    del _REGISTRY[name]
    return backend


def backend_names() -> tuple[str, ...]:
    """Registered names, in auto priority order."""
    return tuple(_REGISTRY)


def get_backend(name: str) -> Backend:
    """The registered backend `name` (ValueError naming the registered ones otherwise)."""
    check_backend_name(name)
    return _REGISTRY[name]


def check_backend_name(name) -> str:
    """`name` when it is "auto" or registered; ValueError otherwise."""
    if not isinstance(name, str) or (name != "auto" and name not in _REGISTRY):
        raise ValueError(f"backend must be one of {('auto',) + backend_names()}, got "
                         f"{name!r}")
    return name


def select_backend(name: str, q: torch.Tensor, reflections: int = 1) -> Backend:
    """The backend that runs q for `backend=name` (module docstring: the auto rule), with
    `reflections` (R) reflections per token."""
    check_backend_name(name)
    if name != "auto":
        backend = _REGISTRY[name]
        why = _refuses(backend, q, reflections)
        if why is not None:
            raise ValueError(f"backend={name!r}: {why}")
        return backend
    for backend in _REGISTRY.values():
        if backend.auto(q) and _refuses(backend, q, reflections) is None:
            return backend
    raise ValueError(f"no backend takes these inputs ({q.dtype} on {q.device})")


def _refuses(backend: Backend, q: torch.Tensor, reflections: int) -> str | None:
    """Why `backend` cannot run q with R = reflections per token, or None."""
    if reflections > 1 and not backend.reflections:
        takers = [n for n, b in _REGISTRY.items() if b.reflections]
        return (f"takes one reflection per token (w [B, T, H, D], beta [B, T, H]), got "
                f"R={reflections} (w [B, T, H, R, D]); backends that take several: {takers}")
    return backend.refuses(q)


def keys_backend(backend: str, q: torch.Tensor, what: str = "path_attn_with_keys",
                 reflections: int = 1) -> Backend:
    """The blockwise backend of `path_attn_with_keys` (and of context parallelism, `what`
    names the caller): `backend` when it provides the keys; for "auto" the first of "cpu",
    "torch" that takes q (both take any number of reflections per token)."""
    if backend == "auto":
        cpu = get_backend("cpu")
        return cpu if cpu.refuses(q) is None else get_backend("torch")
    impl = select_backend(backend, q, reflections)
    if impl.with_keys is None:
        raise ValueError(f"backend={backend!r}: {what} runs on the blockwise backends "
                         "'cpu' and 'torch'")
    return impl


# ------------------------------------------------------------------ the built-in three

def _blockwise(kernels: bool):
    """The blockwise backends' entries: the custom ops of `pathattn.ops.path.function`, which
    build the block layout themselves (torch.compile traces them as single nodes)."""

    def attention(q, k, v, w, beta, g, scale, cu_seqlens, block_size):
        return blockwise_attention(q, k, v, w, beta, g, scale, cu_seqlens, block_size,
                                   kernels)

    def with_keys(q, k, v, w, beta, g, scale, cu_seqlens, block_size):
        return blockwise_fwd_keys(q, k, v, w, beta, g, cu_seqlens, scale, block_size,
                                  kernels)

    return attention, with_keys


def _cpu_refuses(q: torch.Tensor) -> str | None:
    if q.device.type != "cpu":
        return f"the C++ kernels take CPU tensors, got a tensor on {q.device}"
    if q.dtype not in (torch.float32, torch.float64):
        return (f"the C++ kernels take float32 or float64, got {q.dtype} (backend='torch' "
                "runs 16-bit inputs on the CPU)")
    if not cpu.kernel_enabled():
        return "the C++ kernels are turned off (PATHATTN_CPU_KERNEL=0)"
    if not _kernels_loaded():
        return "the C++ kernels could not be built (see the warning above)"
    return None


@torch.compiler.assume_constant_result
def _kernels_loaded() -> bool:
    """`load_kernels()`, a constant to torch.compile (the first call may build the kernels
    under a lock, which traced code cannot enter)."""
    return cpu.load_kernels()


def _triton_refuses(q: torch.Tensor) -> str | None:
    if not tr.available():
        return "needs the triton package (pip install 'pathattn[triton]')"
    if q.dtype == torch.float64:
        return "the Triton kernels compute in float32: float64 inputs need backend='torch'"
    if not q.is_cuda and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return ("needs CUDA tensors, or TRITON_INTERPRET=1 (set before importing triton) to "
                f"run the kernels on the CPU interpreter; got a tensor on {q.device}")
    return None


def _triton_attention(q, k, v, w, beta, g, scale, cu_seqlens, block_size):
    return tr.run_kernels(q, k, v, w, beta, g, scale, cu_seqlens, block_size)


# auto takes Triton for CUDA tensors only (the interpreter is for tests)
register_backend(Backend("triton", _triton_attention, _triton_refuses,
                         auto=lambda q: q.is_cuda, reflections=True, sanitizes=True))
_CPU_ATTN, _CPU_KEYS = _blockwise(kernels=True)
register_backend(Backend("cpu", _CPU_ATTN, _cpu_refuses, with_keys=_CPU_KEYS,
                         reflections=True))
_TORCH_ATTN, _TORCH_KEYS = _blockwise(kernels=False)
register_backend(Backend("torch", _TORCH_ATTN, lambda q: None, with_keys=_TORCH_KEYS,
                         reflections=True))
# optional: fla-core's kernels, for comparison; run only when named
register_backend(Backend("fla", fla.attention, fla.refuses, auto=lambda q: False))
