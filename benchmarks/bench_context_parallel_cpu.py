"""Step time of context-parallel PaTH attention on a CPU: forward + backward of
`pathattn.distributed.context_parallel_path_attn` at a fixed total sequence length T, with
the sequence sharded over P = 1, 2, 4 gloo processes (one thread each), next to the
single-process `path_attn` on the whole sequence.

Each world size is a fresh group of P spawned processes. Every rank holds T / P tokens;
a step is forward + backward(do) of the op, started together on every rank (a barrier)
and timed until the slowest rank is done (the max over ranks). Reported: the minimum and
median over `--repeats` steps after one warm-up step, and the bytes each rank sends per
step (counted from the message shapes, see `docs/context_parallel.md`).

On a machine with fewer cores than P (this project's CI box has 2) the processes
oversubscribe the cores and the time grows instead of shrinking: the table then measures
the algorithm's total work plus communication, not a speed-up.

    python benchmarks/bench_context_parallel_cpu.py                 # T=2048, P = 1 2 4
    python benchmarks/bench_context_parallel_cpu.py --seq-len 1024 --world-sizes 1 2 --gates
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import system_info  # noqa: E402


def _inputs(args, T: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    B, H, D = args.batch, args.heads, args.dim
    q = torch.randn(B, T, H, D, generator=gen)
    k = torch.randn(B, T, H, D, generator=gen)
    v = torch.randn(B, T, H, D, generator=gen)
    w = torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1)
    beta = 2 * torch.rand(B, T, H, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen) + 2) \
        if args.gates else None
    do = torch.randn(B, T, H, D, generator=gen)
    return (q, k, v, w, beta, g), do


def _step(fn, inputs, do, **kw) -> None:
    xs = [None if x is None else x.detach().requires_grad_() for x in inputs]
    fn(*xs, **kw).backward(do)


def _worker(rank: int, P: int, port: int, args, out: str) -> None:
    import torch.distributed as dist

    from pathattn.distributed import context_parallel_path_attn

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=P)
    inputs, do = _inputs(args, args.seq_len)
    Tr = args.seq_len // P
    lo, hi = rank * Tr, (rank + 1) * Tr
    shard = tuple(None if x is None else x[:, lo:hi].contiguous() for x in inputs)
    times = []
    for i in range(args.repeats + 1):
        dist.barrier()
        t0 = time.perf_counter()
        _step(context_parallel_path_attn, shard, do[:, lo:hi], block_size=args.block_size)
        dt = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)  # the slowest rank ends the step
        if i:
            times.append(float(dt) * 1e3)
    if rank == 0:
        Path(out, f"P{P}.json").write_text(json.dumps(times))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _single(args) -> list[float]:
    from pathattn.ops import path_attn

    torch.set_num_threads(1)
    inputs, do = _inputs(args, args.seq_len)
    _step(path_attn, inputs, do, block_size=args.block_size)
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        _step(path_attn, inputs, do, block_size=args.block_size)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def sent_bytes(args, P: int) -> dict[str, int]:
    """Bytes the busiest rank sends per step (forward, backward): float32 tensors, float64
    gate terms; the formulas of docs/context_parallel.md with B, T/P, H = HQ, D. Rank r
    forwards shards 0..r (r + 1 hops) and, in the backward, r accumulators; the last rank
    returns P - 1 accumulators. The backward's all-reduce buffer is counted once."""
    if P == 1:
        return {"fwd": 0, "bwd": 0}
    B, Tr, H, D = args.batch, args.seq_len // P, args.heads, args.dim
    hop = 4 * (B * Tr * H * 2 * D + B * H * D * D)  # K~, V, P
    if args.gates:
        hop += 8 * (B * Tr * H + B * H)
    acc = 4 * B * Tr * H * (2 * D + (1 if args.gates else 0))  # dK~, dV (+ dS column sums)
    allreduce = 8 * P * B * H * (D * D + (1 if args.gates else 0))
    bwd = max((P - 1) * hop + (P - 2) * acc, (P - 1) * acc)
    return {"fwd": (P - 1) * hop, "bwd": bwd + allreduce}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq-len", type=int, default=2048, help="total T (default 2048)")
    p.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--gates", action="store_true", help="PaTH-FoX (forget gates)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="benchmarks/out")
    args = p.parse_args(argv)
    for P in args.world_sizes:
        if args.seq_len % P:
            p.error(f"--seq-len {args.seq_len} must be divisible by every world size")
    info = system_info()
    print(f"torch {info['torch']} | {info['cpu']} | {os.cpu_count()} cores | load "
          f"{info['loadavg_start']} | 1 thread per process")
    print(f"B={args.batch} T={args.seq_len} H=HQ={args.heads} D={args.dim} "
          f"C={args.block_size} gates={args.gates} float32, fwd+bwd")
    rows = []
    single = _single(args)
    rows.append(("path_attn (1 proc)", min(single), statistics.median(single), 0, 0))
    with tempfile.TemporaryDirectory() as out:
        for P in args.world_sizes:
            mp.spawn(_worker, args=(P, _free_port(), args, out), nprocs=P)
            times = json.loads(Path(out, f"P{P}.json").read_text())
            sent = sent_bytes(args, P)
            rows.append((f"context parallel P={P}", min(times), statistics.median(times),
                         sent["fwd"], sent["bwd"]))
    print("\n| run | min ms | median ms | max sent by a rank, fwd MB | bwd MB |")
    print("|---|---:|---:|---:|---:|")
    for name, lo, med, f, b in rows:
        print(f"| {name} | {lo:.0f} | {med:.0f} | {f / 1e6:.2f} | {b / 1e6:.2f} |")
    if os.cpu_count() and max(args.world_sizes) > os.cpu_count():
        print(f"\nnote: {max(args.world_sizes)} processes on {os.cpu_count()} cores "
              "oversubscribe the CPU")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "bench_context_parallel_cpu.json").write_text(json.dumps(
        {"config": vars(args), "system": info, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
