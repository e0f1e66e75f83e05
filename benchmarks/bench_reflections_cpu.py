"""CPU speed of `path_attn` against the number of reflections per token R, side by side.

For each R (w [B, T, H, R, D], beta [B, T, H, R]) and each backend, forward (no grad) and
forward + backward of the same float32 inputs, timed interleaved (every repeat visits all
R and backends in turn), minimum over the repeats. Ratios are against R = 1 on the same
backend. R = 1 passes 4-D w / beta (today's op).

    python benchmarks/bench_reflections_cpu.py                      # T 2048, R 1 2 4
    python benchmarks/bench_reflections_cpu.py --seq-len 4096 --reflections 1 2 3 4

Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from _env import load_average, system_info  # benchmarks/ is on sys.path

from pathattn import path_attn


def inputs(B: int, T: int, H: int, D: int, R: int, seed: int = 0):
    """q, k, v [B, T, H, D]; w [B, T, H, D] (R = 1) or [B, T, H, R, D]; beta likewise."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, D, generator=g) for _ in range(3))
    shape = (B, T, H, D) if R == 1 else (B, T, H, R, D)
    w = torch.nn.functional.normalize(torch.randn(*shape, generator=g), dim=-1)
    beta = 2 * torch.rand(*shape[:-1], generator=g)
    return q, k, v, w, beta


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--reflections", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--backends", nargs="+", default=["cpu", "torch"])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    args = p.parse_args()
    if 1 not in args.reflections:
        p.error("--reflections must include 1 (the baseline of the ratios)")

    cases = {}
    for R in args.reflections:
        x = inputs(1, args.seq_len, args.heads, args.dim, R)
        leaves = [t.clone().requires_grad_() for t in x]
        cases[R] = (x, leaves)
    times = {(b, R, m): [] for b in args.backends for R in args.reflections
             for m in ("fwd", "fwd_bwd")}
    load0 = load_average()
    for rep in range(args.repeats + 1):  # the first round warms up (kernel build, caches)
        for b in args.backends:
            for R in args.reflections:
                x, leaves = cases[R]
                with torch.no_grad():
                    t_f = timed(lambda x=x, b=b: path_attn(*x, backend=b))
                t_fb = timed(lambda leaves=leaves, b=b:
                             path_attn(*leaves, backend=b).sum().backward())
                if rep:
                    times[(b, R, "fwd")].append(t_f)
                    times[(b, R, "fwd_bwd")].append(t_fb)
    best = {key: min(v) for key, v in times.items()}

    print(system_info())
    print(f"B=1 T={args.seq_len} H={args.heads} D={args.dim} float32; min over "
          f"{args.repeats} repeats; load {load0:.2f} -> {load_average():.2f}")
    print("| backend | R | fwd ms | fwd / R=1 | fwd+bwd ms | fwd+bwd / R=1 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for b in args.backends:
        for R in args.reflections:
            f, fb = best[(b, R, "fwd")], best[(b, R, "fwd_bwd")]
            print(f"| {b} | {R} | {f:.1f} | {f / best[(b, 1, 'fwd')]:.2f} | {fb:.1f} | "
                  f"{fb / best[(b, 1, 'fwd_bwd')]:.2f} |")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "bench_reflections_cpu.json"
    out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                               "system": system_info(),
                               "ms": {f"{b}/R{R}/{m}": v for (b, R, m), v in times.items()}},
                              indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
