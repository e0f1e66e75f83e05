"""`SyntheticConfig`: the one dataclass that describes a training run on a synthetic task of
`pathattn.tasks`, with named presets, and the task / model / data stream it
builds.

Everything task-specific comes from the task's registered `TaskSpec`
(`pathattn.tasks.get_task`): which options apply and their defaults, the task's own config,
the evaluation splits and the seed stream of each, the model's vocabulary, and how a batch
is drawn (word problems prepend a BOS token, `pathattn.tasks.word_problems`).

Data streams (`TaskStream`) draw the same batches as iterating the task object itself
(`iter(FlipFlop(cfg))` etc.; for word problems after the BOS column), but keep their
`torch.Generator` in reach so that a checkpoint can store its state and the number of
batches drawn (exact resume).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from ..models import ATTN_TYPES, ModelConfig
from ..tasks import get_task, make_generator, options_by_name
from .loop_config import DTYPES, LoopConfig

__all__ = ["SyntheticConfig", "SYNTHETIC_PRESETS", "DTYPES", "TaskStream", "build_task",
           "task_config", "task_option_values", "option_fields", "OPTION_FIELDS",
           "build_model_config", "eval_splits", "model_vocab_size", "NOT_IDENTITY"]

# SyntheticConfig fields that do not change a run's results (`SyntheticConfig.run_identity`)
NOT_IDENTITY = LoopConfig.NOT_IDENTITY
# task options with a SyntheticConfig field of their own; the options of other tasks are kept
# in `SyntheticConfig.task_options`
OPTION_FIELDS = ("num_pairs", "length", "alphabet", "n_back", "keys", "values")

# name -> field values that differ from the defaults; `SyntheticConfig.preset(name, **over)`.
# sized to finish in minutes on a CPU; "fflm-cpu" (the defaults) reaches 0 errors for PaTH.
SYNTHETIC_PRESETS: dict[str, dict[str, Any]] = {
    # flip-flop, the paper's 1-layer / 2-head / 64-wide model (the defaults)
    "fflm-cpu": dict(task="flipflop"),
    # A5 word problems, length 32 (our default length)
    "a5-cpu": dict(task="a5", layers=2, dim=128, heads=4, length=32),
    # MQRAR 2-back, the paper's width and heads but a short sequence
    "mqrar-cpu": dict(task="mqrar", layers=2, dim=256, heads=2, length=128, n_back=2),
}


@dataclass
class SyntheticConfig(LoopConfig):
    """Hyper-parameters of one training run on a synthetic task: the loop's fields
    (`LoopConfig`) and the task's and model's. Validated on construction and by
    `validate()`; invalid values raise a ValueError that names the field.

    Model: a `PaTHLM` from the "fflm-1l" `ModelConfig` preset with the task's vocabulary,
    hidden_size = dim, intermediate_size = 4 * dim, num_hidden_layers = layers,
    num_attention_heads = heads, attn_type = attn; `model` holds any further ModelConfig
    field (`pathattn train --model-arg beta_max=1.99`).

    Task options: those the task declares (`pathattn.tasks.TaskSpec.options`). num_pairs,
    length, alphabet, n_back, keys and values have fields of their own, other tasks'
    options go in `task_options` {name: value}; None = the task's default. An option of
    another task than `task` is an error.

    Defaults, checkpoints and evaluation sizes, and why: docs/synthetic.md, "Training runs".
    """

    POSITIVE_INTS = LoopConfig.POSITIVE_INTS + ("layers", "heads", "dim", "batch_size")

    task: str = "flipflop"
    attn: str = "path"
    layers: int = 1
    heads: int = 2
    dim: int = 64
    batch_size: int = 16
    # task options
    num_pairs: int | None = None
    length: int | None = None
    alphabet: str | None = None
    n_back: int | None = None
    keys: int | None = None
    values: int | None = None
    # options of tasks registered beyond these, e.g. {"symbols": 8}
    task_options: dict[str, Any] = field(default_factory=dict)
    # any other ModelConfig field, e.g. {"beta_max": 1.99, "w_rank": 16, "qk_norm": True}
    model: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> SyntheticConfig:
        """Raise ValueError naming the first invalid field; return self when valid."""
        get_task(self.task)  # ValueError naming the registered tasks
        if self.attn not in ATTN_TYPES:
            raise ValueError(f"attn must be one of {ATTN_TYPES}, got {self.attn!r}")
        super().validate()
        if self.dim % self.heads:
            raise ValueError(f"dim={self.dim} must be divisible by heads={self.heads}")
        if self.attn == "rope" and (self.dim // self.heads) % 2:
            raise ValueError(f"dim: head size dim // heads = {self.dim // self.heads} must be "
                             "even for attn='rope'")
        self._validate_task_options()
        self._validate_model_overrides()
        return self

    def _validate_model_overrides(self) -> None:
        if not isinstance(self.model, dict):
            raise ValueError(f"model must be a dict of ModelConfig fields, got {self.model!r}")
        known = {f.name for f in dataclasses.fields(ModelConfig)}
        unknown = sorted(set(self.model) - known)
        if unknown:
            raise ValueError(f"model: unknown ModelConfig field(s) {unknown}")
        taken = sorted(set(self.model) & set(TASK_DECIDES))
        if taken:
            raise ValueError(f"model: {taken} are set by the task and layers / heads / dim / "
                             "attn, not by model overrides")
        try:
            build_model_config(self, 8, 2048)
        except ValueError as e:
            raise ValueError(f"model: {e}") from None

    def _validate_task_options(self) -> None:
        if not isinstance(self.task_options, dict):
            raise ValueError(f"task_options must be a dict of task options, got "
                             f"{self.task_options!r}")
        declared = options_by_name()  # option name -> the tasks that take it
        misplaced = sorted(n for n in self.task_options if n in OPTION_FIELDS or n not in declared)
        if misplaced:
            raise ValueError(f"task_options: {misplaced} are not options of a registered "
                             "task or have fields of their own")
        values = task_option_values(self)
        for name in dict.fromkeys([*OPTION_FIELDS, *declared]):
            value = values.get(name)
            if value is None:
                continue
            tasks = [spec.name for spec, _ in declared.get(name, [])]
            if self.task not in tasks:
                raise ValueError(f"{name} applies to task {', '.join(tasks) or '(none)'} "
                                 f"only, got {name}={value!r} with task={self.task!r}")
            get_task(self.task).option(name).check(value)
        try:
            task_config(self)
        except ValueError as e:
            raise ValueError(f"task options: {e}") from None

    # ------------------------------------------------------------- dicts and presets

    @classmethod
    def preset(cls, name: str, **overrides) -> SyntheticConfig:
        """The preset `name` of `SYNTHETIC_PRESETS`, with field overrides."""
        if name not in SYNTHETIC_PRESETS:
            raise ValueError(f"unknown preset {name!r}; presets: {sorted(SYNTHETIC_PRESETS)}")
        return cls.from_dict({**SYNTHETIC_PRESETS[name], **overrides})


# ---------------------------------------------------------------------------- builders

def task_option_values(cfg: SyntheticConfig) -> dict[str, Any]:
    """Every task option set in cfg, name -> value (its field, or `task_options`); None
    for the fields left unset."""
    return {**{name: getattr(cfg, name) for name in OPTION_FIELDS}, **cfg.task_options}


def option_fields(options: dict[str, Any]) -> dict[str, Any]:
    """Task option values, name -> value, as `SyntheticConfig` keyword arguments: the fields
    of `OPTION_FIELDS` and `task_options` for the rest."""
    fields = {k: v for k, v in options.items() if k in OPTION_FIELDS}
    rest = {k: v for k, v in options.items() if k not in OPTION_FIELDS}
    return {**fields, "task_options": rest} if rest else fields


def task_config(cfg: SyntheticConfig, split: str = "train"):
    """The task's own config dataclass (FlipFlopConfig, WordProblemConfig, MQRARConfig, ...)
    for `split` with cfg's batch_size, seed and task options; None options take the task's
    defaults."""
    spec = get_task(cfg.task)
    values = task_option_values(cfg)
    options = {o.name: values.get(o.name) for o in spec.options}
    return spec.make_config(split, options, batch_size=cfg.batch_size, seed=cfg.seed)


def build_task(cfg: SyntheticConfig, split: str = "train"):
    """The task object (FlipFlop, WordProblem, MQRAR, ...) of `task_config(cfg, split)`."""
    return get_task(cfg.task).task(task_config(cfg, split))


def model_vocab_size(task) -> int:
    """The model's vocabulary for a task object: the task's, plus a BOS token where the
    task's streams have one (word problems)."""
    return get_task(task.name).vocab_size(task)


def eval_splits(cfg: SyntheticConfig) -> tuple[str, ...]:
    """Names of the task's evaluation splits (`TaskSpec.splits`), e.g. ("val",)."""
    return get_task(cfg.task).eval_splits


# ModelConfig fields a SyntheticConfig decides itself (`build_model_config`)
TASK_DECIDES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "attn_type")


def build_model_config(cfg: SyntheticConfig, vocab_size: int, seq_len: int) -> ModelConfig:
    """The `ModelConfig` of a run ("fflm-1l" preset with the run's sizes and cfg.model's
    other fields)."""
    return ModelConfig.preset(
        "fflm-1l", **{"max_position_embeddings": max(2048, seq_len), **cfg.model},
        vocab_size=vocab_size, hidden_size=cfg.dim, intermediate_size=4 * cfg.dim,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, attn_type=cfg.attn)


class TaskStream:
    """Endless batches (tokens, targets), LongTensor [B, T] each, of one task and split,
    identical to `iter(task)` for the training stream, except where the task's streams
    have a BOS column first (word problems: T = length + 1; `TaskSpec.sample`).
    `state_dict()` holds the generator state and the number of batches drawn;
    `load_state_dict` continues from there.

    Args:
        task: a task object of a registered task (FlipFlop, WordProblem, MQRAR, ...).
        stream: generator seed stream (the split's, `TaskSpec.splits`: 0 = train).
    """

    def __init__(self, task, stream: int):
        self.task = task
        self.spec = get_task(task.name)
        self.stream = stream
        self.generator = make_generator(task.cfg.seed, stream)
        self.batches = 0

    @classmethod
    def for_split(cls, cfg: SyntheticConfig, split: str) -> TaskStream:
        """The stream of `split` ("train" or one of `eval_splits(cfg)`)."""
        return cls(build_task(cfg, split), get_task(cfg.task).stream(split))

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self.spec.sample(self.task, self.generator)
        self.batches += 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "batches": self.batches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.batches = int(state["batches"])
