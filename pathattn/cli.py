"""Command line: `pathattn data TASK --n N --out FILE.jsonl` exports synthetic-task
sequences (`pathattn.tasks`) as JSONL, one `{"tokens": [...], "targets": [...]}` per line,
tokens as strings and targets[t] the token the model must output at position t (null where
not scored). Subcommands are argparse subparsers, one `_add_*` / `_run_*` pair each."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from .tasks import (
    MQRAR,
    SPLITS,
    FlipFlop,
    FlipFlopConfig,
    MQRARConfig,
    WordProblem,
    WordProblemConfig,
    write_jsonl,
)

TASKS = ("flipflop", "a5", "s5", "mqrar")
# options that only some tasks take (dest -> tasks); None means "not given"
TASK_OPTIONS = {
    "split": ("flipflop",),
    "alphabet": ("a5", "s5"),
    "length": ("a5", "s5", "mqrar"),
    "n_back": ("mqrar",),
    "keys": ("mqrar",),
    "values": ("mqrar",),
}


def _add_data(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="export synthetic-task sequences as JSONL",
                       description=__doc__)
    p.add_argument("task", choices=TASKS)
    p.add_argument("--n", type=int, required=True, help="number of sequences")
    p.add_argument("--out", required=True, help="output .jsonl path")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", choices=sorted(SPLITS), help="flipflop (default: train)")
    p.add_argument("--alphabet", choices=("elements", "generators"),
                   help="a5, s5 (default: elements)")
    p.add_argument("--length", type=int,
                   help="tokens per sequence: a5, s5 (default 32), mqrar (default 768)")
    p.add_argument("--n-back", type=int, help="mqrar N (default 2)")
    p.add_argument("--keys", type=int, help="mqrar number of keys (default 32)")
    p.add_argument("--values", type=int, help="mqrar value vocabulary size (default 64)")
    p.set_defaults(run=_run_data)


def _build_task(args: argparse.Namespace):
    """The task object for parsed `data` arguments; options left None take the defaults."""
    given = {k: v for k, v in vars(args).items() if k in TASK_OPTIONS and v is not None}
    if args.task == "flipflop":
        return FlipFlop(FlipFlopConfig(seed=args.seed, **given))
    if args.task in ("a5", "s5"):
        return WordProblem(WordProblemConfig(group=args.task, seed=args.seed, **given))
    renamed = {"keys": "num_keys", "values": "num_values"}
    return MQRAR(MQRARConfig(seed=args.seed, **{renamed.get(k, k): v for k, v in given.items()}))


def _run_data(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    for dest, tasks in TASK_OPTIONS.items():
        if getattr(args, dest) is not None and args.task not in tasks:
            parser.error(f"--{dest.replace('_', '-')} applies to {', '.join(tasks)} only")
    if args.n < 0:
        parser.error("--n must be >= 0")
    try:
        task = _build_task(args)
    except ValueError as e:
        parser.error(str(e))
    written = write_jsonl(task, task.vocab, args.n, args.out)
    print(f"wrote {written} {args.task} sequences to {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pathattn", description="PaTH attention tools")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_data(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.run(args, parser)
