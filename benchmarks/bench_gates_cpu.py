"""CPU timing of `path_attn` with forget gates (PaTH-FoX) against without, same shapes, one
run, interleaved repetitions (the VM is noisy: minima and medians are both printed).

Gates push far keys' probabilities many orders of magnitude below the row maximum; the op
sets those below exp(-64) to exact zeros so that no subnormal floats reach exp and the GEMMs
(`pathattn/ops/path/blockwise.py`, _EXP_CUTOFF). Before that change the gated op was 4-5x
slower than the ungated one on x86; the ratio printed here should stay near 1.

    python benchmarks/bench_gates_cpu.py                 # T = 2048, H = 4, D = 64
    python benchmarks/bench_gates_cpu.py --seq-len 4096 --heads 8
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from _env import system_info  # benchmarks/ is on sys.path

from pathattn import path_attn


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.manual_seed(0)
    B, T, H, D = 1, args.seq_len, args.heads, args.dim
    q, k, v = (torch.randn(B, T, H, D, requires_grad=True) for _ in range(3))
    w = F.normalize(torch.randn(B, T, H, D), dim=-1).requires_grad_()
    beta = (2 * torch.rand(B, T, H)).requires_grad_()
    g = F.logsigmoid(torch.randn(B, T, H) + 3).requires_grad_()  # forget gates near 0.95
    times: dict[str, dict[str, list[float]]] = {n: {"fwd": [], "bwd": []}
                                                 for n in ("no gates", "gates")}
    for rep in range(args.repeats + 1):  # the first repetition warms up
        for name, gates in (("no gates", None), ("gates", g)):
            t0 = time.perf_counter()
            o = path_attn(q, k, v, w, beta, gates)
            t1 = time.perf_counter()
            o.sum().backward()
            t2 = time.perf_counter()
            if rep:
                times[name]["fwd"].append(t1 - t0)
                times[name]["bwd"].append(t2 - t1)
    print(system_info())
    print(f"B={B} T={T} H={H} D={D}, seconds (min / median over {args.repeats})")
    for part in ("fwd", "bwd"):
        row = {n: (min(t[part]), statistics.median(t[part])) for n, t in times.items()}
        ratio = row["gates"][0] / row["no gates"][0]
        print(f"{part}: no gates {row['no gates'][0]:.3f} / {row['no gates'][1]:.3f}, "
              f"gates {row['gates'][0]:.3f} / {row['gates'][1]:.3f}, "
              f"gates / no gates {ratio:.2f}x")


if __name__ == "__main__":
    main()
