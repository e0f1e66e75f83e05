"""Kernel launches of the Triton ops, and their first-call compilation side by side.

Every op launches its kernels through `launch_kernel`. `compile_ahead(keys, device, run)`
runs `run` once as a compile-only pass, in which each `launch_kernel` submits its
kernel's compilation for exactly the arguments it is given to a thread pool (Triton's
AsyncCompileMode) instead of launching it; the real call that follows finds every kernel
compiled. PATHATTN_COMPILE_THREADS sets the pool's size (default: the usable CPUs, shared
among a node's processes; 1 turns the pass off). docs/ops.md ("Triton kernels") gives the
reasons and the limits.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import warnings
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

__all__ = ["launch_kernel", "compile_ahead", "compile_ahead_status", "compile_only",
           "compile_threads", "grad_follows", "launch_log", "recording", "specialisation"]

_DRY = contextvars.ContextVar("pathattn_compile_only", default=False)
_LOG: contextvars.ContextVar[list | None] = contextvars.ContextVar("pathattn_launch_log",
                                                                    default=None)
_RECORD: contextvars.ContextVar[Callable | None] = contextvars.ContextVar(
    "pathattn_launch_recorder", default=None)
_DONE: set = set()
_BROKEN: list = []  # the error that turned the pass off, if one did


def launch_kernel(kernel, grid) -> Callable:
    """`kernel[grid]`: the callable that launches `kernel` on `grid` with the arguments it
    is given; inside a compile-only pass (`compile_ahead`), one that compiles it for those
    arguments without launching."""
    record = _RECORD.get()
    if record is not None:
        return record(kernel, grid)
    log = _LOG.get()
    if log is not None:
        return _logged(log, kernel, grid)
    if _DRY.get():
        return functools.partial(kernel.warmup, grid=grid)
    return kernel[grid]


def _logged(log: list, kernel, grid) -> Callable:
    def call(*args, **kwargs):
        name = getattr(kernel, "fn", kernel).__name__
        constexprs = tuple(sorted((k, repr(v)) for k, v in kwargs.items()))
        dtypes = tuple(a.dtype if isinstance(a, torch.Tensor) else type(a).__name__
                       for a in args)
        log.append((_DRY.get(), name, tuple(grid), dtypes, constexprs))
        if not _DRY.get():
            kernel[grid](*args, **kwargs)
    return call


@contextlib.contextmanager
def recording(recorder: Callable):
    """Inside the block, `launch_kernel(kernel, grid)` returns `recorder(kernel, grid)`
    instead of a launch (`pathattn.ops.common.compiled_launches` records and checks the
    compiled kernels there)."""
    token = _RECORD.set(recorder)
    try:
        yield
    finally:
        _RECORD.reset(token)


@contextlib.contextmanager
def launch_log():
    """Yields a list that collects, for each `launch_kernel` inside the block, (compile_only,
    kernel name, grid, argument dtypes / types, keyword arguments): what a call launches
    and what its compile-only pass compiled. Launches still run; compile-only ones do
    nothing."""
    log: list = []
    token = _LOG.set(log)
    try:
        yield log
    finally:
        _LOG.reset(token)


def specialised(n: int) -> int:
    """How Triton specialises an integer argument: 1, divisible by 16, or neither (0)."""
    return 1 if n == 1 else 16 if n % 16 == 0 else 0


def specialisation(*args) -> tuple:
    """A hashable summary of call arguments [B, T, ...] as they reach the kernels, for a
    `compile_ahead` key: per tensor its dtype, its sizes past the first two, and how the
    token count B * T and each stride specialise; None as None; an int as `specialised`;
    anything else as itself."""
    def one(x):
        if isinstance(x, torch.Tensor):
            tokens = x.shape[0] * x.shape[1] if x.ndim >= 2 else x.numel()
            return (x.dtype, tuple(x.shape[2:]), specialised(tokens),
                    tuple(specialised(s) for s in x.stride()))
        if isinstance(x, bool) or x is None:
            return x
        return specialised(x) if isinstance(x, int) else x
    return tuple(one(x) for x in args)


def compile_threads() -> int:
    """Threads compiling kernels side by side: PATHATTN_COMPILE_THREADS, else the CPUs this
    process may run on shared among the local processes of a launcher that sets
    LOCAL_WORLD_SIZE (torchrun). A ValueError names the variable when it is not a positive
    integer."""
    raw = os.environ.get("PATHATTN_COMPILE_THREADS", "")
    if raw == "":
        cpus = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                else os.cpu_count() or 1)
        try:
            local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        except ValueError:
            local = 1
        return max(1, cpus // local)
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"PATHATTN_COMPILE_THREADS must be a positive integer, got {raw!r}")
    return n


def _can_compile_ahead(device: torch.device) -> bool:
    """A GPU launch outside CUDA-graph capture, with a pool of more than one thread, a
    Triton that compiles asynchronously (and is not doing so for a caller already), and no
    earlier failure of the pass."""
    if device.type != "cuda" or _BROKEN or compile_threads() < 2:
        return False
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False
    if torch.cuda.is_current_stream_capturing():
        return False
    try:
        from triton.runtime import _async_compile
    except ImportError:
        return False
    return _async_compile.active_mode.get() is None  # not inside a caller's own


@contextlib.contextmanager
def compile_only():
    """Inside the block, every `launch_kernel` compiles its kernel for the arguments it is given
    (`kernel.warmup`) instead of launching it; under Triton's AsyncCompileMode the
    compilations run on its pool."""
    token = _DRY.set(True)
    try:
        yield
    finally:
        _DRY.reset(token)


@contextlib.contextmanager
def _compiling():
    """The compile-only pass: launches submit their compilation to a pool; leaving the
    block waits for every one (a kernel that fails to compile is left to its real launch,
    which raises the error where it belongs)."""
    from triton.runtime import _async_compile

    with ThreadPoolExecutor(compile_threads(), thread_name_prefix="pathattn-compile") as pool:
        mode = _async_compile.AsyncCompileMode(pool, ignore_errors=True)
        try:
            with mode, compile_only():
                yield
        finally:
            if _async_compile.active_mode.get() is mode:  # an error left it active
                _async_compile.active_mode.set(None)


def compile_ahead(keys: Sequence[Hashable], device: torch.device,
                  run: Callable[[], object]) -> None:
    """Unless every key of `keys` has been compiled ahead (and only for a CUDA `device`):
    call `run()` as a compile-only pass, so that every kernel it launches compiles side by
    side, then mark every key done. `run` must launch the kernels of the calls the keys
    stand for with the same arguments (same shapes, dtypes and constants): a forward's
    pass may cover its backward too. An error in the pass turns it off for the process
    with a warning; the real calls then compile their kernels one by one."""
    if all(key in _DONE for key in keys) or not _can_compile_ahead(device):
        return
    try:
        with _compiling():
            run()
    except Exception as e:  # the real call runs next and raises real errors itself
        _BROKEN.append(e)
        warnings.warn(f"pathattn: compiling the Triton kernels side by side failed ({e!r}); "
                      "they compile one by one at their launch", RuntimeWarning,
                      stacklevel=2)
        return
    _DONE.update(keys)


def compile_ahead_status() -> dict:
    """{"keys": configurations compiled ahead so far in this process, "threads": the pool's
    size, "error": the error that turned the pass off (repr), or None}."""
    return {"keys": len(_DONE), "threads": compile_threads(),
            "error": repr(_BROKEN[0]) if _BROKEN else None}


def grad_follows(*inputs) -> bool:
    """Inside an op's forward: whether a backward is likely to follow, i.e. an input
    requires grad (a custom op's forward runs with grad mode off, so this is the sign
    left). A wrong guess costs one backward's compilation ahead, never a result."""
    return any(x is not None and x.requires_grad for x in inputs)
