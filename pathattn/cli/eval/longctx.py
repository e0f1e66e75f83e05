"""`pathattn eval longctx`: accuracy of a Hugging Face causal LM on a long-context task at
several lengths (`pathattn.evaluation.longctx`).

    pathattn eval longctx --model DIR --task niah --variant multikey --lengths 1024 4096 \
        --n 20 --out RESULTS

loads the model and its tokenizer from DIR (`AutoModelForCausalLM` / `AutoTokenizer`;
pathattn models resolve because pathattn registers them), scores `--n` seeded examples
per length (`evaluate_task`), prints the markdown table and writes
OUT/longctx_<task>_<variant>.md and .json (each written atomically). OUT
defaults to DIR/eval. The JSON holds the rows and, per example, the answers, the output
and the score (not the prompts: regenerate them from task, options, seed, length and
index).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..args import add_device_and_results_flags, add_hf_model_flag, add_no_progress

NAME = "longctx"
HELP = "accuracy on long-context synthetic tasks (needle in a haystack, vt, phonebook)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `pathattn eval longctx`."""
    from ...evaluation.longctx import task_names

    add_hf_model_flag(p)
    p.add_argument("--task", required=True, choices=task_names())
    p.add_argument("--lengths", required=True, nargs="+", type=int, metavar="L",
                   help="prompt lengths in tokens")
    p.add_argument("--n", type=int, default=10, help="examples per length (default 10)")
    p.add_argument("--seed", type=int, default=0, help="seed of the examples (default 0)")
    p.add_argument("--variant", help="niah: single (default), multikey, multivalue, "
                   "multiquery")
    p.add_argument("--haystack", nargs="+", metavar="FILE",
                   help="niah, vt: text / .jsonl files whose text fills the haystack "
                   "(default: repeated noise sentences)")
    p.add_argument("--chains", type=int, help="vt: number of chains (default 1)")
    p.add_argument("--hops", type=int, help="vt: copies per chain (default 4)")
    p.add_argument("--max-new-tokens", type=int, metavar="N",
                   help="tokens generated per example (default: the answer's tokens x "
                   "1.25 + 8)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="float32, or bfloat16 autocast (default float32)")
    add_device_and_results_flags(p)
    add_no_progress(p, "no tqdm progress bar")


def task_options(args: argparse.Namespace) -> dict:
    """The task constructor keywords given on the command line."""
    from ...evaluation.longctx import read_corpus

    options = {}
    if args.haystack:
        options["corpus"] = read_corpus(args.haystack)
    if args.chains is not None:
        options["num_chains"] = args.chains
    if args.hops is not None:
        options["num_hops"] = args.hops
    return options


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run `pathattn eval longctx` (module docstring); usage errors go to parser.error."""
    from ...evaluation.longctx import (
        evaluate_task,
        make_task,
        results_table,
        write_text_atomic,
    )
    from ...utils.io import atomic_write_json, writable_dir
    from . import load_model

    if args.n < 1 or any(length < 1 for length in args.lengths):
        parser.error("--n and --lengths must be >= 1")
    try:
        task = make_task(args.task, args.variant, **task_options(args))
    except (TypeError, ValueError, OSError) as e:
        parser.error(f"--task {args.task}: {e}")
    out = Path(args.out) if args.out else Path(args.model) / "eval"
    try:
        model, tokenizer = load_model(args.model, args.device)
        writable_dir(out, "--out")  # before the work: --out a file, or read-only
        results = evaluate_task(model, tokenizer, task, args.lengths, args.n, args.seed,
                                args.max_new_tokens, progress=not args.no_progress,
                                dtype=args.dtype)
    except ValueError as e:  # a bad --model, a length too short or too long for memory
        parser.error(str(e))
    results["model"] = str(args.model)
    table = results_table(results)
    stem = f"longctx_{task.name}_{task.variant}"
    atomic_write_json(out / f"{stem}.json", results, indent=2)  # strict JSON
    write_text_atomic(out / f"{stem}.md", f"{task.name} ({task.variant})\n\n{table}")
    print(f"{task.name} ({task.variant}), {args.n} examples per length, model {args.model}")
    print(table, end="")
    print(f"wrote {out / stem}.json and .md")
    return 0
