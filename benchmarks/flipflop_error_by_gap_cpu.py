"""Where does a flip-flop model err? Its read errors on one split, by the distance from
each read back to the write it must recall (in (instruction, bit) pairs, power-of-two
buckets), for the trained runs of a `benchmarks/flipflop_seeds_cpu.py` configuration.

Training draws writes with probability 0.1 per instruction, so a gap of g pairs without a
write has probability 0.9^g: about 1 in 200 of the reads sit 50 or more pairs after their
write, and practically none 128 or more (0.9^128 = 1.4e-6). The sparse split (writes with
probability 0.01) puts about 44 % of its reads 64 or more pairs after their write, 19 %
128 or more.

    python benchmarks/flipflop_error_by_gap_cpu.py                          # base, val_sparse
    python benchmarks/flipflop_error_by_gap_cpu.py --config num_reflections=2 --seeds 0 1

Prints one row per bucket and run seed (wrong / reads), and the training reads' share of
each bucket; evaluates --batches batches of 16 sequences of the split (default 32).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from pathattn.models import PaTHLM
from pathattn.tasks.flipflop import R as READ
from pathattn.tasks.flipflop import W as WRITE
from pathattn.train import SyntheticConfig
from pathattn.train.checkpoint import load_checkpoint
from pathattn.train.synthetic import TaskStream, build_model_config, build_task, model_vocab_size

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)  # lower bounds in pairs (at most 255 in 256 pairs)


def gaps(tokens: torch.Tensor) -> torch.Tensor:
    """tokens [B, T] (instruction, bit pairs) -> [B, T // 2] pairs since the last write at
    each instruction (0 at a write)."""
    ins = tokens[:, 0::2]  # [B, P]
    pos = torch.arange(ins.shape[1]).expand_as(ins)
    last = torch.where(ins == WRITE, pos, torch.full_like(pos, -1)).cummax(1).values
    return pos - last


def bucket(g: torch.Tensor) -> torch.Tensor:
    """Index into BUCKETS of each gap g >= 1."""
    return torch.bucketize(g, torch.tensor(BUCKETS), right=True) - 1


def error_by_gap(run: Path, split: str, batches: int) -> tuple[list[int], list[int]]:
    cfg = SyntheticConfig.from_dict(json.loads((run / "config.json").read_text()))
    model = PaTHLM(build_model_config(cfg, model_vocab_size(build_task(cfg)), 2048)).eval()
    load_checkpoint(run, model)
    stream = TaskStream.for_split(cfg, split)
    reads, wrong = [0] * len(BUCKETS), [0] * len(BUCKETS)
    with torch.no_grad():
        for _ in range(batches):
            tokens, targets = next(stream)
            pred = model(tokens)[0].argmax(-1)[:, 0::2]  # prediction at each instruction
            is_read = tokens[:, 0::2] == READ
            b = bucket(gaps(tokens))[is_read]
            bad = (pred != targets[:, 0::2])[is_read]
            for i in range(len(BUCKETS)):
                reads[i] += int((b == i).sum())
                wrong[i] += int((bad & (b == i)).sum())
    return reads, wrong


def training_share(batches: int = 64) -> list[float]:
    """Share of the training split's reads in each bucket (sampled)."""
    cfg = SyntheticConfig()
    stream = TaskStream.for_split(cfg, "train")
    counts = [0] * len(BUCKETS)
    for _ in range(batches):
        tokens, _ = next(stream)
        b = bucket(gaps(tokens))[tokens[:, 0::2] == READ]
        for i in range(len(BUCKETS)):
            counts[i] += int((b == i).sum())
    total = sum(counts)
    return [c / total for c in counts]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/flipflop_seeds"))
    p.add_argument("--config", default="base")
    p.add_argument("--attn", default="path")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--split", default="val_sparse", choices=["val", "val_sparse", "val_dense"])
    p.add_argument("--batches", type=int, default=32)
    args = p.parse_args()
    torch.set_num_threads(1)
    folder = args.out / args.config
    share = training_share()
    head = ["| pairs since the write | training reads |"]
    results = {}
    for s in args.seeds:
        run = folder / (args.attn if s == 0 else f"{args.attn}-seed{s}")
        if not (run / "metrics.json").exists():
            p.error(f"{run} is not a finished run")
        results[s] = error_by_gap(run, args.split, args.batches)
        head.append(f" seed {s} wrong / reads |")
    print("".join(head))
    print("|" + " --- |" * (2 + len(results)))
    for i, lo in enumerate(BUCKETS):
        hi = f"-{2 * lo - 1}" if i + 1 < len(BUCKETS) else "+"
        cells = [f"{w[i]} / {r[i]}" for r, w in results.values()]
        print(f"| {lo}{hi} | {100 * share[i]:.3g} % | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
