"""`pathattn tokenizer`: train a byte-level BPE tokenizer (`pathattn.data.train_tokenizer`).

    pathattn tokenizer [--input PATH...] [--vocab-size N] --out DIR [--min-frequency N]
                       [--text-field NAME] [--overwrite] [--no-progress]

--input: text files, folders and .jsonl / .parquet files (`pathattn.data.corpus`; default:
the Python standard library's source). DIR receives a Hugging Face tokenizer folder
(`AutoTokenizer.from_pretrained(DIR)`) with the special tokens <|bos|>, <|eos|>, <|pad|>.
A non-empty DIR is refused unless --overwrite.
"""

from __future__ import annotations

import argparse

from ..data.tokenizer import DEFAULT_VOCAB_SIZE
from .args import add_corpus_flags

HELP = "train a byte-level BPE tokenizer"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tokenizer", help=HELP, description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `pathattn tokenizer`; sets `run=run`."""
    p.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE, metavar="N",
                   help=f"vocabulary size, special tokens included (default "
                   f"{DEFAULT_VOCAB_SIZE})")
    p.add_argument("--out", required=True, metavar="DIR", help="tokenizer folder")
    p.add_argument("--min-frequency", type=int, default=2, metavar="N",
                   help="pairs seen fewer times are not merged (default 2)")
    add_corpus_flags(p, "", "replace the tokenizer files of a non-empty --out")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    """Run `pathattn tokenizer`; a DataError goes to `parser.error` (or is raised)."""
    from ..data import load_tokenizer, train_tokenizer

    try:
        out = train_tokenizer(args.inputs, args.vocab_size, args.out,
                              min_frequency=args.min_frequency, text_field=args.text_field,
                              overwrite=args.overwrite, progress=not args.no_progress)
    except ValueError as e:
        if parser is None:
            raise
        parser.error(str(e))
    tok = load_tokenizer(out)
    print(f"wrote a {len(tok)}-token byte-level BPE tokenizer to {out}")
    return 0
