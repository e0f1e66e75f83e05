"""Training on the synthetic tasks: `TrainConfig` (one dataclass, named presets), the
`Trainer` loop (AdamW, warmup + cosine, clipping, JSONL logs, evaluation), atomic
safetensors checkpoints with exact resume, and the task metrics (`evaluate`)."""

from .checkpoint import atomic_write_bytes, latest_step, load_checkpoint, save_checkpoint
from .compare import compare, markdown_table
from .config import TRAIN_PRESETS, TaskStream, TrainConfig, build_task, eval_splits
from .evaluate import evaluate
from .sweep import fewest_layers, layers_table, solve_score
from .trainer import Trainer, lr_at, param_groups

__all__ = ["TrainConfig", "TRAIN_PRESETS", "TaskStream", "build_task", "eval_splits",
           "Trainer", "lr_at", "param_groups", "evaluate", "save_checkpoint",
           "load_checkpoint", "latest_step", "atomic_write_bytes", "compare", "markdown_table",
           "fewest_layers", "layers_table", "solve_score"]
