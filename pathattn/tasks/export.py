"""What the synthetic tasks share: the vocabulary (ids <-> strings), the ignore index of
unscored targets, per-stream seeding, and the JSONL record format written by
`pathattn data` (one sequence per line, `{"tokens": [...], "targets": [...]}`).

Conventions:
- `tokens` is a LongTensor [B, T] of vocabulary ids, `targets` a LongTensor [B, T] where
  `targets[b, t]` is the id the model must output *at* position t, or `IGNORE_INDEX` (-100,
  PyTorch's default `ignore_index`) where position t is not scored.
- In the JSONL export both become strings, and unscored targets become `null`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

from ..utils.io import atomic_open

IGNORE_INDEX = -100


class Vocab:
    """A fixed list of token strings; the id of a token is its index in the list."""

    def __init__(self, itos: Sequence[str]):
        self.itos = list(itos)
        self.stoi = {s: i for i, s in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise ValueError("vocabulary strings must be distinct")

    def __len__(self) -> int:
        return len(self.itos)

    def __repr__(self) -> str:
        return f"Vocab({self.itos if len(self) <= 8 else f'{len(self)} tokens'})"

    def encode(self, tokens: Sequence[str]) -> torch.Tensor:
        """Strings -> LongTensor [T] of ids."""
        return torch.tensor([self.stoi[s] for s in tokens], dtype=torch.long)

    def decode(self, ids: torch.Tensor | Sequence[int]) -> list[str | None]:
        """LongTensor [T] of ids -> strings; `IGNORE_INDEX` becomes None."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return [None if i == IGNORE_INDEX else self.itos[i] for i in ids]


def make_generator(seed: int, stream: int = 0) -> torch.Generator:
    """A CPU torch.Generator for (seed, stream); distinct pairs give independent streams
    (numpy's SeedSequence mixes both, so e.g. seed 1 / stream 0 != seed 0 / stream 1)."""
    state = np.random.SeedSequence([seed, stream]).generate_state(2, dtype=np.uint32)
    g = torch.Generator()
    g.manual_seed(int(state[0]) << 32 | int(state[1]))
    return g


def to_records(tokens: torch.Tensor, targets: torch.Tensor, vocab: Vocab) -> list[dict]:
    """tokens, targets: LongTensor [B, T] -> B dicts {"tokens": [str], "targets": [str|None]}."""
    return [{"tokens": vocab.decode(x), "targets": vocab.decode(y)}
            for x, y in zip(tokens, targets, strict=True)]


def write_jsonl(task: Iterable[tuple[torch.Tensor, torch.Tensor]], vocab: Vocab, n: int,
                path: str | Path) -> int:
    """Write the first `n` sequences of `task` (an iterable of (tokens, targets) batches,
    each LongTensor [B, T]) to `path`, one JSON object per line, atomically and durably
    (`pathattn.utils.io`). Returns the count written."""
    written = 0
    with atomic_open(path, "w", encoding="utf-8") as f:
        for tokens, targets in task:
            if written >= n:
                break
            for rec in to_records(tokens[: n - written], targets[: n - written], vocab):
                f.write(json.dumps(rec) + "\n")
                written += 1
    return written
