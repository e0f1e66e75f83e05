"""Language-model pretraining data: a byte-level BPE tokenizer (`tokenizer`), corpora with
an offline default (the Python standard library's source, `corpus`), tokenization into
memory-mapped token files (`prepare`, `dataset`), and fixed-size, packed, resumable,
data-parallel batches (`loader`).

    pathattn tokenizer [--input PATH...] --vocab-size N --out TOK     train_tokenizer(...)
    pathattn prepare [--input PATH...] --tokenizer TOK --out DATA     prepare_dataset(...)
    TokenLoader(DATA, seq_len, batch_size)                            training batches
    EvalLoader(DATA, seq_len, batch_size)                             the val split, once

`add_tokenizer_arguments` / `run_tokenizer` and `add_prepare_arguments` / `run_prepare`
are the argparse halves of the two commands.
"""

from .corpus import (
    RECORD_EXTENSIONS,
    TEXT_EXTENSIONS,
    CorpusReader,
    DataError,
    Source,
    collect_sources,
    default_corpus_files,
    default_corpus_source,
)
from .dataset import TokenDataset, read_meta
from .loader import MODES, Batch, EvalLoader, TokenLoader, epoch_order, rank_rows
from .prepare import (
    DEFAULT_VAL_FRACTION,
    add_prepare_arguments,
    prepare_dataset,
    run_prepare,
    split_key,
    token_dtype,
)
from .tokenizer import (
    SPECIAL_TOKENS,
    add_tokenizer_arguments,
    load_tokenizer,
    run_tokenizer,
    special_ids,
    train_tokenizer,
)

__all__ = ["DataError", "Source", "CorpusReader", "collect_sources", "default_corpus_files",
           "default_corpus_source", "TEXT_EXTENSIONS", "RECORD_EXTENSIONS", "train_tokenizer",
           "load_tokenizer", "special_ids", "SPECIAL_TOKENS", "add_tokenizer_arguments",
           "run_tokenizer", "prepare_dataset", "token_dtype", "split_key",
           "DEFAULT_VAL_FRACTION", "add_prepare_arguments", "run_prepare", "TokenDataset",
           "read_meta", "TokenLoader", "EvalLoader", "Batch", "MODES", "epoch_order",
           "rank_rows"]
