"""Language-model pretraining data: a byte-level BPE tokenizer (`tokenizer`), corpora with
an offline default (the Python standard library's source, `corpus`), tokenization into
memory-mapped token files (`prepare`, `dataset`), and fixed-size, packed, resumable,
data-parallel batches (`loader`).

    pathattn tokenizer [--input PATH...] --vocab-size N --out TOK     train_tokenizer(...)
    pathattn prepare [--input PATH...] --tokenizer TOK --out DATA     prepare_dataset(...)
    TokenLoader(DATA, seq_len, batch_size)                            training batches
    EvalLoader(DATA, seq_len, batch_size)                             the val split, once

The two commands are `pathattn.cli.tokenizer` and `pathattn.cli.prepare`.
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
from .prepare import DEFAULT_VAL_FRACTION, prepare_dataset, split_key, token_dtype
from .tokenizer import SPECIAL_TOKENS, load_tokenizer, special_ids, train_tokenizer

__all__ = ["DataError", "Source", "CorpusReader", "collect_sources", "default_corpus_files",
           "default_corpus_source", "TEXT_EXTENSIONS", "RECORD_EXTENSIONS", "train_tokenizer",
           "load_tokenizer", "special_ids", "SPECIAL_TOKENS", "prepare_dataset", "token_dtype",
           "split_key", "DEFAULT_VAL_FRACTION", "TokenDataset",
           "read_meta", "TokenLoader", "EvalLoader", "Batch", "MODES", "epoch_order",
           "rank_rows"]
