"""CPU timing of a `PaTHLM` training step (forward, loss, backward), eager against
torch.compile (fullgraph, default inductor backend), side by side in one run with
interleaved repetitions (the VM is noisy: minima and medians are both printed).

The PaTH op is one custom-op node in the compiled graph (`pathattn.ops.path.function`): the
compiler fuses the projections, norms, gates and loss around it, not the op itself. The
compile time (first call, forward and backward) is printed apart.

    python benchmarks/compile_cpu.py                                    # small, T = 1024
    python benchmarks/compile_cpu.py --preset tiny --seq-len 64 --repeats 2
    python benchmarks/compile_cpu.py --dynamic      # dynamic shapes: also counts compiles

With --dynamic the step compiles with dynamic=True and, after the timing, runs at two more
lengths (T / 2 and 3T / 4); the script prints how many graphs were compiled in all (one:
no length compiles again).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from _env import system_info  # benchmarks/ is on sys.path

from pathattn.models import ATTN_TYPES, ModelConfig, PaTHLM


def make_step(model: PaTHLM, compiled: bool, dynamic: bool | None = None):
    """One training step (gradients of the loss, no optimizer) on a fixed batch."""

    def loss_fn(ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return model(ids, labels=labels)[1]

    fn = torch.compile(loss_fn, fullgraph=True, dynamic=dynamic) if compiled else loss_fn

    def step(ids: torch.Tensor) -> float:
        model.zero_grad(set_to_none=True)
        loss = fn(ids[:, :-1], ids[:, 1:])
        loss.backward()
        return float(loss.detach())

    return step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--attn", default="path", choices=ATTN_TYPES)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--vocab", type=int, default=None, help="default: the preset's")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dynamic", action="store_true",
                   help="compile with dynamic=True and count compiles over three lengths")
    args = p.parse_args()
    torch.manual_seed(0)
    over = dict(attn_type=args.attn)
    if args.vocab is not None:
        over["vocab_size"] = args.vocab
    model = PaTHLM(ModelConfig.preset(args.preset, **over))
    V = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (args.batch_size, args.seq_len + 1), generator=gen)
    steps = {"eager": make_step(model, False),
             "compiled": make_step(model, True, True if args.dynamic else None)}
    losses, first = {}, {}
    for name, step in steps.items():  # warm-up: kernel builds, compilation
        t0 = time.perf_counter()
        losses[name] = step(ids)
        first[name] = time.perf_counter() - t0
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.repeats):
        for name, step in steps.items():
            t0 = time.perf_counter()
            step(ids)
            times[name].append(time.perf_counter() - t0)
    tokens = args.batch_size * args.seq_len
    print(system_info())
    print(f"preset={args.preset} attn={args.attn} rows={args.batch_size} x {args.seq_len} "
          f"tokens; loss eager {losses['eager']:.6f}, compiled {losses['compiled']:.6f}; "
          f"first call (compile) {first['compiled']:.1f} s")
    print(f"seconds per step (min / median over {args.repeats})")
    base = times["eager"]
    for name, t in times.items():
        print(f"{name:9s} {min(t):.3f} / {statistics.median(t):.3f} s, "
              f"{tokens / min(t):,.0f} tokens/s, / eager {min(t) / min(base):.2f}x "
              f"(median {statistics.median(t) / statistics.median(base):.2f}x)")
    if args.dynamic:
        from torch._dynamo.utils import counters

        for T in (args.seq_len // 2, 3 * args.seq_len // 4):
            steps["compiled"](ids[:, : T + 1])
        lengths = f"{args.seq_len}, {args.seq_len // 2} and {3 * args.seq_len // 4}"
        print(f"dynamic=True: {counters['stats']['unique_graphs']} graph(s) compiled for "
              f"lengths {lengths}")


if __name__ == "__main__":
    main()
