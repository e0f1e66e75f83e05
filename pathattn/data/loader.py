"""Fixed-size token batches from a prepared folder: `TokenLoader` (training, endless,
resumable, shardable) and `EvalLoader` (the validation split, once).

Global batch k is the positions [k B L, (k + 1) B L) of an endless stream of shuffled
epochs (L = seq_len), plus one token of lookahead: no padding, and the resume state is one
int. "packed" rows carry `cu_seqlens` boundaries at every row and document start (labels
IGNORE_INDEX at a document's last token); "windows" rows are plain next-token windows.
Rank r of W gets rows [r0, r1) of every global batch. `EvalLoader` pads its last batch with
the pad id, never scored. The stream, modes, order, sharding and resume in detail:
docs/pretraining.md, "The token stream".
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, replace

import numpy as np
import torch

from ..models.lm import IGNORE_INDEX
from .corpus import DataError
from .dataset import TokenDataset

__all__ = ["TokenLoader", "EvalLoader", "Batch", "epoch_order", "rank_rows", "MODES"]

MODES = ("packed", "windows")
_U64 = np.uint64


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on a uint64 array (a bijection with good avalanche)."""
    x = x + _U64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


def epoch_order(num_documents: int, seed: int, epoch: int) -> np.ndarray:
    """int64 [num_documents]: the documents of `epoch` in their shuffled order."""
    key = _mix64(_mix64(np.array([seed], _U64)) ^ np.array([epoch], _U64))
    return np.argsort(_mix64(np.arange(num_documents, dtype=_U64) ^ key), kind="stable")


def rank_rows(batch_size: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rows [r0, r1) of rank `rank` (np.array_split of batch_size rows into world_size)."""
    base, extra = divmod(batch_size, world_size)
    r0 = rank * base + min(rank, extra)
    return r0, r0 + base + (rank < extra)


class _Stream:
    """The token stream of a split: endless (epochs in shuffled or stored order) or one
    pass in stored order, padded with pad ids past its end."""

    def __init__(self, data: TokenDataset, seed: int, shuffle: bool, endless: bool):
        self.data, self.seed, self.shuffle, self.endless = data, seed, shuffle, endless
        self.total = data.num_tokens
        self._epochs: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(order [M], starts [M + 1]): documents in epoch order and their stream offsets."""
        if epoch not in self._epochs:
            M = self.data.num_documents
            order = epoch_order(M, self.seed, epoch) if self.shuffle else np.arange(M)
            starts = np.concatenate([[0], np.cumsum(self.data.lengths[order])])
            if len(self._epochs) >= 2:  # a batch spans at most two epochs
                del self._epochs[min(self._epochs)]
            self._epochs[epoch] = (order, starts)
        return self._epochs[epoch]

    def read(self, start: int, n: int):
        """Positions [start, start + n) -> (tokens int64 [n], first, last, pad: bool [n]):
        first / last mark a document's first / last token, pad the positions past the end
        of a one-pass stream."""
        data = self.data
        tokens = np.full(n, data.pad_id, dtype=np.int64)
        first, last = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        pad = np.ones(n, dtype=bool)
        i, pos = 0, start
        while i < n:
            epoch, offset = divmod(pos, self.total)
            if epoch and not self.endless:
                break
            order, starts = self._epoch(epoch)
            j = int(np.searchsorted(starts, offset, side="right")) - 1
            d, a = int(order[j]), offset - int(starts[j])
            length = int(data.lengths[d])
            take = min(length - a, n - i)
            begin = int(data.offsets[d]) + a
            tokens[i:i + take] = data.tokens[begin:begin + take]
            pad[i:i + take] = False
            first[i] = a == 0
            last[i + take - 1] = a + take == length
            i, pos = i + take, pos + take
        return tokens, first, last, pad


@dataclass
class Batch:
    """This rank's part of one global batch (module docstring).

    input_ids: int64, packed [1, R * L], windows [R, L]. labels: int64, same shape,
    aligned (labels[.., t] = target of position t), IGNORE_INDEX = not scored.
    cu_seqlens: int32 [S + 1] (packed) or None. index: the global batch index. rows: this
    rank's rows [r0, r1) of the global batch. num_scored / global_num_scored: scored
    targets of this part / of the whole global batch.
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    cu_seqlens: torch.Tensor | None
    index: int
    rows: tuple[int, int]
    num_scored: int
    global_num_scored: int

    def model_inputs(self) -> dict[str, torch.Tensor | None]:
        """The keyword arguments of `PaTHLM.forward`: `model(**batch.model_inputs())`."""
        return {"input_ids": self.input_ids, "labels": self.labels,
                "cu_seqlens": self.cu_seqlens}

    def to(self, device: torch.device | str) -> Batch:
        return replace(self, input_ids=self.input_ids.to(device),
                       labels=self.labels.to(device),
                       cu_seqlens=None if self.cu_seqlens is None else
                       self.cu_seqlens.to(device))


def _labels(tokens: np.ndarray, last: np.ndarray, pad: np.ndarray, mode: str) -> np.ndarray:
    """Targets of positions [0, n - 1) of a read of n positions (module docstring)."""
    labels = tokens[1:].copy()
    unscored = pad[1:] | pad[:-1]
    if mode == "packed":
        unscored |= last[:-1]
    labels[unscored] = IGNORE_INDEX
    return labels


def _cu_seqlens(first: np.ndarray, pad: np.ndarray, seq_len: int) -> np.ndarray:
    """int32 [S + 1]: segment starts at every row start, document start and start of a
    padding run, then the length."""
    start = first.copy()
    start[::seq_len] = True
    start[1:] |= pad[1:] & ~pad[:-1]
    return np.append(np.flatnonzero(start), len(first)).astype(np.int32)


def _make_batch(stream: _Stream, index: int, seq_len: int, batch_size: int, mode: str,
                rows: tuple[int, int]) -> Batch:
    """Rows `rows` of global batch `index` of `stream`."""
    n = batch_size * seq_len
    tokens, first, last, pad = stream.read(index * n, n + 1)
    vocab = stream.data.vocab_size
    if n and int(tokens.max()) >= vocab:  # a damaged or hand-edited folder
        raise DataError(f"{stream.data.path}: {stream.data.split}.bin holds token id "
                        f"{int(tokens.max())}, not below the vocab_size {vocab} of meta.json")
    labels = _labels(tokens, last, pad, mode)  # [n]
    a, b = rows[0] * seq_len, rows[1] * seq_len
    shape = (1, b - a) if mode == "packed" else (rows[1] - rows[0], seq_len)
    cu = torch.from_numpy(_cu_seqlens(first[a:b], pad[a:b], seq_len)) \
        if mode == "packed" else None
    return Batch(input_ids=torch.from_numpy(tokens[a:b].reshape(shape)),
                 labels=torch.from_numpy(labels[a:b].reshape(shape)), cu_seqlens=cu,
                 index=index, rows=rows, num_scored=int((labels[a:b] != IGNORE_INDEX).sum()),
                 global_num_scored=int((labels != IGNORE_INDEX).sum()))


def _check_int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise DataError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


def _open(data, split: str) -> TokenDataset:
    if isinstance(data, TokenDataset):
        return data
    if isinstance(data, (str, os.PathLike)):
        return TokenDataset(data, split)
    raise DataError(f"data must be a TokenDataset or a prepared folder, got "
                    f"{type(data).__name__}")


class _Loader:
    """Options shared by the training and evaluation loaders."""

    def __init__(self, data: TokenDataset, seq_len: int, batch_size: int, mode: str,
                 rank: int, world_size: int):
        self.data = data
        self.seq_len = _check_int("seq_len", seq_len, 1)
        self.batch_size = _check_int("batch_size", batch_size, 1)
        if mode not in MODES:
            raise DataError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.world_size = _check_int("world_size", world_size, 1)
        if self.world_size > self.batch_size:
            raise DataError(f"world_size={world_size} must be <= batch_size={batch_size} "
                            "(every rank gets at least one row)")
        if not 0 <= _check_int("rank", rank, 0) < world_size:
            raise DataError(f"rank must lie in [0, world_size={world_size}), got {rank!r}")
        self.rank = int(rank)
        self.rows = rank_rows(self.batch_size, self.rank, self.world_size)

    @property
    def tokens_per_batch(self) -> int:
        """Input positions of a global batch: batch_size * seq_len."""
        return self.batch_size * self.seq_len


class TokenLoader(_Loader):
    """Endless training batches of a prepared folder (module docstring).

    Args:
        data: a TokenDataset, or a prepared folder (its "train" split).
        seq_len: L, tokens per row (the training length).
        batch_size: B, rows per global batch (over all ranks).
        mode: "packed" (documents packed with cu_seqlens) or "windows".
        seed: seed of the per-epoch document order.
        shuffle: False keeps the stored document order every epoch.
        rank, world_size: this rank's share of every global batch.

    Iterating yields `Batch`es: global batches 0, 1, ... (`batch(k)` gives any one).
    """

    def __init__(self, data, seq_len: int, batch_size: int, *, mode: str = "packed",
                 seed: int = 0, shuffle: bool = True, rank: int = 0, world_size: int = 1):
        data = _open(data, "train")
        super().__init__(data, seq_len, batch_size, mode, rank, world_size)
        self.seed = _check_int("seed", seed, 0)
        if not isinstance(shuffle, bool):
            raise DataError(f"shuffle must be a bool, got {shuffle!r}")
        self.shuffle = shuffle
        if data.num_tokens == 0:
            raise DataError(f"{data.path}: the {data.split} split holds no token")
        self.stream = _Stream(data, self.seed, shuffle, endless=True)
        self.next_index = 0

    @property
    def epoch(self) -> float:
        """Epochs consumed before the next batch (tokens / split tokens)."""
        return self.next_index * self.tokens_per_batch / self.data.num_tokens

    def batch(self, index: int) -> Batch:
        """This rank's part of global batch `index` (does not move the iterator)."""
        index = _check_int("index", index, 0)
        return _make_batch(self.stream, index, self.seq_len, self.batch_size, self.mode,
                           self.rows)

    def __iter__(self) -> TokenLoader:
        return self

    def __next__(self) -> Batch:
        batch = self.batch(self.next_index)
        self.next_index += 1
        return batch

    def _identity(self) -> dict:
        return {"mode": self.mode, "seq_len": self.seq_len, "batch_size": self.batch_size,
                "seed": self.seed, "shuffle": self.shuffle, "split": self.data.split,
                "documents": self.data.num_documents, "tokens": self.data.num_tokens}

    def state_dict(self) -> dict:
        """{"next_index": the next global batch, and the options defining the stream}."""
        return {"next_index": self.next_index, **self._identity()}

    def load_state_dict(self, state: dict) -> None:
        """Continue at state["next_index"]; ValueError when the stream options differ."""
        diff = {k: (state.get(k), v) for k, v in self._identity().items() if state.get(k) != v}
        if diff:
            raise DataError(f"state: the loader's options differ from the saved ones "
                            f"(saved, current): {diff}")
        self.next_index = _check_int("state['next_index']", state.get("next_index"), 0)


class EvalLoader(_Loader):
    """The validation split once, in stored order (module docstring).

    Args: data (a TokenDataset, or a prepared folder: its `split`), seq_len, batch_size,
    mode, rank, world_size as `TokenLoader`. `len(loader)` batches, each of the training
    shape.
    """

    def __init__(self, data, seq_len: int, batch_size: int, *, mode: str = "packed",
                 rank: int = 0, world_size: int = 1, split: str = "val"):
        data = _open(data, split)
        super().__init__(data, seq_len, batch_size, mode, rank, world_size)
        if data.num_tokens == 0:
            raise DataError(f"{data.path}: the {data.split} split holds no document "
                            f"(prepared with val_fraction={data.meta.get('val_fraction')}); "
                            "evaluating needs one: prepare with a val_fraction > 0")
        self.stream = _Stream(data, 0, shuffle=False, endless=False)

    def __len__(self) -> int:
        # targets sit at positions [0, num_tokens - 1): the last token predicts nothing
        return math.ceil((self.data.num_tokens - 1) / self.tokens_per_batch)

    def __iter__(self):
        for index in range(len(self)):
            yield _make_batch(self.stream, index, self.seq_len, self.batch_size, self.mode,
                              self.rows)
