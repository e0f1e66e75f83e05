"""CPU speed of `path_attn` at two revisions of pathattn, measured side by side in one run.

The base revision is checked out into a temporary git worktree; each round runs one fresh
process per tree (base, current, base, current, ...), each timing forward (no grad) and
forward + backward of the same inputs (B=1, H heads, head dim D, float32, optionally with
forget gates) after a warm-up. Reported: per mode the minimum and median over all
repetitions of both trees, and current / base ratios (minima; medians beside).

    python benchmarks/compare_revisions_cpu.py --base 35ee1d5 --seq-len 4096

Run it on an otherwise idle machine: interleaving evens out slow drifts, not other jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORKER = r"""
import json, sys, time
import torch, torch.nn.functional as F
from pathattn import path_attn
T, H, D, reps, gates = (int(a) for a in sys.argv[1:6])
g_ = torch.Generator().manual_seed(0)
r = lambda *s: torch.randn(*s, generator=g_)
q, k, v, do = r(1, T, H, D), r(1, T, H, D), r(1, T, H, D), r(1, T, H, D)
w = F.normalize(r(1, T, H, D), dim=-1)
beta = 2 * torch.rand(1, T, H, generator=g_)
g = F.logsigmoid(r(1, T, H) + 3) if gates else None
leaves = [x.requires_grad_() for x in (q, k, v, w, beta)]

def fwd():
    with torch.no_grad():
        path_attn(q, k, v, w, beta, g)

def fwd_bwd():
    path_attn(q, k, v, w, beta, g).backward(do)
    for x in leaves:
        x.grad = None

out = {}
for name, fn in (("fwd", fwd), ("fwd_bwd", fwd_bwd)):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter(); fn(); times.append(time.perf_counter() - t0)
    out[name] = times
print(json.dumps(out))
"""


def run_tree(root: Path, args) -> dict[str, list[float]]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmd = [sys.executable, "-c", WORKER, str(args.seq_len), str(args.heads), str(args.dim),
           str(args.repeats), str(int(args.gates))]
    res = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, check=False)
    if res.returncode:
        sys.exit(f"{root}: the worker failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="git revision to compare against")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3, help="processes per tree (default 3)")
    p.add_argument("--repeats", type=int, default=3, help="timings per process (default 3)")
    p.add_argument("--gates", action="store_true", help="PaTH-FoX (forget gates)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pathattn_base_") as tmp:
        base = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base),
                        args.base], check=True, capture_output=True)
        try:
            times = {"base": {"fwd": [], "fwd_bwd": []}, "current": {"fwd": [], "fwd_bwd": []}}
            for i in range(args.rounds):
                for label, root in (("base", base), ("current", ROOT)):
                    for mode, ts in run_tree(root, args).items():
                        times[label][mode] += ts
                print(f"round {i + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(base)], check=False, capture_output=True)
    print(f"path_attn, B=1 T={args.seq_len} H={args.heads} D={args.dim} float32"
          f"{' gates' if args.gates else ''}; base {args.base}; load "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print("| mode | base min / median (ms) | current min / median (ms) | current / base (min) "
          "| (median) |")
    print("| --- | --- | --- | --- | --- |")
    for mode in ("fwd", "fwd_bwd"):
        b, c = times["base"][mode], times["current"][mode]
        print(f"| {mode} | {1e3 * min(b):.1f} / {1e3 * statistics.median(b):.1f} | "
              f"{1e3 * min(c):.1f} / {1e3 * statistics.median(c):.1f} | "
              f"{min(c) / min(b):.3f} | {statistics.median(c) / statistics.median(b):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
