"""MQRAR-N (multi-query repeated associative recall, N-back) for every attention type: final
token accuracy for N in 1..4, over several seeds, in one table and one figure.

The paper's model is 2 layers, width 256, 2 heads, 32 keys and 768 tokens. Trained for
1000 steps of 16 on this 2-core CPU that is about an hour per run, so the defaults here
scale the task down at the same shape: 2 layers, width 128, 2 heads, 8 keys, 128 tokens
(64 (key, value) pairs, so each key is assigned 8 times on average, against 12 in the
paper's sequences), 64 values, 1000 steps of 16 at lr 1e-3, final token accuracy on 1024
sequences. Every option of the setting can be changed (--dim, --keys, --length, ...).

One `pathattn compare` per N, in OUT/n<N>, each reused when finished and continued when
interrupted:

    python benchmarks/mqrar_n_cpu.py                              # N 1-4, 4 types, seeds 0 1 2
    python benchmarks/mqrar_n_cpu.py --n-backs 1 2 &              # two cores: split the Ns
    python benchmarks/mqrar_n_cpu.py --n-backs 3 4
    python benchmarks/mqrar_n_cpu.py --summary                    # table and figure only

Every run uses one thread (OMP_NUM_THREADS=1). On a 2-core Intel Xeon a run takes 3-5
minutes with another run beside it. Writes OUT/results.md, OUT/results.json and
OUT/mqrar_n.png (token accuracy against N, median and the seeds' range per type).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from pathattn.train.seeds import spread

ROOT = Path(__file__).resolve().parent.parent
ATTNS = ("path", "rope", "fox", "sba")


def command(n_back: int, args) -> tuple[list[str], Path]:
    """(command line, result folder) of the compare run for one N."""
    out = args.out / f"n{n_back}"
    cmd = [sys.executable, "-m", "pathattn", "compare", "--task", "mqrar",
           "--layers", str(args.layers), "--dim", str(args.dim), "--heads", str(args.heads),
           "--length", str(args.length), "--keys", str(args.keys),
           "--steps", str(args.steps), "--batch-size", str(args.batch_size), "--lr", str(args.lr),
           "--eval-every", str(args.steps // 4), "--eval-batches", "4", "--no-progress",
           "--resume", "--n-back", str(n_back), "--attns", *args.attns,
           "--seeds", *map(str, args.seeds), "--out", str(out)]
    if args.values is not None:  # else the task's default (64), stored as unset
        cmd += ["--values", str(args.values)]
    return cmd, out


def collect(args) -> tuple[dict, list[str]]:
    """({attn: {N: spread of the final token accuracy}} over the runs found on disk, a cell
    with no finished seed absent; one line per cell that lacks some of --seeds)."""
    seeds = [str(s) for s in args.seeds]  # JSON keys
    table: dict = {attn: {} for attn in args.attns}
    missing = []
    for n in args.n_backs:
        path = args.out / f"n{n}" / "results.json"
        results = json.loads(path.read_text()) if path.exists() else {}
        for attn in args.attns:
            runs = results.get(attn, {}).get("seeds", {})
            acc = {s: runs[s]["val_token_acc"] for s in seeds if s in runs}
            if acc:
                table[attn][n] = spread(acc)
            if len(acc) < len(seeds):
                lost = [s for s in seeds if s not in acc]
                missing.append(f"{attn}, N = {n}: no result for seed{'s' * (len(lost) > 1)} "
                               f"{' '.join(lost)} in {path}")
    return table, missing


def _cell(s: dict | None) -> str:
    if s is None:
        return "not run"
    per = " / ".join(f"{100 * v:.1f}" for v in s["per_seed"].values())
    return f"{100 * s['median']:.1f} [{100 * s['min']:.1f}, {100 * s['max']:.1f}] ({per})"


def markdown(table: dict, missing: list[str], args) -> str:
    """The table; below it the cells that lack seeds (a compare folder's results.json holds
    the seeds of its last run: run the missing ones with all of --seeds, finished runs are
    reused)."""
    head = "| attention | " + " | ".join(f"N = {n}" for n in args.n_backs) + " |"
    rows = [head, "|" + " --- |" * (len(args.n_backs) + 1)]
    for attn, cells in table.items():
        rows.append(f"| {attn} | " + " | ".join(_cell(cells.get(n)) for n in args.n_backs)
                    + " |")
    text = ("Token accuracy %, median [min, max] (each seed in seed order), seeds "
            f"{' '.join(map(str, args.seeds))}\n\n" + "\n".join(rows) + "\n")
    if missing:
        text += ("\nMissing (rerun with the same --seeds; finished runs are reused):\n"
                 + "".join(f"- {m}\n" for m in missing))
    return text


def plot(table: dict, args, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for attn, cells in table.items():
        ns = [n for n in args.n_backs if n in cells]
        if not ns:
            continue
        med = [100 * cells[n]["median"] for n in ns]
        lo = [100 * (cells[n]["median"] - cells[n]["min"]) for n in ns]
        hi = [100 * (cells[n]["max"] - cells[n]["median"]) for n in ns]
        ax.errorbar(ns, med, yerr=[lo, hi], marker="o", capsize=3, label=attn)
    ax.set_xlabel("N (recall the N-th last value)")
    ax.set_ylabel("token accuracy %")
    ax.set_xticks(list(args.n_backs))
    ax.set_ylim(0, 102)
    ax.set_title(f"MQRAR-N, median and range over seeds {' '.join(map(str, args.seeds))}")
    ax.legend()
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n-backs", type=int, nargs="+", default=[1, 2, 3, 4],
                   help="the Ns to run (default 1 2 3 4)")
    p.add_argument("--attns", nargs="+", default=list(ATTNS),
                   help="attention types (default path rope fox sba)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", type=Path, default=Path("runs/mqrar_n"),
                   help="root folder, one compare folder n<N> per N (default runs/mqrar_n)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--keys", type=int, default=8)
    p.add_argument("--values", type=int, default=None, help="value vocabulary (default 64)")
    p.add_argument("--length", type=int, default=128, help="tokens per sequence (even)")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--summary", action="store_true", help="train nothing: table and figure")
    args = p.parse_args()
    if any(n < 1 for n in args.n_backs):
        p.error(f"--n-backs: each N must be >= 1, got {args.n_backs}")
    if args.steps < 4:
        p.error(f"--steps must be >= 4 (evaluations every steps / 4), got {args.steps}")
    if not args.summary:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        for n in args.n_backs:
            cmd, out = command(n, args)
            print(f"# MQRAR-{n} -> {out}", flush=True)
            subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    table, missing = collect(args)
    text = markdown(table, missing, args)
    args.out.mkdir(parents=True, exist_ok=True)
    _write(args.out / "results.md", text)
    _write(args.out / "results.json", json.dumps(
        {attn: {str(n): s for n, s in cells.items()} for attn, cells in table.items()},
        indent=1))
    if any(table.values()):
        plot(table, args, args.out / "mqrar_n.png")
    print(text, end="")


if __name__ == "__main__":
    main()
