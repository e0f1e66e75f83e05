"""`pathattn eval ppl`: perplexity by context length and loss by token position of one or
more causal language models on the held-out documents of a prepared folder
(`pathattn.evaluation.ppl`).

    pathattn eval ppl --model DIR [DIR ...] --data DIR [--lengths L ...] [--out DIR]
                      [--split val] [--max-docs N] [--batch-size B]
                      [--dtype float32|bfloat16] [--device cpu] [--chunk-size N]
                      [--per-document] [--no-progress]

--model: folders loadable by `AutoModelForCausalLM.from_pretrained` (a `pathattn pretrain`
RUN/hf, or any Hugging Face causal LM) with the data's tokenizer saved next to the weights.
Every length L scores windows of L tokens that tile the held-out token stream, so each
length needs at least L + 1 held-out tokens; --per-document instead scores every held-out
document alone in windows of at most L tokens (lm-evaluation-harness's rolling
log-likelihood). The LM head runs on --chunk-size tokens at a time. Prints a markdown table
(rows: models, columns: lengths); with --out also writes DIR/ppl.json and
DIR/loss_by_position.png (`pathattn.evaluation.ppl_report`).
"""

from __future__ import annotations

import argparse

from ...evaluation.ppl import DEFAULT_CHUNK_SIZE, DEFAULT_LENGTHS, DTYPES, PplError
from ..args import add_device_flag, add_no_progress

NAME = "ppl"
HELP = "perplexity by context length and loss by token position of causal LMs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `pathattn eval ppl` (module docstring)."""
    lengths = " ".join(map(str, DEFAULT_LENGTHS))
    p.add_argument("--model", nargs="+", required=True, metavar="DIR",
                   help="model folders (save_pretrained + tokenizer), e.g. RUN/hf")
    p.add_argument("--data", required=True, metavar="DIR",
                   help="prepared folder (pathattn prepare) whose held-out split is scored")
    p.add_argument("--lengths", nargs="+", type=int, default=list(DEFAULT_LENGTHS),
                   metavar="L", help=f"context lengths in tokens (default {lengths})")
    p.add_argument("--out", metavar="DIR",
                   help="write ppl.json and loss_by_position.png there (default: print only)")
    p.add_argument("--split", default="val", help="split of --data to score (default val)")
    p.add_argument("--max-docs", type=int, metavar="N",
                   help="score the split's first N documents only (default: all)")
    p.add_argument("--batch-size", type=int, default=1, metavar="B",
                   help="windows per forward pass (default 1)")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="float32, or bfloat16 autocast (default float32)")
    add_device_flag(p)
    p.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE, metavar="N",
                   help=f"tokens per LM-head chunk, 0 = all logits at once (default "
                   f"{DEFAULT_CHUNK_SIZE})")
    p.add_argument("--per-document", action="store_true",
                   help="score each held-out document alone, in windows of at most L "
                   "tokens (lm-eval's rolling log-likelihood), instead of windows of L "
                   "tokens tiling the concatenated documents")
    add_no_progress(p)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    """Run `pathattn eval ppl`; a bad argument goes to `parser.error` naming the option
    (or is raised as PplError when parser is None). Returns the exit code (0)."""
    from ...evaluation.ppl_models import evaluate_models
    from ...evaluation.ppl_report import markdown_table, write_report
    from ...utils.device import resolve_device
    from ...utils.io import writable_dir

    try:
        try:
            device = resolve_device(args.device)
        except ValueError as e:
            raise PplError("device", str(e).removeprefix("--device").lstrip(" :")) from None
        if args.chunk_size is not None and args.chunk_size < 0:
            raise PplError("chunk_size", f"must be a non-negative int, got {args.chunk_size}")
        if args.out is not None:  # before the work: a file, or read-only
            try:
                writable_dir(args.out)
            except ValueError as e:
                raise PplError("out", str(e)) from None
        report = evaluate_models(
            args.model, args.data, args.lengths, split=args.split, max_docs=args.max_docs,
            batch_size=args.batch_size, chunk_size=args.chunk_size or None, dtype=args.dtype,
            device=device, progress=not args.no_progress,
            per_document=args.per_document)
        print(markdown_table(report))
        if args.out is not None:
            for path in write_report(report, args.out):
                print(f"wrote {path}")
    except PplError as e:
        if parser is None:
            raise
        parser.error(f"--{e.argument.replace('_', '-')}: {e.message}")
    return 0
