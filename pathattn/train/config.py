"""`TrainConfig`: the one dataclass that describes a training run on a synthetic task of
`pathattn.tasks`, with named presets, and the task / model / data stream it
builds.

Data streams (`TaskStream`) draw the same batches as iterating the task object itself
(`iter(FlipFlop(cfg))` etc.), but keep their `torch.Generator` in reach so that a
checkpoint can store its state and the number of batches drawn (exact resume).

Word problems get a BOS token (our choice): `TaskStream` prepends one token, id
len(vocab) (`model_vocab_size` counts it), whose target is -100 (not scored). Without it a
model whose attention values carry no position (RoPE, PaTH, FoX: position enters only the
logits) cannot tell the word "g" from "g g": identical tokens give identical attention
outputs in every layer, so position 2 of such a word is always wrong. With the generators
alphabet of A5 that caps sequence accuracy near 5/6 (measured: 83-84 % for PaTH and RoPE
alike at k = 6, 2 and 3 layers). The BOS token receives a share of attention that shrinks
with position, which breaks the tie.

Validation streams (our choice): flip-flop uses its named splits `val`, `val_sparse`,
`val_dense` (`pathattn.tasks.SPLITS`, each its own seeded stream); the other tasks have no
splits, so their single `val` stream is the training task with seed stream 1 instead of 0
(independent of the training stream, fixed for a given seed).
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field
from typing import Any

import torch

from ..models import ATTN_TYPES, IGNORE_INDEX, ModelConfig
from ..tasks import (
    MQRAR,
    SPLITS,
    TASKS,
    FlipFlop,
    FlipFlopConfig,
    MQRARConfig,
    WordProblem,
    WordProblemConfig,
    make_generator,
)
from ..tasks.flipflop import next_token_targets, sample_flipflop
from .loop_config import DTYPES, LoopConfig

__all__ = ["TrainConfig", "TRAIN_PRESETS", "TASKS", "DTYPES", "TaskStream", "build_task",
           "task_config", "build_model_config", "eval_splits", "model_vocab_size",
           "NOT_IDENTITY"]

# TrainConfig fields that do not change a run's results (`TrainConfig.run_identity`)
NOT_IDENTITY = LoopConfig.NOT_IDENTITY
ALPHABETS = ("elements", "generators")
FLIPFLOP_VAL_SPLITS = ("val", "val_sparse", "val_dense")

# name -> field values that differ from the defaults; `TrainConfig.preset(name, **over)`.
# sized to finish in minutes on a CPU; "fflm-cpu" (the defaults) reaches 0 errors for PaTH.
TRAIN_PRESETS: dict[str, dict[str, Any]] = {
    # flip-flop, the paper's 1-layer / 2-head / 64-wide model (the defaults)
    "fflm-cpu": dict(task="flipflop"),
    # A5 word problems, length 32 (our default length)
    "a5-cpu": dict(task="a5", layers=2, dim=128, heads=4, length=32),
    # MQRAR 2-back, the paper's width and heads but a short sequence
    "mqrar-cpu": dict(task="mqrar", layers=2, dim=256, heads=2, length=128, n_back=2),
}


def _is_int(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Integral)


@dataclass
class TrainConfig(LoopConfig):
    """Hyper-parameters of one training run on a synthetic task: the loop's fields
    (`LoopConfig`) and the task's and model's. Validated on construction and by
    `validate()`; invalid values raise a ValueError that names the field.

    Model: a `PaTHLM` from the "fflm-1l" `ModelConfig` preset with vocab_size = the task's
    vocabulary, hidden_size = dim, intermediate_size = 4 * dim, num_hidden_layers = layers,
    num_attention_heads = heads, attn_type = attn.

    Defaults: steps=2000 at batch 16 is a flip-flop run of about 6 minutes on 2 CPU cores
    (512 tokens per sequence); PaTH reaches 0 errors on every split of the final evaluation
    (1024 sequences per split), RoPE 27.5 % / 46.2 % / 1.8 % (README).

    Checkpoints: every checkpoint_every steps and at the end; the last keep_checkpoints
    stay on disk (default 2: a damaged latest one falls back to the previous one,
    `pathattn.train.checkpoint`).

    Evaluation: every eval_every steps on eval_batches batches per split; the final
    evaluation (metrics.json) on final_eval_batches batches per split (default 64 batches of
    16 = 1024 sequences: enough reads to resolve flip-flop error rates well below 1 %).

    Model: `model` holds any further ModelConfig field (num_key_value_heads, beta_max,
    w_rank, conv_size, qk_norm, rope_theta, ...; `pathattn train --model-arg beta_max=1.99`).

    Task options: num_pairs (flip-flop; T = 2 * num_pairs), length (a5 / s5: default 32,
    mqrar: default 768), alphabet (a5 / s5), n_back, keys, values (mqrar). None = the
    task's default.
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
    # any other ModelConfig field, e.g. {"beta_max": 1.99, "w_rank": 16, "qk_norm": True}
    model: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> TrainConfig:
        """Raise ValueError naming the first invalid field; return self when valid."""
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
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
        applies = {"num_pairs": ("flipflop",), "length": ("a5", "s5", "mqrar"),
                   "alphabet": ("a5", "s5"), "n_back": ("mqrar",), "keys": ("mqrar",),
                   "values": ("mqrar",)}
        for name, tasks in applies.items():
            value = getattr(self, name)
            if value is None:
                continue
            if self.task not in tasks:
                raise ValueError(f"{name} applies to task {', '.join(tasks)} only, got "
                                 f"{name}={value!r} with task={self.task!r}")
            if name == "alphabet":
                if value not in ALPHABETS:
                    raise ValueError(f"alphabet must be one of {ALPHABETS}, got {value!r}")
            elif not _is_int(value) or value < 1:
                raise ValueError(f"{name} must be None or a positive int, got {value!r}")
        try:
            task_config(self)
        except ValueError as e:
            raise ValueError(f"task options: {e}") from None

    # ------------------------------------------------------------- dicts and presets

    @classmethod
    def preset(cls, name: str, **overrides) -> TrainConfig:
        """The preset `name` of `TRAIN_PRESETS`, with field overrides."""
        if name not in TRAIN_PRESETS:
            raise ValueError(f"unknown preset {name!r}; presets: {sorted(TRAIN_PRESETS)}")
        return cls.from_dict({**TRAIN_PRESETS[name], **overrides})


# ---------------------------------------------------------------------------- builders

def task_config(cfg: TrainConfig, split: str = "train"):
    """The task's own config dataclass (FlipFlopConfig, WordProblemConfig or MQRARConfig)
    with cfg's batch_size, seed and task options; None options take the task's defaults.
    `split` is a flip-flop split name; other tasks ignore it."""
    if cfg.task == "flipflop":
        extra = {} if cfg.num_pairs is None else {"num_pairs": cfg.num_pairs}
        return FlipFlopConfig(split=split, batch_size=cfg.batch_size, seed=cfg.seed, **extra)
    if cfg.task in ("a5", "s5"):
        extra = {k: v for k, v in (("length", cfg.length), ("alphabet", cfg.alphabet))
                 if v is not None}
        return WordProblemConfig(group=cfg.task, batch_size=cfg.batch_size, seed=cfg.seed,
                                 **extra)
    extra = {k: v for k, v in (("length", cfg.length), ("n_back", cfg.n_back),
                               ("num_keys", cfg.keys), ("num_values", cfg.values))
             if v is not None}
    return MQRARConfig(batch_size=cfg.batch_size, seed=cfg.seed, **extra)


def build_task(cfg: TrainConfig, split: str = "train"):
    """The task object (FlipFlop, WordProblem or MQRAR) of `task_config(cfg, split)`."""
    tcfg = task_config(cfg, split)
    if isinstance(tcfg, FlipFlopConfig):
        return FlipFlop(tcfg)
    if isinstance(tcfg, WordProblemConfig):
        return WordProblem(tcfg)
    return MQRAR(tcfg)


def model_vocab_size(task) -> int:
    """The model's vocabulary: the task's, plus the BOS token of word problems."""
    return len(task.vocab) + isinstance(task, WordProblem)


def eval_splits(cfg: TrainConfig) -> tuple[str, ...]:
    """Names of the evaluation splits: flip-flop's three, otherwise ("val",)."""
    return FLIPFLOP_VAL_SPLITS if cfg.task == "flipflop" else ("val",)


# ModelConfig fields a TrainConfig decides itself (`build_model_config`)
TASK_DECIDES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "attn_type")


def build_model_config(cfg: TrainConfig, vocab_size: int, seq_len: int) -> ModelConfig:
    """The `ModelConfig` of a run ("fflm-1l" preset with the run's sizes and cfg.model's
    other fields)."""
    return ModelConfig.preset(
        "fflm-1l", **{"max_position_embeddings": max(2048, seq_len), **cfg.model},
        vocab_size=vocab_size, hidden_size=cfg.dim, intermediate_size=4 * cfg.dim,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, attn_type=cfg.attn)


class TaskStream:
    """Endless batches (tokens, targets), LongTensor [B, T] each, of one task and split,
    identical to `iter(task)` for the training stream, except word problems: a BOS column
    first (module docstring), T = length + 1. `state_dict()` holds the generator
    state and the number of batches drawn; `load_state_dict` continues from there.

    Args:
        task: a FlipFlop, WordProblem or MQRAR.
        stream: generator stream (flip-flop: the split's, from SPLITS; others: 0 = train,
            1 = val).
    """

    def __init__(self, task, stream: int):
        self.task = task
        self.stream = stream
        self.generator = make_generator(task.cfg.seed, stream)
        self.batches = 0

    @classmethod
    def for_split(cls, cfg: TrainConfig, split: str) -> TaskStream:
        """The stream of `split` ("train" or one of `eval_splits(cfg)`)."""
        task = build_task(cfg, split)
        if cfg.task == "flipflop":
            return cls(task, SPLITS[split][1])
        return cls(task, 0 if split == "train" else 1)

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        task, g = self.task, self.generator
        if isinstance(task, FlipFlop):
            tokens = sample_flipflop(task.cfg, g)
            batch = tokens, next_token_targets(tokens)
        elif isinstance(task, WordProblem):
            tokens = task.sample(g)  # [B, T]
            targets = task.prefix_products(tokens)  # [B, T]
            bos = tokens.new_full((tokens.shape[0], 1), len(task.vocab))  # [B, 1]
            batch = (torch.cat([bos, tokens], dim=1),  # [B, T + 1]
                     torch.cat([torch.full_like(bos, IGNORE_INDEX), targets], dim=1))
        else:
            batch = task.encode(*task.sample(g))
        self.batches += 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "batches": self.batches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.batches = int(state["batches"])
