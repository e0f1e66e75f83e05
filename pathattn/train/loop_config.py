"""`LoopConfig`: the fields of the training loop that every workload shares (optimizer,
schedule, clipping, precision, logging, evaluation, checkpoints), validated in one place.
The config of each training command (`SyntheticConfig`, `PretrainConfig`) extends it with the
fields of its workload."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from ..utils import DTYPES, is_int, is_real

__all__ = ["LoopConfig", "DTYPES"]


def _is_finite(value) -> bool:
    """A real number other than inf, -inf and NaN (which train to NaN without an error)."""
    return is_real(value) and math.isfinite(value)


@dataclass
class LoopConfig:
    """Optimisation: AdamW(betas=(0.9, 0.95)); the learning rate rises linearly over
    warmup_steps from lr * warmup_start_ratio to lr, then follows a cosine to
    lr * min_lr_ratio at `steps` (`pathattn.train.lr_at`); gradients are clipped to global
    norm grad_clip (0 = off). dtype "bfloat16" runs the forward under CPU / CUDA autocast,
    parameters and optimizer state stay float32.

    Checkpoints every checkpoint_every steps and at the end; the last keep_checkpoints stay
    on disk. Evaluation every eval_every steps on eval_batches batches per split; the final
    evaluation (metrics.json) on final_eval_batches batches per split.
    """

    # fields that do not change a run's results (`run_identity`)
    NOT_IDENTITY: ClassVar[tuple[str, ...]] = ("out_dir", "progress", "keep_checkpoints")
    POSITIVE_INTS: ClassVar[tuple[str, ...]] = (
        "steps", "eval_every", "eval_batches", "final_eval_batches", "log_every",
        "checkpoint_every", "keep_checkpoints")

    steps: int = 2000
    lr: float = 1e-3
    weight_decay: float = 0.1
    warmup_steps: int = 100
    warmup_start_ratio: float = 0.0
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    dtype: str = "float32"
    eval_every: int = 500
    eval_batches: int = 4
    final_eval_batches: int = 64
    log_every: int = 10
    checkpoint_every: int = 500
    out_dir: str = "runs/train"
    # not part of a run's identity (may change when resuming)
    progress: bool = True
    keep_checkpoints: int = 2

    def __post_init__(self):
        self.validate()

    def validate(self):
        """Raise ValueError naming the first invalid field; return self when valid."""
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        for name in self.POSITIVE_INTS:
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for name in ("warmup_steps", "seed"):
            value = getattr(self, name)
            if not is_int(value) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        if not _is_finite(self.lr) or not self.lr > 0:
            raise ValueError(f"lr must be a finite positive number, got {self.lr!r}")
        for name in ("weight_decay", "grad_clip"):  # grad_clip 0 = no clipping
            value = getattr(self, name)
            if not _is_finite(value) or not value >= 0:
                raise ValueError(f"{name} must be a finite non-negative number"
                                 f"{' (0 = no clipping)' * (name == 'grad_clip')}, got "
                                 f"{value!r}")
        for name in ("min_lr_ratio", "warmup_start_ratio"):
            value = getattr(self, name)
            if not is_real(value) or not 0 <= value <= 1:
                raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
        if not isinstance(self.out_dir, str) or not self.out_dir:
            raise ValueError(f"out_dir must be a non-empty str, got {self.out_dir!r}")
        if not isinstance(self.progress, bool):
            raise ValueError(f"progress must be a bool, got {self.progress!r}")
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every field (JSON-serialisable)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]):
        """Inverse of `to_dict`; unknown keys raise ValueError."""
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown {cls.__name__} field(s): {unknown}")
        return cls(**d)

    def run_identity(self) -> dict[str, Any]:
        """The fields that must match for a resume to continue the same run (all but
        `NOT_IDENTITY`: where the run is, how it shows progress, how many checkpoints it
        keeps)."""
        d = self.to_dict()
        for name in self.NOT_IDENTITY:
            d.pop(name)
        return d
