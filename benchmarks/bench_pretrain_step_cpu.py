"""CPU timing of one full pretraining step (forward, backward, AdamW step) of a `PaTHLM`
for each attention type, side by side in one run with interleaved repetitions (the VM is
noisy: minima and medians are both printed).

The goal for PaTH is at most 1.2x RoPE's step time at the cpu-small preset with
2048-token rows (`pathattn pretrain`'s CPU-scale model). Prints the ratio of every type to
RoPE and the tokens per second.

    python benchmarks/bench_pretrain_step_cpu.py                       # cpu-small, T = 2048
    python benchmarks/bench_pretrain_step_cpu.py --preset cpu-tiny --seq-len 256 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from _env import system_info  # benchmarks/ is on sys.path

from pathattn.models import ATTN_TYPES, ModelConfig, PaTHLM
from pathattn.train import param_groups


def make_step(attn: str, preset: str, vocab: int):
    """A closure doing one training step of a fresh model of `attn` on a fixed batch."""
    torch.manual_seed(0)
    model = PaTHLM(ModelConfig.preset(preset, vocab_size=vocab, attn_type=attn))
    opt = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-3, betas=(0.9, 0.95))

    def step(ids: torch.Tensor) -> float:
        opt.zero_grad(set_to_none=True)
        _, loss = model(ids[:, :-1], labels=ids[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return float(loss)

    return step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="cpu-small")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--attns", nargs="+", default=list(ATTN_TYPES), choices=ATTN_TYPES)
    args = p.parse_args()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab, (args.batch_size, args.seq_len + 1), generator=gen)
    steps = {a: make_step(a, args.preset, args.vocab) for a in args.attns}
    times: dict[str, list[float]] = {a: [] for a in args.attns}
    for rep in range(args.repeats + 1):  # the first repetition warms up (kernel builds)
        for attn, step in steps.items():
            t0 = time.perf_counter()
            step(ids)
            if rep:
                times[attn].append(time.perf_counter() - t0)
    tokens = args.batch_size * args.seq_len
    print(system_info())
    print(f"preset={args.preset} rows={args.batch_size} x {args.seq_len} tokens, "
          f"seconds per step (min / median over {args.repeats})")
    base = times.get("rope")
    for attn, t in times.items():
        line = (f"{attn:9s} {min(t):.3f} / {statistics.median(t):.3f} s, "
                f"{tokens / min(t):,.0f} tokens/s")
        if base is not None:
            line += (f", / rope {min(t) / min(base):.2f}x "
                     f"(median {statistics.median(t) / statistics.median(base):.2f}x)")
        print(line)


if __name__ == "__main__":
    main()
