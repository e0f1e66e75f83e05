"""Is a flip-flop seed's error the model's or its test set's? Every trained model of one
configuration of `benchmarks/flipflop_seeds_cpu.py` evaluated on the evaluation sequences
of every seed.

A run's seed draws its initialisation, its training batches and its evaluation sequences,
so seed-to-seed differences in the final errors mix the model and the test set. Here the
model trained with seed m is evaluated on the test sets drawn with seed e, for every
(m, e): when the rows (models) differ and the columns (test sets) do not, the spread comes
from training.

    python benchmarks/flipflop_cross_eval_cpu.py                       # runs/flipflop_seeds/base
    python benchmarks/flipflop_cross_eval_cpu.py --config num_reflections=2 --split val_dense

Prints one table per split (rows: model seed; columns: evaluation seed; errors in %) and
writes DIR/cross_eval.json. Each cell is the final evaluation's size (64 batches of 16
sequences per split unless --batches); about 25 s per cell on one Xeon core.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch
from _env import system_info  # benchmarks/ is on sys.path

from pathattn.models import PaTHLM
from pathattn.train import SyntheticConfig
from pathattn.train.checkpoint import load_checkpoint
from pathattn.train.evaluate import evaluate
from pathattn.train.synthetic import build_model_config, build_task, model_vocab_size
from pathattn.utils.io import atomic_write_bytes

SPLITS = ("val", "val_sparse", "val_dense")


def run_dirs(folder: Path, attn: str) -> dict[int, Path]:
    """seed -> run folder of `attn` in a `compare` folder (DIR/<attn>/, DIR/<attn>-seed<S>/),
    finished runs only (metrics.json written)."""
    runs = {}
    for d in [folder / attn, *sorted(folder.glob(f"{attn}-seed*"))]:
        if (d / "metrics.json").exists():
            runs[json.loads((d / "config.json").read_text())["seed"]] = d
    return dict(sorted(runs.items()))


def load_model(run: Path) -> tuple[PaTHLM, SyntheticConfig]:
    cfg = SyntheticConfig.from_dict(json.loads((run / "config.json").read_text()))
    model = PaTHLM(build_model_config(cfg, model_vocab_size(build_task(cfg)), 2048))
    load_checkpoint(run, model)
    return model, cfg


def table(errors: dict, split: str, seeds: list[int]) -> str:
    rows = [f"| {split}: model seed \\ eval seed | " + " | ".join(map(str, seeds)) + " |",
            "|" + " --- |" * (len(seeds) + 1)]
    for m in seeds:
        rows.append(f"| {m} | " + " | ".join(f"{100 * errors[m][e][split]:.3g}"
                                              for e in seeds) + " |")
    return "\n".join(rows) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/flipflop_seeds"),
                   help="flipflop_seeds_cpu.py's root folder (default runs/flipflop_seeds)")
    p.add_argument("--config", default="base", help="configuration folder (default base)")
    p.add_argument("--attn", default="path")
    p.add_argument("--batches", type=int, default=64, help="batches per split and cell")
    p.add_argument("--split", nargs="+", choices=SPLITS, default=["val_sparse", "val_dense"],
                   help="splits to print (all three are evaluated)")
    args = p.parse_args()
    folder = args.out / args.config
    runs = run_dirs(folder, args.attn)
    if len(runs) < 2:
        p.error(f"{folder} holds {len(runs)} finished {args.attn} run(s); need at least 2")
    seeds = list(runs)
    torch.set_num_threads(1)
    errors: dict[int, dict[int, dict[str, float]]] = {}
    for m, run in runs.items():
        model, cfg = load_model(run)
        errors[m] = {}
        for e in seeds:
            metrics = evaluate(model, dataclasses.replace(cfg, seed=e), batches=args.batches)
            errors[m][e] = {s: metrics[s]["error_rate"] for s in SPLITS}
            print(f"model seed {m}, eval seed {e}: " + ", ".join(
                f"{s} {100 * errors[m][e][s]:.3g} %" for s in SPLITS), flush=True)
    print()
    for split in args.split:
        print(table(errors, split, seeds))
    atomic_write_bytes(folder / "cross_eval.json", (json.dumps({
        "batches": args.batches, "system": system_info(),
        "errors": {str(m): {str(e): v for e, v in row.items()} for m, row in errors.items()}},
        indent=2) + "\n").encode())
    print(f"wrote {folder / 'cross_eval.json'}")


if __name__ == "__main__":
    main()
