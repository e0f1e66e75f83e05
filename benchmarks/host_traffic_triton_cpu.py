"""The PyTorch work around the Triton kernels of one forward + backward, counted on a CPU.

Besides its kernels, a call of `path_attn(backend="triton")` (and of fla's
`parallel_path_attn`; with --op fox, `fox_attn(backend="triton")` and fla's
`parallel_forgetting_attn`) runs PyTorch operations on the device: buffers zeroed for atomics,
dtype conversions, reductions, the gate sums. Each is a kernel launch of its own that reads
and writes device memory. This script runs the host code of one forward + backward on CPU
tensors with every Triton launch replaced by nothing (as `memory_triton_cpu.py`; fla sees
an H100 stand-in) and counts, per PyTorch operation, its calls and the bytes it reads and
writes: views move nothing; an operation reads its tensor arguments whole and writes its
new or mutated outputs (an upper bound for indexing, exact for elementwise work). The
inputs are taken as a GPU call sees them: the CPU-only shortcut of the non-finite check is
off. The last column is the bytes moved at an H100's 3.35 TB/s, a lower bound of that
work's time; gpu_check.py's profiler table measures it.

    python benchmarks/host_traffic_triton_cpu.py                  # T 2048, gates on and off
    python benchmarks/host_traffic_triton_cpu.py --op fox         # forgetting attention
    python benchmarks/host_traffic_triton_cpu.py --seq-lens 8192 --ops --json traffic.json

--ops lists every operation moving at least --min-mib MiB (1), with the source lines that
called it.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections import defaultdict

os.environ["TRITON_INTERPRET"] = "1"  # CPU tensors through backend="triton"; nothing runs

import torch  # noqa: E402
from _attn_gpu import candidates  # noqa: E402  (benchmarks/ is on sys.path)
from memory_triton_cpu import (  # noqa: E402
    _fla,
    _stand_in_h100,
    add_shape_args,
    shapes,
    write_json,
)
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

H100_BYTES_PER_S = 3.35e12
# allocate without touching memory
_ALLOCATE = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}
# write their output without reading a tensor argument
_NO_READ = {"zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "new_zeros",
            "new_full", "new_ones", "zero_", "fill_", "arange", "scalar_tensor"}
# custom ops whose host code is counted inside: name -> module, function
_OPEN = {"path_attn_fwd": ("pathattn.ops.path.triton.op", "_forward"),
         "path_attn_bwd": ("pathattn.ops.path.triton.op", "_backward_kernels"),
         "fox_fwd": ("pathattn.ops.fox.triton.op", "_forward"),
         "fox_bwd": ("pathattn.ops.fox.triton.op", "_backward_kernels")}


def _nbytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


class Traffic(TorchDispatchMode):
    """Per operation name: [calls, bytes read, bytes written, {source line: bytes}]."""

    def __init__(self):
        super().__init__()
        self.ops = defaultdict(lambda: [0, 0, 0, defaultdict(int)])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in _OPEN:
            module, fn = _OPEN[name]
            with self:
                return getattr(sys.modules[module], fn)(*args, **kwargs)
        out = func(*args, **kwargs)
        if name in _ALLOCATE:
            return out
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        storages = {t.untyped_storage().data_ptr() for t in ins}
        fresh = [t for t in outs if t.untyped_storage().data_ptr() not in storages]
        if func._schema.is_mutable:
            written = _nbytes(outs)
        elif outs and not fresh:  # a view of an argument
            return out
        else:
            written = _nbytes(fresh)
        read = 0 if name in _NO_READ else _nbytes(t for t in ins if t.dim() > 0)
        entry = self.ops[name]
        entry[0] += 1
        entry[1] += read
        entry[2] += written
        entry[3][_caller()] += read + written
        return out


def _caller() -> str:
    """The innermost pathattn or fla source line on the stack ("" if none)."""
    for f in reversed(traceback.extract_stack()[:-2]):
        for root in ("pathattn/", "fla/"):
            if root in f.filename:
                return f"{root}{f.filename.split(root, 1)[1]}:{f.lineno}"
    return "(autograd)"


def count(fn) -> Traffic:
    """Run fn() once to warm caches, then once more under `Traffic`."""
    fn()
    with Traffic() as t:
        fn()
    return t


def summary(t: Traffic) -> dict:
    calls = sum(e[0] for e in t.ops.values())
    moved = sum(e[1] + e[2] for e in t.ops.values())
    return {"calls": calls, "mib": round(moved / 2**20, 1),
            "h100_ms": round(moved / H100_BYTES_PER_S * 1e3, 3)}


def _print_ops(name: str, t: Traffic, least: float) -> None:
    print(f"\n{name}: operations moving at least {least} MiB (MiB read / written, calls, "
          "callers)")
    for op, (n, r, w, where) in sorted(t.ops.items(), key=lambda kv: -(kv[1][1] + kv[1][2])):
        if r + w < least * 2**20:
            continue
        lines = ", ".join(f"{k} {v / 2**20:.1f}" for k, v in
                          sorted(where.items(), key=lambda kv: -kv[1]) if v >= least * 2**20)
        print(f"  {op:22s} {r / 2**20:8.1f} / {w / 2**20:8.1f}  x{n:<3d} {lines}")


def _fox_candidates(B: int, T: int, H: int, D: int) -> dict:
    """"path" (ours) and, with fla-core, "fla": fox_attn(backend="triton") and fla's
    parallel_forgetting_attn on the same bfloat16 inputs (g = logsigmoid(randn + 2))."""
    import torch.nn.functional as F
    from _attn_gpu import _candidate

    from pathattn.ops import fox_attn

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, T, H, D, generator=gen).bfloat16().requires_grad_()
               for _ in range(3))
    g = F.logsigmoid(torch.randn(B, T, H, generator=gen) + 2).requires_grad_()
    dout = torch.randn(B, T, H, D, generator=gen).bfloat16()
    out = {"path": _candidate(lambda: fox_attn(q, k, v, g, backend="triton"), [q, k, v, g],
                              dout)}
    try:
        from fla.ops.forgetting_attn import parallel_forgetting_attn
    except ImportError:
        return out
    out["fla"] = _candidate(lambda: parallel_forgetting_attn(q, k, v, g), [q, k, v, g], dout)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shape_args(p, "2048")
    p.add_argument("--ops", action="store_true", help="list the operations and their callers")
    p.add_argument("--min-mib", type=float, default=1.0,
                   help="--ops lists operations and callers moving at least this many MiB")
    p.add_argument("--op", choices=("path", "fox"), default="path")
    a = p.parse_args(argv)
    _stand_in_h100()
    import pathattn.ops.path.nonfinite as nonfinite

    nonfinite._surely_finite = lambda x: False  # a GPU call builds the non-finite masks
    fla = _fla()
    rows = []
    print("| T | B | gates | ours calls | ours MiB | ours H100 ms | fla calls | fla MiB "
          "| fla H100 ms |\n|---|---|---|---|---|---|---|---|---|")
    for T, B in shapes(a):
        for gates in (False, True) if a.op == "path" else (True,):
            cands = (_fox_candidates(B, T, a.heads, a.head_dim) if a.op == "fox" else
                     candidates(B, T, a.heads, a.head_dim, torch.bfloat16, gates,
                                torch.device("cpu"), fla, names=("fla", "path")))
            counted = {n: count(c.fwd_bwd) for n, c in cands.items()}
            s = {n: summary(t) for n, t in counted.items()}
            row = {"T": T, "B": B, "gates": gates, "ours": s["path"], "fla": s.get("fla")}
            rows.append(row)
            f = s.get("fla") or {"calls": "n/a", "mib": "n/a", "h100_ms": "n/a"}
            print(f"| {T} | {B} | {'on' if gates else 'off'} | {s['path']['calls']} | "
                  f"{s['path']['mib']} | {s['path']['h100_ms']} | {f['calls']} | {f['mib']} "
                  f"| {f['h100_ms']} |", flush=True)
            if a.ops:
                for n, t in counted.items():
                    _print_ops(f"{n} T={T} gates={'on' if gates else 'off'}", t, a.min_mib)
    write_json(a.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
