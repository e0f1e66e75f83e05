"""Training: the synthetic tasks (`SyntheticConfig`, named presets) and language-model
pretraining (`PretrainConfig`, `pathattn.train.pretrain`) through one `Trainer` loop
(AdamW, warmup + cosine, clipping, JSONL logs, evaluation), atomic safetensors checkpoints
with exact resume and fallback to older ones, run-folder protection and locking
(`run_dir`), a graceful stop on SIGINT / SIGTERM (`signals`), and the task metrics
(`evaluate`)."""

import warnings

from .checkpoint import (
    CheckpointError,
    CheckpointWarning,
    latest_step,
    load_checkpoint,
    save_checkpoint,
)
from .compare import compare, markdown_table
from .evaluate import evaluate
from .loop_config import LoopConfig
from .pretrain import PretrainConfig, export_hf, text_loss
from .run_dir import RunDirBusy, RunDirError, lock_run_dir, prepare_run_dir, read_jsonl
from .signals import TrainingInterrupted
from .sweep import fewest_layers, layers_table, solve_score
from .synthetic import SYNTHETIC_PRESETS, SyntheticConfig, TaskStream, build_task, eval_splits
from .trainer import Trainer, lr_at, param_groups, train_or_reuse

__all__ = ["SyntheticConfig", "SYNTHETIC_PRESETS", "TaskStream", "build_task", "eval_splits",
           "Trainer", "lr_at", "param_groups", "evaluate", "save_checkpoint",
           "load_checkpoint", "latest_step", "compare", "markdown_table",
           "fewest_layers", "layers_table", "solve_score", "CheckpointError",
           "CheckpointWarning", "RunDirBusy", "RunDirError", "lock_run_dir", "prepare_run_dir",
           "read_jsonl", "TrainingInterrupted", "train_or_reuse", "LoopConfig",
           "PretrainConfig", "export_hf", "text_loss"]

# names of earlier releases -> today's
_RENAMED = {"TrainConfig": "SyntheticConfig", "TRAIN_PRESETS": "SYNTHETIC_PRESETS"}


def __getattr__(name: str):
    """The renamed names still resolve, with a FutureWarning naming the new one."""
    if name in _RENAMED:
        warnings.warn(f"pathattn.train.{name} is renamed {_RENAMED[name]}", FutureWarning,
                      stacklevel=2)
        return globals()[_RENAMED[name]]
    raise AttributeError(f"module 'pathattn.train' has no attribute {name!r}")
