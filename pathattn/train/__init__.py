"""Training: the synthetic tasks (`TrainConfig`, named presets) and language-model
pretraining (`PretrainConfig`, `pathattn.train.pretrain`) through one `Trainer` loop
(AdamW, warmup + cosine, clipping, JSONL logs, evaluation), atomic safetensors checkpoints
with exact resume and fallback to older ones, run-folder protection and locking
(`run_dir`), a graceful stop on SIGINT / SIGTERM (`signals`), and the task metrics
(`evaluate`)."""

from .checkpoint import (
    CheckpointError,
    CheckpointWarning,
    atomic_write_bytes,
    latest_step,
    load_checkpoint,
    save_checkpoint,
)
from .compare import compare, markdown_table
from .config import TRAIN_PRESETS, TaskStream, TrainConfig, build_task, eval_splits
from .evaluate import evaluate
from .loop_config import LoopConfig
from .pretrain import PretrainConfig, export_hf, text_loss
from .run_dir import RunDirBusy, RunDirError, lock_run_dir, prepare_run_dir, read_jsonl
from .signals import TrainingInterrupted
from .sweep import fewest_layers, layers_table, solve_score
from .trainer import Trainer, lr_at, param_groups, train_or_reuse

__all__ = ["TrainConfig", "TRAIN_PRESETS", "TaskStream", "build_task", "eval_splits",
           "Trainer", "lr_at", "param_groups", "evaluate", "save_checkpoint",
           "load_checkpoint", "latest_step", "atomic_write_bytes", "compare", "markdown_table",
           "fewest_layers", "layers_table", "solve_score", "CheckpointError",
           "CheckpointWarning", "RunDirBusy", "RunDirError", "lock_run_dir", "prepare_run_dir",
           "read_jsonl", "TrainingInterrupted", "train_or_reuse", "LoopConfig",
           "PretrainConfig", "export_hf", "text_loss"]
