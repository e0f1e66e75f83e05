"""Backends of the PaTH attention op: a registry of name -> implementation, and the rule
`backend="auto"` follows. Every public entry point (`path_attn`, `path_attn_with_keys`,
`path_attn_prefill`, `path_attn_step`, `context_parallel_path_attn`, the layers and the
model configs) takes `backend=` and resolves it here, once.

Registered:

    "cpu"     the blockwise algorithm with the fused C++ kernels (CPU tensors of float32 or
              float64; the kernels build on first use, `pathattn.ops.cpu.build`)
    "torch"   the same blockwise algorithm in PyTorch ops (any device and dtype)
    "triton"  Triton kernels (CUDA tensors of float16 / bfloat16 / float32 when triton is
              installed; on CPU tensors only under TRITON_INTERPRET=1), `pathattn.ops.triton`

"auto" picks the first backend, in the order triton, cpu, torch, that takes the inputs
without being asked: triton for CUDA tensors (not float64) when triton is installed; cpu
for CPU tensors of float32 / float64 when the kernels build and PATHATTN_CPU_KERNEL is not
0; torch otherwise. A backend named explicitly that cannot take the inputs raises a
ValueError saying why.

Every backend computes the same function (float32 accumulation for 16-bit inputs); the
conformance suite (`tests/ops/conformance`) runs each registered backend against the
float64 reference. A new backend is one `register_backend(Backend(...))`.

Under torch.compile the choice is made while tracing (a constant of the graph: it depends
on the inputs' device and dtype only) and each backend runs as torch.library custom ops
that the graph holds as single nodes: `pathattn::blockwise_fwd` / `blockwise_bwd` /
`blockwise_fwd_keys` for "cpu" and "torch" (`pathattn.ops.function`, the `kernels` flag
tells them apart), `pathattn::path_attn_fwd` / `path_attn_bwd` for "triton".

Prefill keys (`path_attn_with_keys`) come from the blockwise forward ("cpu" or "torch");
a backend without `with_keys` serves the prefill with its forward plus a key-only pass.
Decode steps are plain PyTorch for every backend (one pass over the cache per token).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["Backend", "register_backend", "unregister_backend", "get_backend", "backend_names",
           "select_backend", "check_backend_name"]


@dataclass(frozen=True)
class Backend:
    """One implementation of the op.

    name: the `backend=` value.
    attention: (q, k, v, w, beta, g, scale: float, cu_seqlens, block_size) -> o
        [B, T, HQ, Dv] in q's dtype, differentiable; inputs already validated, finite
        (`pathattn.ops.nonfinite`), B * T > 0, scale resolved.
    refuses: q -> None when the backend can run tensors like q, else the reason (a
        sentence naming what it needs).
    with_keys: (q, k, v, w, beta, g, scale, cu_seqlens, block_size) -> (o, keys) without
        autograd (`path_attn_with_keys`), or None.
    auto: q -> whether "auto" may pick it for tensors like q (on top of `refuses`); the
        registration order is the priority.
    reflections: whether it takes several reflections per token (w [B, T, H, R, D] with
        R > 1); a backend without is refused such inputs and "auto" passes over it. R = 1
        reaches every backend as w [B, T, H, D].
    """

    name: str
    attention: Callable
    refuses: Callable[[torch.Tensor], str | None]
    with_keys: Callable | None = None
    auto: Callable[[torch.Tensor], bool] = lambda q: True
    reflections: bool = False


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


# ------------------------------------------------------------------ the built-in three

def _blockwise(kernels: bool):
    """The blockwise backends' entries: the custom ops of `pathattn.ops.function`, which
    build the block layout themselves (torch.compile traces them as single nodes)."""

    def attention(q, k, v, w, beta, g, scale, cu_seqlens, block_size):
        from .function import blockwise_attention

        return blockwise_attention(q, k, v, w, beta, g, scale, cu_seqlens, block_size,
                                   kernels)

    def with_keys(q, k, v, w, beta, g, scale, cu_seqlens, block_size):
        from .function import blockwise_fwd_keys

        return blockwise_fwd_keys(q, k, v, w, beta, g, cu_seqlens, scale, block_size,
                                  kernels)

    return attention, with_keys


def _cpu_refuses(q: torch.Tensor) -> str | None:
    from .cpu import kernel_enabled

    if q.device.type != "cpu":
        return f"the C++ kernels take CPU tensors, got a tensor on {q.device}"
    if q.dtype not in (torch.float32, torch.float64):
        return (f"the C++ kernels take float32 or float64, got {q.dtype} (backend='torch' "
                "runs 16-bit inputs on the CPU)")
    if not kernel_enabled():
        return "the C++ kernels are turned off (PATHATTN_CPU_KERNEL=0)"
    if not _kernels_loaded():
        return "the C++ kernels could not be built (see the warning above)"
    return None


@torch.compiler.assume_constant_result
def _kernels_loaded() -> bool:
    """`load_kernels()`, a constant to torch.compile (the first call may build the kernels
    under a lock, which traced code cannot enter)."""
    from .cpu import load_kernels

    return load_kernels()


def _triton_refuses(q: torch.Tensor) -> str | None:
    from . import triton as tr

    if not tr.available():
        return "needs the triton package (pip install 'pathattn[triton]')"
    if q.dtype == torch.float64:
        return "the Triton kernels compute in float32: float64 inputs need backend='torch'"
    if not q.is_cuda and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return ("needs CUDA tensors, or TRITON_INTERPRET=1 (set before importing triton) to "
                f"run the kernels on the CPU interpreter; got a tensor on {q.device}")
    return None


def _triton_attention(q, k, v, w, beta, g, scale, cu_seqlens, block_size):
    from .triton import run_kernels

    return run_kernels(q, k, v, w, beta, g, scale, cu_seqlens, block_size)


# auto takes Triton for CUDA tensors only (the interpreter is for tests)
register_backend(Backend("triton", _triton_attention, _triton_refuses,
                         auto=lambda q: q.is_cuda, reflections=True))
_CPU_ATTN, _CPU_KEYS = _blockwise(kernels=True)
register_backend(Backend("cpu", _CPU_ATTN, _cpu_refuses, with_keys=_CPU_KEYS,
                         reflections=True))
_TORCH_ATTN, _TORCH_KEYS = _blockwise(kernels=False)
register_backend(Backend("torch", _TORCH_ATTN, lambda q: None, with_keys=_TORCH_KEYS,
                         reflections=True))
