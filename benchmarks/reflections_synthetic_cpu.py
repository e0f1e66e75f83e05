"""PaTH with R reflections per token on the synthetic tasks: one table of flip-flop errors,
MQRAR-N accuracy and the fewest A5 layers, for each R, over several seeds.

Runs (each reused when already finished, continued when interrupted), all PaTH at equal
width, only `num_reflections` changing:

- flip-flop: the main job's configuration (`pathattn compare --task flipflop`, 1 layer,
  2 heads, width 64, 2000 steps of 16), through `benchmarks/flipflop_seeds_cpu.py`
  (R = 1 is its "base" folder, R > 1 its "num_reflections=R" folder);
- MQRAR-N: 2 layers, width 128, 2 heads, 8 keys, 128 tokens (64 pairs), N = --n-back
  (default 4), 1000 steps of 16, final token accuracy on 1024 sequences;
- A5 word problems (generators alphabet, k = 6): `pathattn layers` over depths 1 and 2
  (the sweep stops at the first depth reaching 90 % sequence accuracy), 8000 steps of 64
  at lr 3e-3.

    python benchmarks/reflections_synthetic_cpu.py                        # R 1 2 4, seeds 0 1 2
    python benchmarks/reflections_synthetic_cpu.py --summary               # table only
    python benchmarks/reflections_synthetic_cpu.py --tasks mqrar --reflections 1 2

Every run uses one thread (OMP_NUM_THREADS=1; start two commands with different --tasks to
use two cores). On a 2-core Xeon a flip-flop run takes 6-11 minutes per seed (R = 1 to 4),
an MQRAR run 3-5, an A5 depth 6-10.
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
TASKS = ("flipflop", "mqrar", "a5")


def flipflop_dir(root: Path, R: int) -> Path:
    return root / ("base" if R == 1 else f"num_reflections={R}")


def commands(task: str, R: int, seeds: list[int], args) -> tuple[list[str], Path]:
    """(command line, result folder) of one task at R reflections."""
    s = [str(x) for x in seeds]
    model = [] if R == 1 else ["--model-arg", f"num_reflections={R}"]
    py = sys.executable
    if task == "flipflop":
        return ([py, "benchmarks/flipflop_seeds_cpu.py", "--no-progress", "--seeds", *s,
                 "--out", str(args.flipflop_out), *model], flipflop_dir(args.flipflop_out, R))
    if task == "mqrar":
        out = args.out / f"mqrar{args.n_back}_R{R}"
        return ([py, "-m", "pathattn", "compare", "--task", "mqrar", "--layers", "2", "--dim",
                 "128", "--heads", "2", "--length", "128", "--n-back", str(args.n_back),
                 "--keys", "8", "--steps", "1000", "--eval-every", "250", "--eval-batches",
                 "4", "--seeds", *s, "--no-progress", "--attns", "path", "--resume",
                 "--out", str(out), *model], out)
    out = args.out / f"a5_k6_R{R}"
    return ([py, "-m", "pathattn", "layers", "--task", "a5", "--alphabet", "generators",
             "--length", "6", "--dim", "128", "--heads", "4", "--steps", "8000",
             "--batch-size", "64", "--lr", "3e-3", "--eval-every", "1000", "--eval-batches",
             "2", "--depths", "1", "2", "--seeds", *s, "--attns", "path", "--no-progress",
             "--out", str(out), *model], out)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.3g}"


def _spread(s: dict, fmt=_pct) -> str:
    return f"{fmt(s['median'])} [{fmt(s['min'])}, {fmt(s['max'])}]"


def _per_seed(s: dict, fmt=_pct) -> str:
    return " / ".join(fmt(v) for v in s["per_seed"].values())


def _a5_cell(runs: dict) -> str:
    """Fewest layers per seed ("> n" when no depth up to n reached 90 %), with each seed's
    sequence accuracy at every depth tried."""
    parts = []
    for r in runs.values():
        tried = max(int(n) for n in r["runs"])
        fewest = f"> {tried}" if r["solved_at"] is None else f"{r['solved_at']:g}"
        accs = ", ".join(f"{100 * a:.1f} % at {n}" for n, a in r["runs"].items())
        parts.append(f"{fewest} ({accs})")
    return " / ".join(parts)


def summary(args) -> str:
    """Markdown: one row per R, the tasks' results found on disk (median [min, max] over the
    seeds, then each seed's value in seed order)."""
    seeds = [str(seed) for seed in args.seeds]  # JSON keys
    rows = ["| R | flip-flop val_sparse % | flip-flop val_dense % | flip-flop val % | "
            f"MQRAR-{args.n_back} token accuracy % | A5 (k = 6) fewest layers per seed |",
            "| --- | --- | --- | --- | --- | --- |"]
    for R in args.reflections:
        cells = []
        ff = flipflop_dir(args.flipflop_out, R) / "results.json"
        if ff.exists():
            runs = json.loads(ff.read_text())["path"]["seeds"]
            for split in ("val_sparse", "val_dense", "val"):
                e = spread({seed: runs[seed][split] for seed in seeds if seed in runs})
                cells.append(f"{_spread(e)} ({_per_seed(e)})")
        else:
            cells += ["not run"] * 3
        mq = args.out / f"mqrar{args.n_back}_R{R}" / "results.json"
        if mq.exists():
            runs = json.loads(mq.read_text())["path"]["seeds"]
            acc = spread({seed: runs[seed]["val_token_acc"] for seed in seeds if seed in runs})
            cells.append(f"{_spread(acc)} ({_per_seed(acc)})")
        else:
            cells.append("not run")
        a5 = args.out / f"a5_k6_R{R}" / "layers.json"
        if a5.exists():
            runs = json.loads(a5.read_text())["path"]["seeds"]
            cells.append(_a5_cell({seed: runs[seed] for seed in seeds if seed in runs}))
        else:
            cells.append("not run")
        rows.append(f"| {R} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reflections", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    p.add_argument("--n-back", type=int, default=4, help="MQRAR's N (default 4)")
    p.add_argument("--out", type=Path, default=Path("runs/reflections"),
                   help="folder of the MQRAR and A5 runs (default runs/reflections)")
    p.add_argument("--flipflop-out", type=Path, default=Path("runs/flipflop_seeds"),
                   help="flipflop_seeds_cpu.py's folder (default runs/flipflop_seeds)")
    p.add_argument("--summary", action="store_true", help="train nothing, print the table")
    args = p.parse_args()
    if any(R < 1 for R in args.reflections):
        p.error("--reflections: each R must be >= 1")
    if not args.summary:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        for task in args.tasks:
            for R in args.reflections:
                cmd, out = commands(task, R, args.seeds, args)
                print(f"# {task}, R = {R} -> {out}", flush=True)
                subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    print(summary(args), end="")


if __name__ == "__main__":
    main()
