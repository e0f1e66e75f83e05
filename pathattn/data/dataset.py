"""`TokenDataset`: one split of a folder written by `pathattn prepare`, memory-mapped.

The token file is opened as a read-only `np.memmap` (nothing is loaded until read, and
forked data-loader workers or several processes share the page cache); the document
offsets (8 bytes per document) are read into memory. Opening checks meta.json against the
files (format, dtype, sizes, offsets), so a folder left incomplete by an interrupted
`prepare` (no meta.json) or altered afterwards (sizes, offsets, or meta.json values that
`prepare` cannot have written) is refused with an error naming the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .corpus import DataError
from .identity import data_identity, describe
from .prepare import FORMAT, FORMAT_VERSION, SPLITS, token_dtype
from .tokenizer import MAX_VOCAB_SIZE

__all__ = ["TokenDataset", "read_meta"]


def read_meta(path: str | os.PathLike) -> dict:
    """meta.json of a prepared folder; DataError when missing or of another format."""
    file = Path(path) / "meta.json"
    try:
        meta = json.loads(file.read_text())
    except FileNotFoundError:
        raise DataError(f"{path}: not a prepared dataset (no meta.json; run `pathattn "
                        "prepare`, or it was interrupted)") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{file}: not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or \
            meta.get("version") != FORMAT_VERSION:
        got = meta if not isinstance(meta, dict) else \
            f"format {meta.get('format')!r} version {meta.get('version')!r}"
        raise DataError(f"{file}: {got}, expected format {FORMAT!r} version {FORMAT_VERSION}")
    _check_meta(meta, file)
    return meta


def _is_count(value, low: int = 0, high: int | None = None) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low and \
        (high is None or value < high)


def _check_meta(meta: dict, file: Path) -> None:
    """DataError naming the field of meta.json whose value cannot be the one `pathattn
    prepare` wrote (a hand-edited or damaged file), before any of it is used."""
    tok = meta.get("tokenizer")
    if not isinstance(tok, dict) or not isinstance(tok.get("path"), str):
        raise DataError(f"{file}: tokenizer must be a record with a path, got {tok!r}")
    vocab = tok.get("vocab_size")
    if not _is_count(vocab, 1, MAX_VOCAB_SIZE + 1):
        raise DataError(f"{file}: tokenizer.vocab_size must be an int in [1, 2**32], got "
                        f"{vocab!r}")
    for key in ("bos_id", "eos_id", "pad_id"):
        if not (key == "bos_id" and tok.get(key) is None) and \
                not _is_count(tok.get(key), 0, vocab):
            raise DataError(f"{file}: tokenizer.{key} must be an id in [0, {vocab}), got "
                            f"{tok.get(key)!r}")
    if meta.get("dtype") != token_dtype(vocab).name:
        raise DataError(f"{file}: dtype {meta.get('dtype')!r} is not that of "
                        f"{vocab} ids ({token_dtype(vocab).name})")
    if not isinstance(meta.get("bos"), bool):
        raise DataError(f"{file}: bos must be true or false, got {meta.get('bos')!r}")
    splits = meta.get("splits")
    if not isinstance(splits, dict) or not all(
            isinstance(splits.get(s), dict) and _is_count(splits[s].get("documents"))
            and _is_count(splits[s].get("tokens")) for s in SPLITS):
        raise DataError(f"{file}: splits must be {{split: {{documents, tokens}}}} for "
                        f"{SPLITS} with non-negative ints, got {splits!r}")
    identity = data_identity(meta, str(file))
    if identity is not None and any(identity[k] != tok.get(k) for k in (
            "vocab_size", "bos_id", "eos_id", "pad_id")):
        raise DataError(f"{file}: tokenizer.identity ({describe(identity)}) does not match "
                        f"the tokenizer record ({vocab} ids, bos/eos/pad "
                        f"{tok.get('bos_id')}/{tok.get('eos_id')}/{tok.get('pad_id')})")


class TokenDataset:
    """The documents of one split ("train" or "val") of a prepared folder.

    Attributes: meta (meta.json), split, tokens (np.memmap [num_tokens] of uint16 /
    uint32), offsets (int64 [num_documents + 1]), lengths (int64 [num_documents]),
    vocab_size, bos_id / eos_id / pad_id (bos None when documents have none; pad falls back
    to eos). `dataset[d]` is document d's ids (a read-only view).
    """

    def __init__(self, path: str | os.PathLike, split: str = "train"):
        if split not in SPLITS:
            raise DataError(f"split must be one of {SPLITS}, got {split!r}")
        self.path, self.split = Path(path), split
        self.meta = read_meta(path)
        counts = self.meta["splits"][split]
        self.dtype = np.dtype(self.meta["dtype"])
        self.offsets = self._read_offsets(counts["documents"], counts["tokens"])
        self.tokens = self._map_tokens(counts["tokens"])
        self.lengths = np.diff(self.offsets)

    def _read_offsets(self, documents: int, tokens: int) -> np.ndarray:
        file = self.path / f"{self.split}.idx"
        try:
            offsets = np.fromfile(file, dtype=np.int64)
        except OSError as e:
            raise DataError(f"{file}: cannot be read ({e.strerror or e})") from None
        if len(offsets) != documents + 1 or offsets[0] != 0 or offsets[-1] != tokens or \
                bool((np.diff(offsets) < 0).any()):
            raise DataError(f"{file}: offsets do not match meta.json ({documents} documents, "
                            f"{tokens} tokens)")
        return offsets

    def _map_tokens(self, tokens: int) -> np.ndarray:
        file = self.path / f"{self.split}.bin"
        try:
            size = file.stat().st_size
        except OSError as e:
            raise DataError(f"{file}: cannot be read ({e.strerror or e})") from None
        if size != tokens * self.dtype.itemsize:
            raise DataError(f"{file}: {size} bytes, meta.json says {tokens} {self.dtype} "
                            "tokens")
        if tokens == 0:  # np.memmap cannot map an empty file
            return np.zeros(0, dtype=self.dtype)
        return np.memmap(file, dtype=self.dtype, mode="r", shape=(tokens,))

    @property
    def num_documents(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    @property
    def vocab_size(self) -> int:
        return int(self.meta["tokenizer"]["vocab_size"])

    @property
    def bos_id(self) -> int | None:
        return self.meta["tokenizer"]["bos_id"] if self.meta["bos"] else None

    @property
    def eos_id(self) -> int:
        return int(self.meta["tokenizer"]["eos_id"])

    @property
    def pad_id(self) -> int:
        return int(self.meta["tokenizer"]["pad_id"])

    def __len__(self) -> int:
        return self.num_documents

    def __getitem__(self, d: int) -> np.ndarray:
        if not -self.num_documents <= d < self.num_documents:
            raise IndexError(f"document {d} out of range ({self.num_documents} documents)")
        d %= self.num_documents
        return self.tokens[self.offsets[d]:self.offsets[d + 1]]

    def __repr__(self) -> str:
        return (f"TokenDataset({str(self.path)!r}, {self.split!r}: {self.num_documents} "
                f"documents, {self.num_tokens} {self.dtype} tokens)")
