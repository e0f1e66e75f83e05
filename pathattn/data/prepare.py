"""`pathattn prepare`: tokenize a corpus into memory-mappable token files.

Layout of the output folder (format "pathattn-tokens", version 1):

    train.bin, val.bin    token ids of the split's documents, concatenated, flat uint16
                          when len(tokenizer) <= 65536, else uint32 (native byte order)
    train.idx, val.idx    int64 [documents + 1]: document d is bin[idx[d]:idx[d + 1]]
    meta.json             tokenizer (path, class, vocab size, bos / eos / pad ids, sha256
                          of its files, identity: `pathattn.data.identity`), dtype,
                          documents and tokens per split, the sources with their sha256
                          (`pathattn.data.corpus`; the default corpus's record holds the
                          Python version), val_fraction, seed, versions

Choices and reasons:
- Documents are encoded without the tokenizer's own special tokens, then get BOS first
  (when the tokenizer has a bos token) and EOS last (always; a tokenizer without eos is
  refused). BOS gives the first real token of every document a context to be predicted
  from (with packed, masked batches nothing else precedes it) and marks document starts
  the way prompts start at inference; EOS teaches the model to end a document.
- An empty document (an empty file or record) is skipped and counted in meta.json.
- Split by document, by hash: a document goes to val when the first 8 bytes of
  sha256(seed, its text) read as an integer fall below val_fraction * 2**64. So the split
  of a document depends only on its text and the seed: the same inputs give the same
  split, adding or removing files moves no other document, and identical documents always
  land in the same split (no exact duplicate leaks from train into val). The val share is
  about val_fraction (binomial); an empty val split with val_fraction > 0, or an empty
  train split, is an error naming the fraction.
- Parallel: `workers` spawned processes tokenize chunks of documents (spawn, not fork:
  the parent may hold torch / tokenizers thread pools; a script that calls
  `prepare_dataset` with workers > 1 needs the usual `if __name__ == "__main__":` guard);
  results are consumed in input order, so the files are byte-identical for any number of
  workers. Workers die with the parent, a SIGKILL included (`pathattn.utils.system`).
- Atomic: every file is written under a temp name and moved into place at the end
  (`pathattn.data._files`); meta.json is removed first and written last, so a folder with
  meta.json is complete. A failure (bad line, Ctrl-C) leaves a previous dataset intact.
  The folder is locked while written: a second `prepare` on it is refused at once.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import numbers
import os
import platform
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack, closing
from itertools import islice
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from ..utils.system import die_with_parent
from ._files import AtomicFile, package_versions, prepare_out_dir, write_json
from .corpus import CorpusReader, DataError, collect_sources, read_text_file
from .identity import folder_files_sha256, tokenizer_identity
from .tokenizer import load_tokenizer, special_ids

__all__ = ["prepare_dataset", "token_dtype", "split_key", "DATA_FILES", "SPLITS", "FORMAT",
           "FORMAT_VERSION", "DEFAULT_VAL_FRACTION"]

FORMAT, FORMAT_VERSION = "pathattn-tokens", 1
SPLITS = ("train", "val")
DATA_FILES = ("train.bin", "train.idx", "val.bin", "val.idx", "meta.json")
DEFAULT_VAL_FRACTION = 0.02  # default corpus: 18 of 731 documents, about 3 % of the text
CHUNKSIZE = 4  # documents per worker task


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65536), else uint32."""
    if vocab_size > 2 ** 32:
        raise DataError(f"tokenizer: vocab size {vocab_size} does not fit uint32 ids")
    return np.dtype(np.uint16 if vocab_size <= 2 ** 16 else np.uint32)


def split_key(text: str, seed: int) -> int:
    """The document's split key in [0, 2**64): val when key < val_fraction * 2**64."""
    digest = hashlib.sha256(f"{seed}\0".encode() + text.encode("utf-8", "surrogatepass"))
    return int.from_bytes(digest.digest()[:8], "big")


# ---------------------------------------------------------------------- tokenizing

class _Encoder:
    """Task of `CorpusReader.tasks()` -> (source index, file path or None, file sha256 or
    None, split key, ids [n] of `dtype` or None for an empty document)."""

    def __init__(self, tokenizer: str, seed: int, dtype: str, tok=None):
        self.tok = load_tokenizer(tokenizer) if tok is None else tok
        self.ids = special_ids(self.tok)
        self.vocab = len(self.tok)
        self.seed, self.dtype = seed, np.dtype(dtype)

    def __call__(self, task: tuple[int, Path | str]):
        source_index, payload = task
        path = sha = None
        if isinstance(payload, Path):
            path = payload
            payload, sha = read_text_file(path)
        if not payload:
            return source_index, path, sha, 0, None
        ids = self.tok.encode(payload, add_special_tokens=False, verbose=False)
        bos = [] if self.ids["bos_id"] is None else [self.ids["bos_id"]]
        ids = np.asarray(bos + list(ids) + [self.ids["eos_id"]], dtype=np.int64)
        if ids.min() < 0 or ids.max() >= self.vocab:
            raise DataError(f"tokenizer: produced ids outside [0, {self.vocab}) "
                            f"({path or 'a record'})")
        return source_index, path, sha, split_key(payload, self.seed), ids.astype(self.dtype)


_WORKER_ENCODER: _Encoder | Exception | None = None


def _init_worker(tokenizer: str, seed: int, dtype: str, parent_pid: int) -> None:
    """Worker initializer: the worker dies with the parent (`die_with_parent`). An error
    is kept and raised by the first task, so that it reaches the parent with its message
    (an initializer that raises only breaks the pool)."""
    global _WORKER_ENCODER
    die_with_parent(parent_pid)
    try:
        _WORKER_ENCODER = _Encoder(tokenizer, seed, dtype)
    except Exception as e:  # handed to the parent
        _WORKER_ENCODER = e


def _encode_chunk(tasks: list) -> list:
    if isinstance(_WORKER_ENCODER, Exception):
        raise _WORKER_ENCODER
    return [_WORKER_ENCODER(task) for task in tasks]


class _SplitWriter:
    """Streams one split's documents to temp files; `commit()` moves them into place."""

    def __init__(self, out: Path, split: str):
        self.bin = AtomicFile(out / f"{split}.bin")
        self.idx = AtomicFile(out / f"{split}.idx")
        self.offsets = [0]

    def add(self, ids: np.ndarray) -> None:
        self.bin.write(ids.tobytes())
        self.offsets.append(self.offsets[-1] + len(ids))

    @property
    def documents(self) -> int:
        return len(self.offsets) - 1

    @property
    def tokens(self) -> int:
        return self.offsets[-1]

    def commit(self) -> None:
        self.idx.write(np.asarray(self.offsets, dtype=np.int64).tobytes())
        self.bin.commit()
        self.idx.commit()

    def discard(self) -> None:
        self.bin.discard()
        self.idx.discard()


def _chunks(items: Iterator, size: int) -> Iterator[list]:
    while chunk := list(islice(items, size)):
        yield chunk


def _encoded_in_workers(tasks: Iterator, args: tuple, workers: int) -> Iterator[tuple]:
    """`_Encoder` results of `tasks` from `workers` spawned processes, in order. At most
    2 * workers chunks are in flight, so that reading stays just ahead of tokenizing. A
    worker that dies (killed, out of memory) raises BrokenProcessPool rather than hangs;
    workers die with this process (`_init_worker`), a SIGKILL included."""
    context = mp.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                             initargs=(*args, os.getpid())) as pool:
        pending: deque = deque()
        try:
            for chunk in _chunks(tasks, CHUNKSIZE):
                pending.append(pool.submit(_encode_chunk, chunk))
                if len(pending) >= 2 * workers:
                    yield from pending.popleft().result()
            while pending:
                yield from pending.popleft().result()
        finally:  # an error, or the consumer stopped: drop the chunks not started
            for future in pending:
                future.cancel()


def _encoded(reader: CorpusReader, args: tuple, workers: int, tok) -> Iterator[tuple]:
    """The `_Encoder` results of every task of `reader`, in order (`tok`: the tokenizer
    loaded here, used when workers == 1)."""
    if workers == 1:
        encoder = _Encoder(*args, tok=tok)
        return (encoder(task) for task in reader.tasks())
    return _encoded_in_workers(reader.tasks(), args, workers)


def _tokenize(reader: CorpusReader, writers: dict, args: tuple, workers: int, tok,
              threshold: int, progress: bool) -> int:
    """Tokenize every document into `writers`; returns the number of empty ones skipped."""
    skipped = 0
    total = reader.num_files if reader.only_text_files else None
    with ExitStack() as stack:
        results = stack.enter_context(closing(_encoded(reader, args, workers, tok)))
        bar = stack.enter_context(tqdm(total=total, unit="doc", desc="tokenizing",
                                       disable=not progress))
        for source_index, path, sha, key, ids in results:
            if path is not None:
                reader.add_file_hash(source_index, path, sha)
            bar.update()
            if ids is None:
                skipped += 1
                continue
            reader.count_document(source_index)
            writers["val" if key < threshold else "train"].add(ids)
    return skipped


# ----------------------------------------------------------------------- checking

def _check_args(val_fraction, workers, seed) -> int:
    """Validate the options; returns the number of workers."""
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, numbers.Real) or \
            not 0 <= val_fraction < 1:
        raise DataError(f"val_fraction must be a number in [0, 1), got {val_fraction!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise DataError(f"seed must be a non-negative int, got {seed!r}")
    if workers is None:
        return max(1, min(8, os.cpu_count() or 1))
    if isinstance(workers, bool) or not isinstance(workers, numbers.Integral) or workers < 1:
        raise DataError(f"workers must be a positive int, got {workers!r}")
    return int(workers)


def _check_splits(writers: dict, skipped: int, val_fraction: float) -> None:
    train, val = writers["train"].documents, writers["val"].documents
    if train + val == 0:
        raise DataError(f"empty corpus: no non-empty document ({skipped} empty ones)")
    if train == 0:
        raise DataError(f"the train split is empty: all {val} documents fell in the "
                        f"validation split (val_fraction={val_fraction}); use a smaller "
                        "val_fraction")
    if val == 0 and val_fraction > 0:
        raise DataError(f"the validation split is empty: none of the {train} documents fell "
                        f"in it (val_fraction={val_fraction}; a document goes there when the "
                        "hash of its text and the seed is below that fraction); use a larger "
                        "val_fraction or another seed (val_fraction=0 makes no validation "
                        "split, which `pathattn pretrain` and the evaluations need)")


def _meta(tokenizer: Path, tok, dtype, writers, skipped, reader, val_fraction, seed,
          text_field) -> dict:
    sources = reader.sources_meta()
    stdlib = [s for s in sources if s["kind"] == "python-stdlib"]
    return dict(
        format=FORMAT, version=FORMAT_VERSION,
        tokenizer={"path": str(tokenizer), "class": type(tok).__name__,
                   "vocab_size": len(tok), **special_ids(tok),
                   "files_sha256": folder_files_sha256(tokenizer),
                   "identity": tokenizer_identity(tok)},
        dtype=dtype.name, bos=tok.bos_token_id is not None,
        splits={s: dict(documents=w.documents, tokens=w.tokens) for s, w in writers.items()},
        skipped_empty_documents=skipped, val_fraction=float(val_fraction), seed=int(seed),
        text_field=text_field, sources=sources,
        python=platform.python_version() if stdlib else None,
        versions=package_versions("tokenizers", "transformers", "numpy"))


# --------------------------------------------------------------------------- main

def prepare_dataset(inputs=None, tokenizer: str | os.PathLike = "tokenizer",
                    out: str | os.PathLike = "data", *,
                    val_fraction: float = DEFAULT_VAL_FRACTION, workers: int | None = None,
                    seed: int = 0, text_field: str = "text", overwrite: bool = False,
                    progress: bool = True) -> dict:
    """Tokenize the documents of `inputs` into `out` (module docstring); returns meta.json.

    Args:
        inputs: files and folders (`pathattn.data.corpus`); None = the default corpus.
        tokenizer: a tokenizer folder (`pathattn tokenizer`, or any Hugging Face one with an
            eos token).
        out: output folder (refused when not empty, unless `overwrite`).
        val_fraction: expected share of documents in the validation split, in [0, 1).
        workers: tokenizing processes (None = the CPU count, at most 8; 1 = in this
            process). The output does not depend on it.
        seed: seed of the train / validation split.
        text_field: the text field of JSON Lines / parquet records.
        overwrite: replace the dataset files of a non-empty `out` (nothing else there).
        progress: tqdm bar over documents.
    """
    workers = _check_args(val_fraction, workers, seed)
    tok = load_tokenizer(tokenizer)
    tokenizer = Path(tokenizer).resolve()
    dtype = token_dtype(len(tok))
    reader = CorpusReader(collect_sources(inputs), text_field)
    threshold = int(val_fraction * 2 ** 64)
    with ExitStack() as stack:
        out = stack.enter_context(prepare_out_dir(out, DATA_FILES, overwrite))
        writers = {}
        for split in SPLITS:
            writers[split] = _SplitWriter(out, split)
            stack.callback(writers[split].discard)  # no-op once committed
        skipped = _tokenize(reader, writers, (str(tokenizer), int(seed), dtype.str), workers,
                            tok, threshold, progress)
        _check_splits(writers, skipped, val_fraction)
        meta = _meta(tokenizer, tok, dtype, writers, skipped, reader, val_fraction, seed,
                     text_field)
        (out / "meta.json").unlink(missing_ok=True)
        for writer in writers.values():
            writer.commit()
        write_json(out / "meta.json", meta)
    return meta
