"""First-call compilation of the PaTH kernels: one by one, or side by side.

A first training step compiles every kernel of a forward and a backward. Launched one by
one, each compiles at its launch; the ops instead compile them on a thread pool first
(`pathattn.ops.common.triton_launch.compile_ahead`: a forward whose inputs require grad
compiles the backward's kernels too). This script compiles, for sm_90 and no GPU, the
kernels of a forward (UT transform, segment keys, forward scan) and of a backward (segment
keys storing E, Pi, backward query and key scans, segment gradients, UT backward) both
ways, each in a child process with an empty Triton cache, and prints the seconds side by
side, their ratio, and the slowest single kernel (what side by side tends to with as many
free cores as kernels):

    python benchmarks/compile_side_by_side.py                    # float32 and bf16, D 64
    python benchmarks/compile_side_by_side.py --dtypes float32 --threads 16 --head-dim 128

On a GPU, `benchmarks/gpu_check.py`'s first-call section measures the whole first call.
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
BACKWARD = ("seg", "pi", "bwd", "bwd_kv", "seg_bwd", "ut_bwd_q", "ut_bwd_dk", "ut_bwd",
            "ut_bwd_inv")


def _child(dtype_name: str, D: int, gates: bool, threads: int) -> None:
    """threads 1: compile the forward's kernels one by one, then the backward's; print
    {"forward": s, "backward": s, "slowest": s}. Else compile all of them at once on
    `threads` threads, as a training forward's compile-only pass does; print {"step": s}."""
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

    def compile_one(job: tuple[str, bool]) -> float:
        kernel, in_forward = job
        t0 = time.perf_counter()
        fn = fit._KERNEL_FN[kernel]
        sig, attrs = fit._signature(fn, dtype, gates)
        constexprs = fit._constexprs(kernel, D, dtype, gates, cfg, 1)
        if kernel == "seg" and in_forward:  # the forward's segment keys store no E
            constexprs["STORE_E"] = False
        warps, stages = cfg.launch(kernel)
        regs = cfg.max_registers(kernel)
        triton.compile(ASTSource(fn, sig, constexprs, attrs),
                       target=GPUTarget("cuda", capability, 32),
                       options={"num_warps": warps, "num_stages": stages,
                                **({"maxnreg": regs} if regs else {})})
        return time.perf_counter() - t0

    fwd = [(k, True) for k in FORWARD]
    bwd = [(k, False) for k in BACKWARD]
    out: dict = {}
    if threads == 1:
        each = []
        for step, jobs in (("forward", fwd), ("backward", bwd)):
            t0 = time.perf_counter()
            each += [compile_one(j) for j in jobs]
            out[step] = time.perf_counter() - t0
        out["slowest"] = max(each)
    else:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(compile_one, fwd + bwd))
        out["step"] = time.perf_counter() - t0
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
    if args.threads < 2:
        p.error(f"--threads must be at least 2 (side by side), got {args.threads}")
    print(f"sm_90, D = {args.head_dim}, gates {'off' if args.no_gates else 'on'}, "
          f"{os.cpu_count()} CPUs, side by side on {args.threads} threads; seconds\n")
    print("| dtype | one by one: forward | backward | step | side by side: step | ratio | "
          "slowest kernel |")
    print("|---|---|---|---|---|---|---|")
    for dtype in args.dtypes:
        serial = _measure(dtype, args.head_dim, not args.no_gates, 1)
        side = _measure(dtype, args.head_dim, not args.no_gates, args.threads)
        step = serial["forward"] + serial["backward"]
        print(f"| {dtype} | {serial['forward']:.1f} | {serial['backward']:.1f} | {step:.1f} | "
              f"{side['step']:.1f} | {side['step'] / step:.2f} | {serial['slowest']:.1f} |",
              flush=True)

if __name__ == "__main__":
    main()
