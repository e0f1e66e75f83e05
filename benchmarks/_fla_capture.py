"""fla's kernel launches for one head, recorded without a GPU, for `static_vs_fla.py`.

fla's forward and backward (`fla.ops.path_attn.parallel.ParallelPATHAttentionFunction`)
are called on CPU tensors of one sequence and one head with Triton's launches replaced by
a recorder: every `JITFunction.run` is kept (kernel, grid, arguments) and nothing runs, so
the tensors hold garbage but have the shapes, dtypes and launch settings fla gives them on
an H100 (its shared-memory checks answer as on an H100, and its triangular solve takes
the TMA path an H100 has). An autotuned kernel records one launch per configuration: its
autotuner picks by time on the device, so `static_vs_fla.py` counts each and keeps the
fewest instructions (the bound most favourable to fla).

`launches(D, gates, T)` returns `Launch`es in launch order; `compile_args(launch)` the
argument types, compile-time values and divisibility attributes Triton's launcher would
compile it with.
"""

from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass

import torch

__all__ = ["Launch", "launches", "compile_args"]


@dataclass(frozen=True)
class Launch:
    part: str  # "fwd" / "bwd"
    name: str  # the kernel's function name
    fn: object  # its triton JITFunction
    grid: tuple  # programs along each axis
    args: dict  # argument name -> value (tensors, ints, floats, None)
    num_warps: int
    num_stages: int
    config: tuple  # the autotune configuration's own keyword arguments, sorted ((): none)


def _jit(fn):
    from triton.runtime.jit import JITFunction

    while not isinstance(fn, JITFunction):  # under fla's heuristics / autotune wrappers
        fn = fn.fn
    return fn


@functools.cache
def launches(D: int, gates: bool, T: int) -> tuple[Launch, ...]:
    """fla's launches for one sequence of T tokens, one head of head dim D, bf16 q, k, v
    (float32 w, beta and gates, as fla requires), forward then backward."""
    import fla.ops.path_attn.parallel as par  # noqa: PLC0415 (fla is optional)
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    st = sys.modules["fla.ops.utils.solve_tril"]  # the package exports a function so named

    log: list = []
    part = ["fwd"]

    def run(self, *args, grid, warmup=False, **kwargs):
        log.append((part[0], self, grid, args, kwargs, ()))

    def tune(self, *args, **kwargs):
        for cfg in self.configs:
            own = tuple(sorted(cfg.kwargs.items()))
            log.append((part[0], _jit(self.fn), kwargs.get("grid"), args,
                        {**kwargs, **cfg.all_kwargs()}, own))

    saved = (JITFunction.run, Autotuner.run, st.IS_TMA_SUPPORTED)
    patched = [m for m in list(sys.modules.values())
               if getattr(m, "__name__", "").startswith("fla.")
               and hasattr(m, "check_shared_mem")]
    checks = [m.check_shared_mem for m in patched]
    JITFunction.run, Autotuner.run, st.IS_TMA_SUPPORTED = run, tune, True
    for m in patched:
        m.check_shared_mem = lambda *a, **k: True  # as on an H100
    try:
        bf = {"dtype": torch.bfloat16}
        q, k, v = (torch.randn(1, T, 1, D, **bf) for _ in range(3))
        w = torch.randn(1, T, 1, D)
        beta = torch.rand(1, T, 1)
        g = -torch.rand(1, T, 1) if gates else None

        class Ctx:
            def save_for_backward(self, *a):
                self.saved_tensors = a

        ctx = Ctx()
        par.ParallelPATHAttentionFunction.forward(ctx, q, k, v, w, beta, g, D ** -0.5, None)
        part[0] = "bwd"
        par.ParallelPATHAttentionFunction.backward(ctx, torch.randn_like(q), None)
    finally:
        JITFunction.run, Autotuner.run, st.IS_TMA_SUPPORTED = saved
        for m, c in zip(patched, checks, strict=True):
            m.check_shared_mem = c
    out = []
    for p, fn, grid, args, kwargs, own in log:
        names = fn.arg_names
        bound = dict(zip(names, args, strict=False))  # trailing arguments by keyword
        bound.update({k: v for k, v in kwargs.items() if k in names})
        meta = {**bound, **{k: v for k, v in kwargs.items() if k not in names}}
        g3 = grid(meta) if callable(grid) else grid
        out.append(Launch(p, fn.__name__, fn, tuple(int(x) for x in g3), bound,
                          int(kwargs.get("num_warps") or 4),
                          int(kwargs.get("num_stages") or 3), own))
    return tuple(out)


_DT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
       torch.int32: "i32", torch.int64: "i64"}


def compile_args(launch: Launch) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attrs) of a recorded launch, as Triton's launcher
    specializes it: tensors 16-byte aligned, integers divisible by 16 marked so (not those
    the kernel lists in do_not_specialize) and integers equal to 1 passed as constants."""
    fn = launch.fn
    sig, const, attrs = {}, {}, {}
    nospec = set(getattr(fn, "do_not_specialize", ()) or ())
    nospec |= {fn.arg_names[i] if isinstance(i, int) else i for i in nospec if isinstance(i, int)}
    for i, name in enumerate(fn.arg_names):
        value = launch.args.get(name)
        if i in fn.constexprs:
            sig[name], const[name] = "constexpr", value
        elif value is None:
            sig[name], const[name] = "constexpr", None
        elif isinstance(value, torch.Tensor):
            sig[name] = "*" + _DT[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            sig[name] = "i1"
        elif isinstance(value, int):
            if value == 1 and name not in nospec:
                sig[name], const[name] = "constexpr", 1
            else:
                sig[name] = "i64" if abs(value) >= 2 ** 31 else "i32"
                if value % 16 == 0 and name not in nospec:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            sig[name] = "fp32"
        else:
            raise TypeError(f"{launch.name}: argument {name} of type {type(value).__name__}")
    return sig, const, attrs


def programs(launch: Launch) -> int:
    """Programs of the launch (one head, one sequence)."""
    return math.prod(launch.grid)
