"""Multi-query repeated associative recall with N-back (MQRAR-N), the paper's section
"Synthetic Tasks"; where the paper leaves a detail open, the choice is ours and stated here.

A sequence of length L is L/2 (key, value) pairs. Keys are uniform over `num_keys`
variables, values uniform over a separate vocabulary of `num_values` values (default 64,
our choice). Each key occurrence assigns a new value to that variable and is also a query:
the target at a key token is the N-th last value previously assigned to that key, if it has
at least N earlier assignments; otherwise, and at every value token, it is not scored.

Vocabulary (our choice): keys "k0" .. "k{num_keys-1}" (ids 0..K-1), then values
"v0" .. "v{num_values-1}" (ids K..K+V-1).

Registered as task "mqrar" (`SPEC`): options length, n_back, keys (num_keys) and values
(num_values); one evaluation split `val`, the training task on seed stream 1 instead of 0;
per split token and sequence accuracy, and a depth counts as solving by its token accuracy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .export import IGNORE_INDEX, Vocab, make_generator
from .metrics import TaskMetrics
from .registry import TaskOption, TaskSpec


@dataclass
class MQRARConfig:
    n_back: int = 2
    num_keys: int = 32
    num_values: int = 64
    length: int = 768  # L tokens = L/2 (key, value) pairs
    batch_size: int = 64
    seed: int = 0

    def __post_init__(self):
        if self.n_back < 1:
            raise ValueError("n_back must be >= 1")
        if self.num_keys < 1 or self.num_values < 1:
            raise ValueError("num_keys and num_values must be >= 1")
        if self.length < 2 or self.length % 2:
            raise ValueError(f"length must be even and >= 2, got {self.length}")


def nback_targets(keys: torch.Tensor, values: torch.Tensor, n_back: int) -> torch.Tensor:
    """keys, values: LongTensor [B, P] (pair p assigns values[:, p] to keys[:, p]).
    Returns LongTensor [B, P]: at pair p the value of the n_back-th last earlier pair with
    the same key, or IGNORE_INDEX if that key has fewer than n_back earlier assignments."""
    B, P = keys.shape
    pos = torch.arange(P).expand(B, P)
    # order pairs by (key, position): occurrences of one key become contiguous, in order
    order = torch.argsort(keys * P + pos, dim=1)  # [B, P]
    k_sorted, v_sorted = keys.gather(1, order), values.gather(1, order)  # [B, P]
    prev_k = torch.full_like(k_sorted, -1)
    prev_k[:, n_back:] = k_sorted[:, :-n_back]  # empty slices if n_back >= P
    prev_v = torch.full_like(v_sorted, IGNORE_INDEX)
    prev_v[:, n_back:] = v_sorted[:, :-n_back]
    # n_back places earlier in sorted order is the same key iff it has >= n_back earlier
    t_sorted = torch.where(prev_k == k_sorted, prev_v, IGNORE_INDEX)  # [B, P]
    return torch.empty_like(t_sorted).scatter_(1, order, t_sorted)


class MQRAR:
    """Endless, seeded stream of (tokens, targets) batches, each LongTensor [B, L];
    tokens interleave key and value ids, targets are scored only at key positions.
    Every `iter()` restarts the stream from the seed."""

    name = "mqrar"

    def __init__(self, cfg: MQRARConfig | None = None, **kwargs):
        self.cfg = cfg if cfg is not None else MQRARConfig(**kwargs)
        K, V = self.cfg.num_keys, self.cfg.num_values
        self.vocab = Vocab([f"k{i}" for i in range(K)] + [f"v{j}" for j in range(V)])

    def sample(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch: keys [B, P] in 0..K-1 and values [B, P] in 0..V-1, P = L/2."""
        B, P = self.cfg.batch_size, self.cfg.length // 2
        keys = torch.randint(self.cfg.num_keys, (B, P), generator=generator)
        values = torch.randint(self.cfg.num_values, (B, P), generator=generator)
        return keys, values

    def encode(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor,
                                                                         torch.Tensor]:
        """keys, values [B, P] -> (tokens, targets), each LongTensor [B, 2P] of vocab ids."""
        B, P = keys.shape
        K = self.cfg.num_keys
        tokens = torch.stack([keys, values + K], dim=2).reshape(B, 2 * P)  # [B, L]
        back = nback_targets(keys, values, self.cfg.n_back)  # [B, P]
        back = torch.where(back == IGNORE_INDEX, IGNORE_INDEX, back + K)
        unscored = torch.full_like(back, IGNORE_INDEX)
        targets = torch.stack([back, unscored], dim=2).reshape(B, 2 * P)  # [B, L]
        return tokens, targets

    def batch(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch (tokens, targets) drawn from `generator`, LongTensor [B, L] each."""
        return self.encode(*self.sample(generator))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        g = make_generator(self.cfg.seed)
        while True:
            yield self.batch(g)


def _config(split: str, keys: int, values: int, **kwargs) -> MQRARConfig:
    """The spec's config function: options keys / values are num_keys / num_values."""
    return MQRARConfig(num_keys=keys, num_values=values, **kwargs)


SPEC = TaskSpec(
    name="mqrar",
    config=_config,
    task=MQRAR,
    options=(
        TaskOption("length", int, MQRARConfig.length, "tokens per sequence"),
        TaskOption("n_back", int, MQRARConfig.n_back, "N of the N-back recall"),
        TaskOption("keys", int, MQRARConfig.num_keys, "number of keys"),
        TaskOption("values", int, MQRARConfig.num_values, "value vocabulary size"),
    ),
    metrics=TaskMetrics(solve="token_acc"),
)
