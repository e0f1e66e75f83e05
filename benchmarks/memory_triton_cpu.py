"""Peak extra memory of the Triton path's forward + backward, and fla's, counted on a CPU.

What a GPU run allocates is decided by the host code: every buffer the kernels read and
write is a torch tensor the op creates before it launches them. This script runs that host
code on CPU tensors with every Triton kernel launch replaced by nothing (ours and fla's),
under torch's memory profiler, and reports per implementation the peak of the bytes
allocated during one forward + backward beyond the inputs (what `gpu_check.py`'s
`*_peak_mib` measures with `torch.cuda.max_memory_allocated` on a GPU, up to the CUDA
allocator's 512-byte rounding and the workspaces of a few torch ops that differ between
devices). The shapes are `gpu_check.py`'s: B * T = 32768, H = 16, D = 64, bfloat16, gates
on and off. fla sees an H100 (its Hopper block sizes) through a stand-in for the CUDA driver;
its column reads "n/a" when fla-core is not installed.

    python benchmarks/memory_triton_cpu.py                 # T 2048, 8192, 16384
    python benchmarks/memory_triton_cpu.py --seq-lens 16384 --json mem.json

With B * T fixed, memory linear in T is a flat column; a T x T term grows with T.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"  # CPU tensors through backend="triton"; nothing runs

import torch  # noqa: E402
from _attn_gpu import candidates  # noqa: E402  (benchmarks/ is on sys.path)
from torch.profiler import ProfilerActivity, profile  # noqa: E402

H100 = {"max_shared_mem": 232448, "multiprocessor_count": 132, "max_num_regs": 65536,
        "warpSize": 32, "name": "NVIDIA H100 80GB HBM3"}


class _H100Props:
    name, major, minor = H100["name"], 9, 0
    multi_processor_count, total_memory = 132, 80 << 30


def _stand_in_h100() -> None:
    """What fla asks of the device at import and call time (shared memory, name,
    capability): an H100's answers. Every Triton launch then does nothing."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver
    from triton.runtime.jit import KernelInterface

    class Utils:
        def get_device_properties(self, device):
            return dict(H100)

    class Driver:
        utils = Utils()

        def get_current_device(self):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    driver.set_active(Driver())
    torch.cuda.device_count = lambda: 1
    torch.cuda.get_device_name = lambda *a: H100["name"]
    torch.cuda.get_device_capability = lambda *a: (9, 0)
    torch.cuda.get_device_properties = lambda *a: _H100Props()
    KernelInterface.__getitem__ = lambda self, grid: (lambda *args, **kwargs: None)


def _fla():
    try:
        from fla.ops.path_attn.parallel import parallel_path_attn
    except ImportError:
        return None
    return parallel_path_attn


def peak_extra_mib(fn) -> float:
    """Peak of the bytes allocated during fn() beyond those allocated before, in MiB (the
    profiler's allocation and free events, in order)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
        fn()
    now = peak = 0
    events = sorted((e.start_ns(), e.nbytes()) for e in p.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    for _, n in events:
        now += n
        peak = max(peak, now)
    return peak / 2**20


def add_shape_args(p: argparse.ArgumentParser, seq_lens: str) -> None:
    """The shape options of the CPU-counted Triton benchmarks (and --json)."""
    p.add_argument("--seq-lens", default=seq_lens)
    p.add_argument("--tokens", type=int, default=32768, help="B * T")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--json", default=None)


def shapes(a: argparse.Namespace):
    """(T, B) per --seq-lens entry, B = max(1, --tokens // T)."""
    for T in (int(t) for t in a.seq_lens.split(",")):
        yield T, max(1, a.tokens // T)


def write_json(path: str | None, rows: list) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shape_args(p, "2048,8192,16384")
    a = p.parse_args(argv)
    _stand_in_h100()
    fla = _fla()
    rows = []
    print("| T | B | gates | ours MiB | fla MiB | ours / fla |\n|---|---|---|---|---|---|")
    for T, B in shapes(a):
        for gates in (False, True):
            cands = candidates(B, T, a.heads, a.head_dim, torch.bfloat16, gates,
                               torch.device("cpu"), fla, names=("fla", "path"))
            ours = peak_extra_mib(cands["path"].fwd_bwd)
            theirs = peak_extra_mib(cands["fla"].fwd_bwd) if "fla" in cands else None
            ratio = f"{ours / theirs:.2f}" if theirs else "n/a"
            row = {"T": T, "B": B, "gates": gates, "ours_mib": round(ours, 1),
                   "fla_mib": None if theirs is None else round(theirs, 1)}
            rows.append(row)
            print(f"| {T} | {B} | {'on' if gates else 'off'} | {ours:.1f} | "
                  f"{'n/a' if theirs is None else f'{theirs:.1f}'} | {ratio} |", flush=True)
    write_json(a.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
