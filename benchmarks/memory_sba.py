"""Peak extra host memory of forward+backward of `pathattn.ops.sb_attn` (stick-breaking
attention), against the size of the T x T attention matrix it never builds.

For every T a fresh child process (this script with --child) is started, so the ru_maxrss
high-water marks of different runs never mix. The child creates the inputs (B=1, H heads,
head dim D, float32) and a fixed output gradient, runs a small forward+backward warm-up at
T=256 (libraries and allocator initialised), records ru_maxrss, runs forward+backward at T
and reports the increase in MiB: activations, saved tensors, the tiles of one scan step and
the input gradients.

Each row also shows one T x T float32 matrix (a single head) and H of them (what a
materialised attention matrix of all heads would take), and the ratio of the increase to
the latter.

    python benchmarks/memory_sba.py                    # T = 4096, 16384; H = 2, D = 64
    python benchmarks/memory_sba.py --seq-lens 4096 --block-size 64
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from _env import maxrss_mib  # benchmarks/ is on sys.path

RESULT_TAG = "RESULT "
MIB = 2**20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-lens", type=int, nargs="+", default=[4096, 16384], metavar="T",
                   help="sequence lengths (default 4096 16384)")
    p.add_argument("--heads", type=int, default=2, help="heads H = HQ (default 2)")
    p.add_argument("--dim", type=int, default=64, help="head dim D = Dv (default 64)")
    p.add_argument("--block-size", type=int, default=None,
                   help="block_size of sb_attn (default: the op's default)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: the memory does not depend on it, and "
                   "on a shared machine more threads mostly add contention to the times)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--seq-len", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def child(args: argparse.Namespace) -> None:
    """One measurement in this process; prints RESULT_TAG + JSON."""
    import time

    import torch

    from pathattn.ops import sb_attn

    torch.set_num_threads(args.threads)

    def inputs(T: int):
        gen = torch.Generator().manual_seed(T)
        q, k, v = (torch.randn(1, T, args.heads, args.dim, generator=gen).requires_grad_()
                   for _ in range(3))  # [1, T, H, D]
        return q, k, v, torch.randn(1, T, args.heads, args.dim, generator=gen)

    def fwd_bwd(q, k, v, do):
        sb_attn(q, k, v, block_size=args.block_size).backward(do)

    fwd_bwd(*inputs(256))
    xs = inputs(args.seq_len)
    before = maxrss_mib()
    start = time.perf_counter()
    fwd_bwd(*xs)
    seconds = time.perf_counter() - start
    assert all(bool(torch.isfinite(x.grad).all()) for x in xs[:3])
    print(RESULT_TAG + json.dumps({"T": args.seq_len, "increase_mib": maxrss_mib() - before,
                                   "seconds": seconds}))


def measure(args: argparse.Namespace, T: int) -> dict:
    cmd = [sys.executable, __file__, "--child", "--seq-len", str(T), "--heads",
           str(args.heads), "--dim", str(args.dim), "--threads", str(args.threads)]
    if args.block_size is not None:
        cmd += ["--block-size", str(args.block_size)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith(RESULT_TAG))
    return json.loads(line[len(RESULT_TAG):])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        child(args)
        return 0
    print(f"sb_attn forward+backward, B=1, H={args.heads}, D={args.dim}, float32, "
          f"block_size={args.block_size or 'default'}, {args.threads} thread(s)")
    print("| T | peak RSS increase (MiB) | T x T fp32, one head (MiB) | "
          f"H={args.heads} heads (MiB) | increase / H heads | fwd+bwd (s) |")
    print("|---|---|---|---|---|---|")
    for T in args.seq_lens:
        r = measure(args, T)
        one = T * T * 4 / MIB
        print(f"| {T} | {r['increase_mib']:.1f} | {one:.0f} | {one * args.heads:.0f} | "
              f"{r['increase_mib'] / (one * args.heads):.3f} | {r['seconds']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
