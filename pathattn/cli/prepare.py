"""`pathattn prepare`: tokenize a corpus into memory-mapped token files
(`pathattn.data.prepare_dataset`).

    pathattn prepare [--input PATH...] --tokenizer DIR --out DIR [--val-fraction F]
                     [--workers N] [--seed S] [--text-field NAME] [--overwrite]
                     [--no-progress]

--input: text files, folders and .jsonl / .parquet files (`pathattn.data.corpus`; default:
the Python standard library's source); --tokenizer: a `pathattn tokenizer` folder or any
Hugging Face one with an eos token. The output folder holds train.bin / .idx, val.bin /
.idx and meta.json (`pathattn.data.prepare`); documents go to the validation split by a
hash of their text and --seed. A non-empty --out is refused unless --overwrite.
"""

from __future__ import annotations

import argparse

from ..data.prepare import DEFAULT_VAL_FRACTION
from .args import add_corpus_flags

HELP = "tokenize a corpus into memory-mapped token files"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prepare", help=HELP, description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `pathattn prepare`; sets `run=run`."""
    p.add_argument("--tokenizer", required=True, metavar="DIR",
                   help="tokenizer folder (pathattn tokenizer, or a Hugging Face one)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.add_argument("--val-fraction", type=float, default=DEFAULT_VAL_FRACTION, metavar="F",
                   help=f"share of documents in the validation split (default "
                   f"{DEFAULT_VAL_FRACTION})")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="tokenizing processes (default: CPU count, at most 8)")
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="seed of the split (default 0)")
    add_corpus_flags(p, " with a text field", "replace the dataset files of a non-empty --out")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    """Run `pathattn prepare`; a DataError goes to `parser.error` (or is raised)."""
    from ..data import prepare_dataset

    try:
        meta = prepare_dataset(args.inputs, args.tokenizer, args.out,
                               val_fraction=args.val_fraction, workers=args.workers,
                               seed=args.seed, text_field=args.text_field,
                               overwrite=args.overwrite, progress=not args.no_progress)
    except ValueError as e:
        if parser is None:
            raise
        parser.error(str(e))
    train, val = meta["splits"]["train"], meta["splits"]["val"]
    print(f"wrote {train['documents']} train / {val['documents']} val documents "
          f"({train['tokens']} / {val['tokens']} {meta['dtype']} tokens) to {args.out}")
    return 0
