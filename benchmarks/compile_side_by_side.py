"""First-call compilation of the PaTH kernels: one after another, or side by side.

A first forward + backward compiles every kernel of the step. Launched one by one, each
compiles at its launch; the ops instead compile a call's kernels on a thread pool first
(`pathattn.ops.common.triton_launch.compile_ahead`). This script compiles, for sm_90 and
no GPU, the kernels of a forward (UT transform, segment keys, forward scan) and of a
backward (segment keys storing E, Pi, backward query and key scans, segment gradients, UT
backward) both ways, each in a child process with an empty Triton cache, and prints the
seconds side by side and their ratio, with the slowest single kernel of each step (what
side by side tends to with enough free cores):

    python benchmarks/compile_side_by_side.py                    # float32 and bf16, D 64
    python benchmarks/compile_side_by_side.py --dtypes float32 --threads 16 --head-dim 128

On a GPU, `benchmarks/gpu_check.py`'s first-call section measures the whole first call.
The thread count that helps is at most the number of kernels of the larger half (7) and
of free cores; Triton's MLIR passes may hold the interpreter lock part of the time, so
the speed-up is below the core count.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORWARD = ("ut_fwd", "seg", "fwd")
BACKWARD = ("seg", "pi", "bwd", "bwd_kv", "seg_bwd", "ut_bwd_q", "ut_bwd")


def _child(dtype_name: str, D: int, gates: bool, threads: int) -> None:
    """Compile the forward's kernels, then the backward's, with `threads` threads (1: one by
    one); print {"forward": s, "backward": s, "slowest": {step: s}} as JSON, slowest the
    longest single compilation of each step."""
    from concurrent.futures import ThreadPoolExecutor

    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from pathattn.ops.path.triton import fit
    from pathattn.ops.path.triton.config import launch_config

    dtype = getattr(torch, dtype_name)
    capability, limit = fit.DEVICES["sm_90"]
    cfg = launch_config(D, D, dtype, limit, None, (capability // 10, capability % 10))

    def compile_one(kernel: str) -> float:
        t0 = time.perf_counter()
        fn = fit._KERNEL_FN[kernel]
        sig, attrs = fit._signature(fn, dtype, gates)
        constexprs = fit._constexprs(kernel, D, dtype, gates, cfg, 1)
        if kernel == "seg" and step == "forward":
            constexprs["STORE_E"] = False
        warps, stages = cfg.launch(kernel)
        triton.compile(ASTSource(fn, sig, constexprs, attrs),
                       target=GPUTarget("cuda", capability, 32),
                       options={"num_warps": warps, "num_stages": stages})
        return time.perf_counter() - t0

    out: dict = {"slowest": {}}
    for step, kernels in (("forward", FORWARD), ("backward", BACKWARD)):
        t0 = time.perf_counter()
        if threads == 1:
            each = [compile_one(k) for k in kernels]
        else:
            with ThreadPoolExecutor(threads) as pool:
                each = list(pool.map(compile_one, kernels))
        out[step] = time.perf_counter() - t0
        out["slowest"][step] = max(each)
    print(json.dumps(out))


def _measure(dtype: str, D: int, gates: bool, threads: int) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": cache, "TRITON_INTERPRET": "0",
               "TRITON_DEFAULT_FP_FUSION": "1", "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, __file__, "--child", dtype, str(D), str(int(gates)),
               str(threads)]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                   choices=["float32", "bfloat16", "float16"])
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--no-gates", action="store_true")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="threads of the side-by-side run (default: the CPU count)")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        dtype, D, gates, threads = args.child
        _child(dtype, int(D), gates == "1", int(threads))
        return
    if args.threads < 1:
        p.error(f"--threads must be at least 1, got {args.threads}")
    print(f"sm_90, D = {args.head_dim}, gates {'off' if args.no_gates else 'on'}, "
          f"{os.cpu_count()} CPUs, side by side on {args.threads} threads; seconds\n")
    print("| dtype | step | one by one | side by side | ratio | slowest kernel alone |")
    print("|---|---|---|---|---|---|")
    for dtype in args.dtypes:
        serial = _measure(dtype, args.head_dim, not args.no_gates, 1)
        side = _measure(dtype, args.head_dim, not args.no_gates, args.threads)
        for step in ("forward", "backward"):
            print(f"| {dtype} | {step} | {serial[step]:.1f} | {side[step]:.1f} | "
                  f"{side[step] / serial[step]:.2f} | {serial['slowest'][step]:.1f} |",
                  flush=True)
        total_s, total_p = (serial["forward"] + serial["backward"],
                            side["forward"] + side["backward"])
        floor = sum(serial["slowest"].values())
        print(f"| {dtype} | both | {total_s:.1f} | {total_p:.1f} | {total_p / total_s:.2f} | "
              f"{floor:.1f} |", flush=True)


if __name__ == "__main__":
    main()
