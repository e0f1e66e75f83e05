"""What the evaluation of a synthetic task measures, and how its results are named.

Per evaluation split the model's argmax prediction is compared with the target at the
split's scored positions (by default every target that is not `IGNORE_INDEX`; flip-flop
scores only the predictions at its `r` positions). From the counts come two fractions, the
token error (wrong / scored positions, pooled over all batches) and the sequence error
(sequences with at least one wrong position / sequences), and from those the metrics a task
may report (`METRICS`):

    error_rate      token error
    seq_error_rate  sequence error
    token_acc       1 - token error
    seq_acc         1 - sequence error

Every split also reports `scored` (scored positions) and `sequences`, so a reader can tell
how well a rate is resolved.

Flat records (metrics.json, eval.jsonl): `flat_key` names a split's metric, "<split>_<metric>",
except a split's "error_rate", stored under the split's own name (flip-flop's "val" is its
error rate at the reads).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .export import IGNORE_INDEX

__all__ = ["Metric", "METRICS", "TaskMetrics", "flat_key", "flatten_metrics",
           "scored_targets"]


class Metric(NamedTuple):
    """label: its name in tables ("seq acc"); error: lower is better (an error rate) rather
    than higher (an accuracy); value(token_error, seq_error) -> the metric."""

    label: str
    error: bool
    value: Callable[[float, float], float]


METRICS: dict[str, Metric] = {
    "error_rate": Metric("error", True, lambda token_err, seq_err: token_err),
    "seq_error_rate": Metric("seq error", True, lambda token_err, seq_err: seq_err),
    "token_acc": Metric("token acc", False, lambda token_err, seq_err: 1.0 - token_err),
    "seq_acc": Metric("seq acc", False, lambda token_err, seq_err: 1.0 - seq_err),
}


def flat_key(split: str, metric: str) -> str:
    """The key of `metric` of `split` in a flat record (module docstring)."""
    return split if metric == "error_rate" else f"{split}_{metric}"


def flatten_metrics(nested: dict[str, dict[str, float]]) -> dict[str, float]:
    """{split: {metric: value}} -> {flat_key(split, metric): value}."""
    return {flat_key(split, metric): value
            for split, values in nested.items() for metric, value in values.items()}


def scored_targets(tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """BoolTensor [B, T]: every position with a target (targets != IGNORE_INDEX); tokens and
    targets LongTensor [B, T]."""
    return targets != IGNORE_INDEX


def _number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class TaskMetrics:
    """What a task's evaluation reports and which of it the summaries read.

    reported: the metrics of `METRICS` each evaluation split reports, in this order (then
        "scored" and "sequences").
    headline: the reported metric that `pathattn compare` tables and plots, as an error,
        for every evaluation split.
    solve: the reported metric whose score (the accuracy, or 1 - the error) on the first
        evaluation split decides whether `pathattn layers` counts a depth as solving.
    scored: (tokens, targets) -> BoolTensor [B, T], the predictions that count.
    """

    reported: tuple[str, ...] = ("token_acc", "seq_acc")
    headline: str = "seq_acc"
    solve: str = "seq_acc"
    scored: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = scored_targets

    def __post_init__(self):
        unknown = [m for m in self.reported if m not in METRICS]
        if unknown or not self.reported:
            raise ValueError(f"reported must name metrics of {list(METRICS)}, got "
                             f"{self.reported!r}")
        for name in ("headline", "solve"):
            if getattr(self, name) not in self.reported:
                raise ValueError(f"{name} must be one of the reported metrics "
                                 f"{self.reported}, got {getattr(self, name)!r}")

    def split_metrics(self, wrong: int, scored: int, seq_wrong: int,
                      sequences: int) -> dict[str, float]:
        """One split's reported metrics from its counts: wrong of scored positions,
        seq_wrong of sequences with at least one wrong position."""
        token_err = wrong / scored if scored else float("nan")
        seq_err = seq_wrong / sequences
        out = {m: METRICS[m].value(token_err, seq_err) for m in self.reported}
        out.update(scored=scored, sequences=sequences)
        return out

    def error(self, flat: dict, split: str) -> tuple[str, float] | None:
        """(name, error) of the headline metric of `split` in a flat record, None when the
        record lacks it. The name is the split itself for "error_rate", otherwise e.g.
        "val (1 - seq acc)"."""
        value = flat.get(flat_key(split, self.headline))
        if not _number(value):
            return None
        metric = METRICS[self.headline]
        if self.headline == "error_rate":
            return split, value
        if metric.error:
            return f"{split} ({metric.label})", value
        return f"{split} (1 - {metric.label})", 1.0 - value

    def score(self, flat: dict, split: str) -> float:
        """The solve score of `split` in a flat record (higher is better)."""
        value = float(flat[flat_key(split, self.solve)])
        return 1.0 - value if METRICS[self.solve].error else value

    @property
    def solve_label(self) -> str:
        """What the solve score is, e.g. "seq acc" or "1 - error"."""
        metric = METRICS[self.solve]
        return f"1 - {metric.label}" if metric.error else metric.label
