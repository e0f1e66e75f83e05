"""Flip-flop language modelling (FFLM, Liu et al. 2023), the paper's section "Synthetic
Tasks"; where the paper leaves a detail open, the choice is ours and stated here.

A sequence is 256 (instruction, bit) pairs = 512 tokens over the vocabulary `w r i 0 1`.
The first instruction is `w`, the last `r`, the others i.i.d. with p(w) = p(r) = (1-p_i)/2,
p(i) = p_i. The bit after `w` / `i` is uniform; the bit after `r` is the bit of the most
recent `w`. Training is next-token prediction on every token, so `targets[t] = tokens[t+1]`
(unscored at the last position). The metric scores only the prediction *at* each `r`
position (whose next token is the stored bit): see `read_mask` and `read_errors`.

Registered as task "flipflop" (`SPEC`): option num_pairs; evaluation splits `val`,
`val_sparse`, `val_dense` (`SPLITS`, each its own seeded stream, exported by
`pathattn data --split`); per split the error rate at the reads and the fraction of
sequences with an error.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .export import IGNORE_INDEX, Vocab, make_generator
from .metrics import TaskMetrics
from .registry import TaskOption, TaskSpec

VOCAB = Vocab(["w", "r", "i", "0", "1"])
W, R, I, BIT0 = 0, 1, 2, 3

# split name -> (p_i, seed stream). The stream keeps splits distinct for any user seed.
SPLITS: dict[str, tuple[float, int]] = {
    "train": (0.8, 0),
    "val": (0.8, 1),
    "val_sparse": (0.98, 2),
    "val_dense": (0.1, 3),
}


@dataclass
class FlipFlopConfig:
    split: str = "train"
    num_pairs: int = 256  # sequence length T = 2 * num_pairs
    batch_size: int = 64
    seed: int = 0

    def __post_init__(self):
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {sorted(SPLITS)}, got {self.split!r}")
        if self.num_pairs < 2:
            raise ValueError("num_pairs must be >= 2 (first w, last r)")

    @property
    def p_ignore(self) -> float:
        return SPLITS[self.split][0]


def sample_flipflop(cfg: FlipFlopConfig, generator: torch.Generator) -> torch.Tensor:
    """One batch of flip-flop sequences: LongTensor [B, T] of ids, T = 2 * num_pairs."""
    B, P = cfg.batch_size, cfg.num_pairs
    p_i = cfg.p_ignore
    u = torch.rand(B, P, generator=generator)  # [B, P]
    instr = torch.where(u < p_i, I, torch.where(u < p_i + (1 - p_i) / 2, W, R))
    instr[:, 0], instr[:, -1] = W, R
    bits = torch.randint(0, 2, (B, P), generator=generator)  # [B, P]
    # index of the most recent w at or before each pair (pair 0 is always w)
    pos = torch.arange(P).expand(B, P)
    last_w = torch.where(instr == W, pos, -1).cummax(dim=1).values  # [B, P]
    bits = torch.where(instr == R, bits.gather(1, last_w), bits)
    return torch.stack([instr, bits + BIT0], dim=2).reshape(B, 2 * P)  # [B, T]


def next_token_targets(tokens: torch.Tensor) -> torch.Tensor:
    """tokens [B, T] -> targets [B, T] with targets[:, t] = tokens[:, t+1], last unscored."""
    targets = torch.full_like(tokens, IGNORE_INDEX)
    targets[:, :-1] = tokens[:, 1:]
    return targets


def read_mask(tokens: torch.Tensor) -> torch.Tensor:
    """BoolTensor [B, T]: True at each `r` position, the predictions the error rate scores
    (the model's output at an `r` must be the next token, the stored bit)."""
    return tokens == R


def scored_reads(tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The predictions the evaluation scores: `read_mask(tokens)`, BoolTensor [B, T]."""
    return read_mask(tokens)


def read_indices(tokens: torch.Tensor) -> torch.Tensor:
    """LongTensor [K, 2] of (batch, position) of every scored read prediction."""
    return read_mask(tokens).nonzero()


def read_errors(pred: torch.Tensor, tokens: torch.Tensor) -> tuple[float, float]:
    """pred: LongTensor [B, T], the argmax next-token prediction at every position.
    Returns (error rate over `r` positions, fraction of sequences with >= 1 error)."""
    mask = read_mask(tokens)
    wrong = (pred != next_token_targets(tokens)) & mask  # [B, T]
    return (wrong.sum() / mask.sum()).item(), wrong.any(dim=1).float().mean().item()


class FlipFlop:
    """Endless, seeded stream of flip-flop batches (tokens, targets), each LongTensor
    [B, T]. Every `iter()` restarts the stream from (seed, split)."""

    name = "flipflop"
    vocab = VOCAB

    def __init__(self, cfg: FlipFlopConfig | None = None, **kwargs):
        self.cfg = cfg if cfg is not None else FlipFlopConfig(**kwargs)

    def batch(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch (tokens, targets) drawn from `generator`, LongTensor [B, T] each."""
        tokens = sample_flipflop(self.cfg, generator)
        return tokens, next_token_targets(tokens)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        g = make_generator(self.cfg.seed, SPLITS[self.cfg.split][1])
        while True:
            yield self.batch(g)


SPEC = TaskSpec(
    name="flipflop",
    config=FlipFlopConfig,
    task=FlipFlop,
    options=(TaskOption("num_pairs", int, FlipFlopConfig.num_pairs,
                        "(instruction, bit) pairs per sequence (T = 2 * num_pairs)"),),
    splits={split: stream for split, (_, stream) in SPLITS.items()},
    data_splits=True,
    metrics=TaskMetrics(reported=("error_rate", "seq_error_rate"), headline="error_rate",
                        solve="error_rate", scored=scored_reads),
)
