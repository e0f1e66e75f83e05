"""PaTH's flip-flop errors over seeds: the main job's configuration (README Quickstart,
`pathattn compare --task flipflop --attns path rope --layers 1 --heads 2 --dim 64`) trained
once per seed, with optional overrides of any training or model field, and a per-seed
table of the final errors on val, val_sparse and val_dense.

The main job is the `SyntheticConfig` defaults (preset "fflm-cpu"): 1 layer, 2 heads, width 64
(`ModelConfig` preset "fflm-1l": w rank 32, short convolution 3, beta_max 2, init std
0.02), 2000 steps of batch 16 sequences of 512 tokens (256 pairs, p_ignore 0.8), AdamW
(0.9, 0.95) with lr 1e-3, weight decay 0.1, a linear warmup of 100 steps from 0 and a
cosine to 0.1 * lr, clipping at norm 1, float32; final evaluation on 1024 sequences per
split. Its in-distribution error is 0 for PaTH; its out-of-distribution errors vary with
the seed, which draws the model's initialisation, the training data and the evaluation
sequences.

One configuration = one folder OUT/NAME (NAME: --name, default "base" without overrides,
else the overrides, e.g. "lr=0.003,weight_decay=0.01") holding `pathattn compare`'s layout:
OUT/NAME/path/ (seed 0), OUT/NAME/path-seed<S>/, results.md, results.json,
error_vs_step.png, plus OUT/NAME/study.json (the overrides and the machine). Running the
same command again reuses the finished runs and continues the interrupted ones from their
checkpoints; a changed configuration under the same NAME is refused (use another --name,
or --overwrite).

    python benchmarks/flipflop_seeds_cpu.py --seeds 0 1 2 3 4                 # the main job
    python benchmarks/flipflop_seeds_cpu.py --seeds 0 1 2 3 4 --weight-decay 0.01
    python benchmarks/flipflop_seeds_cpu.py --seeds 0 1 2 3 4 --model-arg beta_max=1.5
    python benchmarks/flipflop_seeds_cpu.py --summary      # one row per configuration in OUT
    python benchmarks/flipflop_seeds_cpu.py --summary --only base base_rope   # these, in order

--summary also writes OUT/summary.md and OUT/summary.png (every seed's final errors per
configuration and split).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from _env import system_info  # benchmarks/ is on sys.path

from pathattn.cli.args import add_model_arg_flag, model_args
from pathattn.cli.synthetic import TRAIN_OPTIONS
from pathattn.train import SyntheticConfig
from pathattn.train.compare import compare, results_markdown
from pathattn.utils.io import atomic_write_bytes

PRESET = "fflm-cpu"  # the main job's SyntheticConfig (the defaults)
SPLITS = ("val", "val_sparse", "val_dense")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4],
                   help="seeds to train (default 0 1 2 3 4)")
    p.add_argument("--attns", nargs="+", default=["path"],
                   help="attention types (default path; e.g. path path_fox rope)")
    p.add_argument("--out", type=Path, default=Path("runs/flipflop_seeds"),
                   help="root folder of the study (default runs/flipflop_seeds)")
    p.add_argument("--name", default=None,
                   help="folder of this configuration under --out (default: from overrides)")
    overrides = p.add_argument_group("overrides of the main job's config (default: its own)")
    for flag, dest, typ, help_ in TRAIN_OPTIONS:
        if dest not in ("attn", "seed"):
            overrides.add_argument(flag, dest=dest, type=typ, default=None, help=help_)
    overrides.add_argument("--warmup-start-ratio", type=float, default=None,
                           help="lr at step 0 as a fraction of lr (default 0)")
    overrides.add_argument("--num-pairs", type=int, default=None,
                           help="(instruction, bit) pairs per sequence, training and "
                           "evaluation (default 256)")
    add_model_arg_flag(overrides)
    p.add_argument("--overwrite", action="store_true",
                   help="train every run of this configuration afresh")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    p.add_argument("--summary", action="store_true",
                   help="train nothing: print one row per configuration found in --out, "
                   "write OUT/summary.md and OUT/summary.png (each seed's errors)")
    p.add_argument("--only", nargs="+", default=None, metavar="NAME",
                   help="with --summary: these configurations, in this order (default all)")
    return p


def overrides_of(args: argparse.Namespace) -> dict:
    """The SyntheticConfig fields given on the command line, name -> value (`model` for the
    --model-arg fields)."""
    fields = [dest for _, dest, _, _ in TRAIN_OPTIONS if dest not in ("attn", "seed")]
    given = {k: getattr(args, k) for k in [*fields, "warmup_start_ratio", "num_pairs"]
             if getattr(args, k) is not None}
    if args.model_arg:
        given["model"] = model_args(args.model_arg)
    return given


def default_name(overrides: dict) -> str:
    """"base" without overrides, else "k=v,k=v" (model fields by their own names)."""
    flat = {k: v for k, v in overrides.items() if k != "model"} | overrides.get("model", {})
    return ",".join(f"{k}={v}" for k, v in sorted(flat.items())) or "base"


def run(args: argparse.Namespace) -> None:
    overrides = overrides_of(args)
    name = args.name or default_name(overrides)
    out = args.out / name
    base = SyntheticConfig.preset(PRESET, **overrides, out_dir=str(out),
                              progress=not args.no_progress)
    info = system_info()
    start = time.perf_counter()
    report = compare(base, args.attns, out, seeds=args.seeds, resume=not args.overwrite,
                     overwrite=args.overwrite)
    # after the runs: a configuration refused for differing from the folder's leaves no trace
    atomic_write_bytes(out / "study.json", (json.dumps({
        "preset": PRESET, "overrides": overrides, "seeds": args.seeds, "attns": args.attns,
        "system": info, "wall_s": round(time.perf_counter() - start, 1)}, indent=2)
        + "\n").encode())
    print(f"# {name}: preset {PRESET}, overrides {overrides or 'none'}, "
          f"{time.perf_counter() - start:.0f} s\n")
    print(results_markdown(report, base.task), end="")
    print(f"\nwrote {out}/results.md, results.json and error_vs_step.png")


def _cell(spread: dict) -> str:
    return (f"{100 * spread['median']:.3g} [{100 * spread['min']:.3g}, "
            f"{100 * spread['max']:.3g}]")


# The study's goal for one seed: the largest error allowed on each split (fractions).
GOAL = {"val": 0.0, "val_sparse": 0.01, "val_dense": 0.001}


def _reports(root: Path, only: list[str] | None) -> list[tuple[str, str, dict]]:
    """(configuration, attention type, compare report) of every configuration under root
    (or those named by `only`, in its order; ValueError naming a missing one)."""
    if only is None:
        paths = sorted(root.glob("*/results.json"))
    else:
        paths = [root / name / "results.json" for name in only]
        missing = [p.parent.name for p in paths if not p.exists()]
        if missing:
            raise ValueError(f"--only: no results.json under {root} for {missing}")
    return [(p.parent.name, attn, r) for p in paths
            for attn, r in json.loads(p.read_text()).items()]


def _seeds_within(r: dict, limits: dict) -> int:
    """How many seeds of a compare report `r` have every split's error <= its limit."""
    return sum(all(r["errors"][s]["per_seed"][seed] <= limits[s] for s in SPLITS)
               for seed in r["seeds"])


def summary(reports: list[tuple[str, str, dict]]) -> str:
    """Markdown: one row per (configuration, attention type) of `_reports`: each split's
    error (%) as median [min, max] over the seeds, the seeds with no error on any split,
    and the seeds within the goal (`GOAL`: val 0, val_sparse <= 1 %, val_dense <= 0.1 %)."""
    head = ("| configuration | attention | seeds | " + " | ".join(f"{s} error % "
                                                          "median [min, max]" for s in SPLITS)
            + " | seeds with 0 errors | seeds within the goal |")
    rows = [head, "|" + " --- |" * (5 + len(SPLITS))]
    exact = dict.fromkeys(SPLITS, 0.0)
    for name, attn, r in reports:
        n = len(r["seeds"])
        cells = [_cell(r["errors"][s]) for s in SPLITS]
        rows.append(f"| {name} | {attn} | {n} | " + " | ".join(cells)
                    + f" | {_seeds_within(r, exact)} / {n} | {_seeds_within(r, GOAL)} / {n} |")
    return "\n".join(rows) + "\n"


def summary_plot(reports: list[tuple[str, str, dict]], path: Path) -> None:
    """One panel per split: every seed's final error (%) per configuration (a dot each,
    the median a bar), on a symmetric-log axis so that 0 and 40 % both show; the goal's
    limit is a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [name if name.endswith(attn) or len({a for _, a, _ in reports}) == 1
              else f"{name} ({attn})" for name, attn, _ in reports]
    fig, axes = plt.subplots(1, len(SPLITS), figsize=(4 + 1.1 * len(reports), 4.2),
                             sharey=True)
    for ax, split in zip(axes, SPLITS, strict=True):
        for x, (_, _, r) in enumerate(reports):
            vals = [100 * v for v in r["errors"][split]["per_seed"].values()]
            ax.scatter([x] * len(vals), vals, s=18, alpha=0.7)
            med = 100 * r["errors"][split]["median"]
            ax.plot([x - 0.3, x + 0.3], [med, med], color="black", lw=1.5)
        ax.axhline(100 * GOAL[split], ls="--", color="gray", lw=1)
        ax.set_yscale("symlog", linthresh=0.01)
        ax.set_xticks(range(len(reports)), labels, rotation=35, ha="right", fontsize=8)
        ax.set_title(f"{split} (goal: <= {100 * GOAL[split]:g} %)")
    axes[0].set_ylabel("final error %, one dot per seed, bar = median")
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    if args.summary:
        try:
            reports = _reports(args.out, args.only)
        except ValueError as e:
            parser.error(str(e))
        text = summary(reports)
        atomic_write_bytes(args.out / "summary.md", text.encode())
        summary_plot(reports, args.out / "summary.png")
        print(text, end="")
        print(f"\nwrote {args.out}/summary.md and summary.png")
        return
    try:
        run(args)
    except ValueError as e:
        parser.error(str(e))


if __name__ == "__main__":
    main()
