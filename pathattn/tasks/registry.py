"""The task registry: one `TaskSpec` per synthetic task declares what the rest of pathattn
needs to know about it, and the command line (`pathattn data`, `train`, `compare`,
`layers`), `SyntheticConfig`, its data streams and the evaluation ask the registry:

    options     the task's options (name, type, default, choices, help): the command-line
                flags and the config validation are made from them
    config      builds the task's own config dataclass for a split from the options,
                seed and batch size; `task` builds the task object from it
    splits      the training split "train" and the evaluation splits, each with the seed
                stream of its generator
    bos         whether training streams prepend a BOS token (`TaskSpec.sample`)
    metrics     what the evaluation reports per split, which error `pathattn compare`
                shows and which score `pathattn layers` reads (`TaskMetrics`)

A new task is one module with its spec, registered with `register_task`; nothing else
changes. A task object (what `spec.task(config)` returns) has

    name                the registry name of its task
    cfg                 its config, with the `seed` and `batch_size` it was built with
    vocab               a `Vocab`
    batch(generator)    one batch (tokens, targets), LongTensor [B, T] each, drawn from the
                        torch.Generator (targets IGNORE_INDEX where not scored)
    iter(task)          endless batches, restarting from the seed every time (what
                        `pathattn data` writes)
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .export import IGNORE_INDEX
from .metrics import TaskMetrics

__all__ = ["TaskOption", "TaskSpec", "register_task", "unregister_task", "registered_task",
           "get_task", "task_names", "options_by_name"]

OPTION_TYPES = (int, str)
# keywords of a spec's config function that options cannot take
RESERVED = ("split", "seed", "batch_size")


@dataclass(frozen=True)
class TaskOption:
    """One option of a task.

    name: the keyword of the task's config function, the `SyntheticConfig` option and the
        command-line flag (`--n-back` for "n_back").
    type: int (a positive int) or str.
    default: the value when the option is not given (None).
    help: what the option is, for the command line's help.
    choices: the allowed values, or None for any value of `type`.
    """

    name: str
    type: type
    default: Any
    help: str
    choices: tuple | None = None

    def __post_init__(self):
        if not self.name.isidentifier():
            raise ValueError(f"option name must be an identifier, got {self.name!r}")
        if self.type not in OPTION_TYPES:
            raise ValueError(f"option {self.name}: type must be int or str, got {self.type!r}")
        self.check(self.default)

    def check(self, value) -> None:
        """Raise ValueError naming the option unless `value` is valid (None: not given)."""
        if value is None:
            return
        if self.choices is not None:
            if value not in self.choices:
                raise ValueError(f"{self.name} must be one of {self.choices}, got {value!r}")
        elif self.type is int:
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{self.name} must be None or a positive int, got {value!r}")
        elif not isinstance(value, self.type):
            raise ValueError(f"{self.name} must be None or a {self.type.__name__}, got "
                             f"{value!r}")


@dataclass(frozen=True)
class TaskSpec:
    """Everything pathattn knows about one task (module docstring).

    name: the task's name on the command line and in `SyntheticConfig.task`.
    config: config(split=..., seed=..., [batch_size=...], **options) -> the task's config
        dataclass, with every option of `options` given; batch_size left out means the
        config's own default (what `pathattn data` draws with).
    task: config -> the task object.
    options: the task's `TaskOption`s.
    splits: split name -> seed stream of its generator; "train" first, the others are the
        evaluation splits in this order (default: "train" on stream 0, "val" on stream 1,
        the training task on an independent stream).
    data_splits: whether the task object itself draws each split (`pathattn data --split`);
        otherwise it draws the training stream only.
    bos: whether training and evaluation streams prepend a BOS token (id len(vocab), target
        not scored), which the model's vocabulary counts (`vocab_size`).
    metrics: the evaluation's metrics (`TaskMetrics`; default: token and sequence
        accuracy, sequence accuracy as headline and solve score).
    """

    name: str
    config: Callable[..., Any]
    task: Callable[[Any], Any]
    options: tuple[TaskOption, ...] = ()
    splits: Mapping[str, int] = field(default_factory=lambda: {"train": 0, "val": 1})
    data_splits: bool = False
    bos: bool = False
    metrics: TaskMetrics = field(default_factory=TaskMetrics)

    def __post_init__(self):
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"task name must be a non-empty str, got {self.name!r}")
        names = [o.name for o in self.options]
        if len(set(names)) != len(names) or set(names) & set(RESERVED):
            raise ValueError(f"task {self.name}: option names must be distinct and none of "
                             f"{RESERVED}, got {names}")
        splits = list(self.splits)
        if splits[:1] != ["train"] or len(splits) < 2:
            raise ValueError(f"task {self.name}: splits must be 'train' then at least one "
                             f"evaluation split, got {splits}")
        if len(set(self.splits.values())) != len(splits):
            raise ValueError(f"task {self.name}: every split needs its own seed stream, got "
                             f"{dict(self.splits)}")

    # ------------------------------------------------------------------- options

    def option(self, name: str) -> TaskOption:
        for option in self.options:
            if option.name == name:
                return option
        raise ValueError(f"{name} is not an option of task {self.name} (options: "
                         f"{[o.name for o in self.options]})")

    def resolve(self, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Every option of the task, name -> value: the given ones (validated), the
        defaults for those not given or None."""
        options = dict(options or {})
        for name in options:
            self.option(name)
        out = {}
        for option in self.options:
            value = options.get(option.name)
            option.check(value)
            out[option.name] = option.default if value is None else value
        return out

    # ------------------------------------------------------------------ builders

    def make_config(self, split: str = "train", options: Mapping[str, Any] | None = None,
                    **common):
        """The task's config for `split`; options as `resolve` takes them, common: seed
        and optionally batch_size."""
        self.stream(split)
        return self.config(split=split, **common, **self.resolve(options))

    def build(self, split: str = "train", options: Mapping[str, Any] | None = None,
              **common):
        """The task object of `make_config(split, options, **common)`."""
        return self.task(self.make_config(split, options, **common))

    # -------------------------------------------------------------- splits, batches

    @property
    def eval_splits(self) -> tuple[str, ...]:
        """The evaluation splits, in order."""
        return tuple(s for s in self.splits if s != "train")

    def stream(self, split: str) -> int:
        """The seed stream of `split`'s generator."""
        if split not in self.splits:
            raise ValueError(f"split of task {self.name} must be one of {list(self.splits)}, "
                             f"got {split!r}")
        return self.splits[split]

    def sample(self, task, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch (tokens, targets) of a training or evaluation stream, LongTensor
        [B, T] each: `task.batch(generator)`, with a BOS column first when `bos`
        (T = the task's length + 1)."""
        tokens, targets = task.batch(generator)  # [B, T] each
        if not self.bos:
            return tokens, targets
        bos = tokens.new_full((tokens.shape[0], 1), len(task.vocab))  # [B, 1]
        return (torch.cat([bos, tokens], dim=1),  # [B, T + 1]
                torch.cat([torch.full_like(bos, IGNORE_INDEX), targets], dim=1))

    def vocab_size(self, task) -> int:
        """The model's vocabulary for `task`: the task's, plus the BOS token when `bos`."""
        return len(task.vocab) + self.bos

    # ------------------------------------------------------------------- results

    def errors(self, flat: dict) -> dict[str, float]:
        """The headline error of every evaluation split in a flat metrics record, name ->
        fraction (`TaskMetrics.error`); splits the record lacks are left out."""
        found = (self.metrics.error(flat, split) for split in self.eval_splits)
        return dict(e for e in found if e is not None)

    def solve_score(self, flat: dict) -> float:
        """The score that decides "solved" (`TaskMetrics.solve`) in a flat metrics record."""
        return self.metrics.score(flat, self.eval_splits[0])


_TASKS: dict[str, TaskSpec] = {}


def register_task(spec: TaskSpec) -> TaskSpec:
    """Add `spec` to the registry; ValueError when its name is taken or one of its options
    shares a name with another task's option of a different type or choices (both are
    one command-line flag)."""
    if spec.name in _TASKS:
        raise ValueError(f"task {spec.name!r} is already registered")
    for option in spec.options:
        for other, theirs in options_by_name().get(option.name, []):
            if (theirs.type, theirs.choices) != (option.type, option.choices):
                raise ValueError(f"task {spec.name}: option {option.name} differs in type "
                                 f"or choices from task {other.name}'s")
    _TASKS[spec.name] = spec
    return spec


def unregister_task(name: str) -> TaskSpec:
    """Remove task `name` from the registry; returns its spec."""
    get_task(name)
    return _TASKS.pop(name)


@contextlib.contextmanager
def registered_task(spec: TaskSpec) -> Iterator[TaskSpec]:
    """`with registered_task(spec):` the task is registered inside the block only."""
    register_task(spec)
    try:
        yield spec
    finally:
        unregister_task(spec.name)


def get_task(name: str) -> TaskSpec:
    """The spec of task `name`; ValueError naming the registered tasks otherwise."""
    spec = _TASKS.get(name)
    if spec is None:
        raise ValueError(f"task must be one of {task_names()}, got {name!r}")
    return spec


def task_names() -> tuple[str, ...]:
    """The registered tasks' names, in registration order."""
    return tuple(_TASKS)


def options_by_name() -> dict[str, list[tuple[TaskSpec, TaskOption]]]:
    """Every option name of the registered tasks -> the (spec, option) of each task that
    takes it, in registration order."""
    out: dict[str, list[tuple[TaskSpec, TaskOption]]] = {}
    for spec in _TASKS.values():
        for option in spec.options:
            out.setdefault(option.name, []).append((spec, option))
    return out
