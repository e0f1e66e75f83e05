"""`TokenDataset`: one split of a folder written by `pathattn prepare`, memory-mapped.

The token file is opened as a read-only `np.memmap` (nothing is loaded until read, and
forked data-loader workers or several processes share the page cache); the document
offsets (8 bytes per document) are read into memory. Opening checks meta.json against the
files (format, dtype, sizes, offsets), so a folder left incomplete by an interrupted
`prepare` (no meta.json) or altered afterwards is refused with an error naming the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .corpus import DataError
from .prepare import FORMAT, FORMAT_VERSION, SPLITS

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
    if meta.get("format") != FORMAT or meta.get("version") != FORMAT_VERSION:
        raise DataError(f"{file}: format {meta.get('format')!r} version "
                        f"{meta.get('version')!r}, expected {FORMAT!r} {FORMAT_VERSION}")
    return meta


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
        offsets = np.fromfile(file, dtype=np.int64)
        if len(offsets) != documents + 1 or offsets[0] != 0 or offsets[-1] != tokens or \
                bool((np.diff(offsets) < 0).any()):
            raise DataError(f"{file}: offsets do not match meta.json ({documents} documents, "
                            f"{tokens} tokens)")
        return offsets

    def _map_tokens(self, tokens: int) -> np.ndarray:
        file = self.path / f"{self.split}.bin"
        size = file.stat().st_size
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
