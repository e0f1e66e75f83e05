"""Workloads: what the one training loop (`Trainer`) trains, decided by the config's type.

A workload is a model, a stream of training steps and an evaluation. Each config class of a
training command registers a builder (`register_workload`); the Trainer asks the registry
and runs the same loop (optimizer, schedule, clipping, precision, logging, evaluation,
checkpoints, signals) for every one:

    SyntheticConfig     the synthetic tasks of `pathattn.tasks` (`task_workload`, below)
    PretrainConfig  language-model pretraining on prepared text (`pathattn.train.pretrain`)

A training step is a list of micro-batches, each a dict of `PaTHLM.forward` arguments
(input_ids [B, T], labels [B, T], optionally cu_seqlens [N + 1] with B == 1); the loop
accumulates their gradients, each weighted by its share of the step's scored tokens, so the
step's loss is the mean over all scored tokens of the step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from ..models import PaTHLM
from .synthetic import SyntheticConfig, TaskStream, build_model_config, model_vocab_size

__all__ = ["Workload", "register_workload", "build_workload", "TaskSteps"]

MicroBatch = dict[str, torch.Tensor]


@dataclass
class Workload:
    """model: the module trained; train_data: an iterator of steps (lists of micro-batches)
    with `state_dict()`, `load_state_dict()` and `batches` (steps drawn so far);
    evaluate(model, batches): {split: {metric: value}} on `batches` batches per split
    (None: the config's eval_batches); name: the progress bar's label."""

    model: nn.Module
    train_data: Any
    evaluate: Callable[[nn.Module, int | None], dict[str, dict[str, float]]]
    name: str


_BUILDERS: dict[type, Callable[[Any, torch.device, tuple[int, int]], Workload]] = {}


def register_workload(config_cls: type):
    """Decorator: `builder(cfg, device, replica) -> Workload` for configs of type
    config_cls; replica = (index, count) of this process's data-parallel replica under
    torchrun ((0, 1) otherwise), for data that each replica reads itself."""
    def wrap(builder):
        _BUILDERS[config_cls] = builder
        return builder
    return wrap


def build_workload(cfg, device: torch.device, replica: tuple[int, int] = (0, 1)) -> Workload:
    """The registered workload of cfg's type (ValueError for an unknown type)."""
    builder = _BUILDERS.get(type(cfg))
    if builder is None:
        raise ValueError(f"cfg: no workload is registered for {type(cfg).__name__} "
                         f"(registered: {sorted(c.__name__ for c in _BUILDERS)})")
    return builder(cfg, device, replica)


class TaskSteps:
    """A `TaskStream` as training steps: one micro-batch per step."""

    def __init__(self, stream: TaskStream):
        self.stream = stream

    @property
    def batches(self) -> int:
        return self.stream.batches

    def __iter__(self):
        return self

    def __next__(self) -> list[MicroBatch]:
        tokens, targets = next(self.stream)  # [B, T] each
        return [{"input_ids": tokens, "labels": targets}]

    def state_dict(self) -> dict[str, Any]:
        return self.stream.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state)


@register_workload(SyntheticConfig)
def task_workload(cfg: SyntheticConfig, device: torch.device,
                  replica: tuple[int, int] = (0, 1)) -> Workload:
    """A synthetic task: a `PaTHLM` of `build_model_config` on the task's training stream,
    evaluated on its validation splits (`pathattn.train.evaluate`). Every replica draws
    the global batch (the data-parallel wrapper keeps its rows), so `replica` is unused."""
    from .evaluate import evaluate

    stream = TaskStream.for_split(cfg, "train")
    tokens, _ = next(TaskStream(stream.task, stream.stream))  # the shape, nothing consumed
    model = PaTHLM(build_model_config(cfg, model_vocab_size(stream.task), tokens.shape[1]))
    return Workload(model=model.to(device), train_data=TaskSteps(stream),
                    evaluate=lambda m, batches: evaluate(m, cfg, device, batches),
                    name=f"{cfg.task}/{cfg.attn}")
