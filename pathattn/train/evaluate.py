"""Evaluation on the synthetic tasks' validation streams: the metrics each task declares
(`pathattn.tasks.TaskSpec.metrics`, defined in `pathattn.tasks.metrics`).

Flip-flop (per split `val`, `val_sparse`, `val_dense`):
    error_rate      fraction of `r` positions whose argmax next-token prediction is not the
                    stored bit (the token after the `r`), pooled over all batches
    seq_error_rate  fraction of sequences with at least one such error
Word problems and MQRAR (split `val`):
    token_acc       fraction of scored positions (target != -100) predicted right (argmax)
    seq_acc         fraction of sequences with every scored position right

Every split also reports `scored` (number of scored positions) and `sequences`, so a reader
can tell how well a rate is resolved.

Every evaluation draws the same batches (fresh streams with fixed seeds): the first
`cfg.eval_batches` of each split, or the first `batches` when given (the final evaluation
uses `cfg.final_eval_batches`, a superset).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..models import PaTHLM
from ..tasks import get_task
from ..utils import autocast_context
from .synthetic import SyntheticConfig, TaskStream

__all__ = ["evaluate"]


def _batch_counts(pred: torch.Tensor, tokens: torch.Tensor, targets: torch.Tensor,
                  scored_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                  ) -> tuple[int, int, int, int]:
    """(wrong, scored, sequences with an error, sequences) of one batch; pred, tokens,
    targets LongTensor [B, T]; scored_fn(tokens, targets): the task's scored positions."""
    scored = scored_fn(tokens, targets)  # [B, T]
    wrong = (pred != targets) & scored  # [B, T]
    return (int(wrong.sum()), int(scored.sum()), int(wrong.any(dim=1).sum()),
            tokens.shape[0])


@torch.no_grad()
def evaluate(model: PaTHLM, cfg: SyntheticConfig, device: torch.device | str = "cpu",
             batches: int | None = None) -> dict[str, dict[str, float]]:
    """Metrics of `model` on every evaluation split of the task (module docstring), e.g.
    {"val": {"error_rate": ..., "seq_error_rate": ...}, "val_sparse": ..., "val_dense": ...}
    for flip-flop, {"val": {"token_acc": ..., "seq_acc": ...}} otherwise. Leaves the model
    in the train / eval mode it was in. `batches`: batches per split (default
    cfg.eval_batches)."""
    batches = cfg.eval_batches if batches is None else int(batches)
    if batches < 1:
        raise ValueError(f"batches must be a positive int, got {batches!r}")
    device = torch.device(device)
    spec = get_task(cfg.task)
    was_training = model.training
    model.eval()
    out: dict[str, dict[str, float]] = {}
    try:
        for split in spec.eval_splits:
            stream = TaskStream.for_split(cfg, split)
            wrong = scored = seq_wrong = seqs = 0
            for _ in range(batches):
                tokens, targets = next(stream)  # [B, T] each
                tokens, targets = tokens.to(device), targets.to(device)
                with autocast_context(cfg.dtype, device):
                    logits, _ = model(tokens)  # [B, T, V]
                counts = _batch_counts(logits.argmax(-1), tokens, targets,
                                       spec.metrics.scored)
                wrong, scored = wrong + counts[0], scored + counts[1]
                seq_wrong, seqs = seq_wrong + counts[2], seqs + counts[3]
            out[split] = spec.metrics.split_metrics(wrong, scored, seq_wrong, seqs)
    finally:
        model.train(was_training)
    return out
