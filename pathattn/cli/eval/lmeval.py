"""`pathattn eval lm-eval`: lm-evaluation-harness tasks on a Hugging Face model folder
(`pathattn.evaluation.lmeval`).

    pathattn eval lm-eval --model RUN/hf --tasks lambada_openai hellaswag
    pathattn eval lm-eval --model RUN/hf --data PREPARED --limit 100
    pathattn eval lm-eval --model RUN/hf --longctx niah --variant multikey \
        --lengths 1024 4096 --n 20 --max-length 8192

loads the model and tokenizer from --model (`AutoModelForCausalLM` / `AutoTokenizer`,
pathattn models included), runs `evaluate_lm` and prints lm-eval's table. --data writes
the held-out perplexity task of a prepared folder (task "pathattn_ppl") and --longctx a
long-context task (tag "longctx_<task>_<variant>", one task per length) into OUT/tasks,
include them and add them to --tasks. OUT (default MODEL/eval) receives
lm_eval_results.json and lm_eval_results.md, each written atomically. Tasks from the
lm-eval registry need their datasets in the Hugging Face cache when offline.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..args import add_device_and_results_flags, add_hf_model_flag

NAME = "lm-eval"
HELP = "lm-evaluation-harness tasks (and local held-out perplexity / long-context tasks)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `pathattn eval lm-eval`."""
    add_hf_model_flag(p)
    p.add_argument("--tasks", nargs="+", default=[], metavar="T",
                   help="lm-eval task names, tags or groups")
    p.add_argument("--include-path", nargs="+", default=[], metavar="DIR",
                   help="folders of extra lm-eval task YAML files")
    p.add_argument("--data", metavar="PREPARED",
                   help="add the held-out perplexity of this prepared folder (pathattn_ppl)")
    p.add_argument("--split", default="val", choices=("val", "train"),
                   help="--data split (default val)")
    p.add_argument("--longctx", metavar="TASK",
                   help="add a long-context task (niah, vt, phonebook) at --lengths")
    p.add_argument("--variant", help="--longctx variant (niah: single, multikey, ...)")
    p.add_argument("--lengths", nargs="+", type=int, default=[], metavar="L",
                   help="--longctx prompt lengths in tokens")
    p.add_argument("--n", type=int, default=10, help="--longctx examples per length (10)")
    p.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    p.add_argument("--batch-size", type=int, default=1, metavar="B", help="default 1")
    p.add_argument("--limit", type=float, metavar="N",
                   help="documents per task (an int, or a fraction < 1)")
    p.add_argument("--num-fewshot", type=int, metavar="K", help="few-shot examples")
    p.add_argument("--max-length", type=int, metavar="T",
                   help="longest window / prompt in tokens (default: the model config's "
                   "max_position_embeddings)")
    add_device_and_results_flags(p)


def _check_counts(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """--batch-size, --n and --max-length must be positive, --lengths too (a zero
    --max-length would silently be lm-eval's default)."""
    for name in ("batch_size", "n", "max_length"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if any(length < 1 for length in args.lengths):
        parser.error(f"--lengths must be >= 1, got {args.lengths}")


def _limit(args: argparse.Namespace, parser: argparse.ArgumentParser):
    """--limit as lm-eval takes it: an int of documents, or a fraction < 1."""
    limit = args.limit
    if limit is not None:
        if limit <= 0:
            parser.error("--limit must be > 0")
        limit = int(limit) if limit >= 1 else limit
    return limit


def _check_data(args: argparse.Namespace) -> None:
    """--data: a prepared folder whose --split holds documents, prepared with --model's
    tokenizer (`pathattn.data.identity`: its documents are decoded with that tokenizer);
    ValueError naming the argument otherwise."""
    from ...data import DataError, TokenDataset
    from ...data.identity import model_for_data

    try:
        data = TokenDataset(args.data, args.split)
    except DataError as e:
        raise ValueError(f"--data: {e}") from None
    if len(data) == 0:
        raise ValueError(f"--data: the {args.split} split of {args.data} holds no document "
                         f"(prepared with val_fraction={data.meta.get('val_fraction')}); "
                         "prepare with a val_fraction > 0, or give --split train")
    model_for_data(args.model, args.data, data.meta, "--model")


def _local_tasks(args: argparse.Namespace, tokenizer, folder: Path) -> list[str]:
    """Write the tasks of --data and --longctx into `folder`; their names."""
    from ...evaluation import lmeval

    tasks = []
    if args.data:
        lmeval.write_ppl_task(args.data, folder, tokenizer, split=args.split)
        tasks.append(lmeval.PPL_TASK)
    if args.longctx:
        from ...evaluation.longctx import make_task

        task = make_task(args.longctx, args.variant)
        lmeval.write_longctx_tasks(task, tokenizer, args.lengths, args.n, folder, args.seed)
        tasks.append(f"longctx_{task.name}_{task.variant}")
    return tasks


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run `pathattn eval lm-eval` (module docstring); usage errors go to parser.error."""
    from ...evaluation import lmeval
    from ...evaluation.longctx import check_prompt_lengths
    from ...utils.io import writable_dir
    from . import load_model

    try:
        lmeval.require_lm_eval()
    except ImportError as e:
        parser.error(str(e))
    if not (args.tasks or args.data or args.longctx):
        parser.error("give --tasks, --data or --longctx")
    if args.longctx and not args.lengths:
        parser.error("--longctx needs --lengths")
    _check_counts(args, parser)
    limit = _limit(args, parser)
    out = Path(args.out) if args.out else Path(args.model) / "eval"
    tasks, include = list(args.tasks), list(args.include_path)
    try:
        if args.data:  # before the model is loaded
            _check_data(args)
        model, tokenizer = load_model(args.model, args.device)
        writable_dir(out, "--out")  # before the work: --out a file, or read-only
        if args.longctx:
            check_prompt_lengths(model, args.lengths)
        if args.data or args.longctx:
            include.append(out / "tasks")
            tasks += _local_tasks(args, tokenizer, out / "tasks")
    except ValueError as e:  # a bad folder, task / variant, a length too short
        parser.error(str(e))
    results = lmeval.evaluate_lm(model, tokenizer, tasks, include, args.batch_size, limit,
                                 args.max_length, args.num_fewshot, seed=args.seed)
    path = lmeval.save_results(results, out)
    print(lmeval.results_table(results), end="")
    print(f"wrote {path} and {path.with_suffix('.md').name}")
    return 0
