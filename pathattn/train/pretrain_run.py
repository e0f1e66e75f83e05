"""A pretraining run to its end: train (`Trainer`), export the model to `out_dir/hf`
(`export_hf`; a model sharded under torchrun is gathered onto rank 0 first), and leave
the process group. `pathattn pretrain` builds the config and the Trainer, then calls
`train_and_export`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .pretrain import PretrainConfig, export_hf
from .trainer import Trainer

__all__ = ["pretrain", "train_and_export", "export_trained"]


def pretrain(cfg: PretrainConfig, *, export: bool = True, **trainer_options
             ) -> tuple[dict[str, Any], Path | None]:
    """Train cfg's run (`Trainer(cfg, **trainer_options)`: resume, overwrite, dp,
    context_parallel, ...) and export it: `train_and_export`."""
    return train_and_export(Trainer(cfg, **trainer_options), export=export)


def train_and_export(trainer: Trainer, export: bool = True
                     ) -> tuple[dict[str, Any], Path | None]:
    """Train to the config's last step, export the model when the run finished (and
    `export`), close the process group and release the run folder. Returns the final
    metrics and the export folder (None on ranks other than 0 and when not exported)."""
    with trainer:
        metrics = trainer.train()
        path = None
        if export and trainer.step == trainer.cfg.steps:
            path = export_trained(trainer)
        if trainer.parallel is not None:
            trainer.parallel.close()
    return metrics, path


def export_trained(trainer: Trainer) -> Path | None:
    """`export_hf` of the trainer's model on rank 0, None elsewhere (a sharded model is
    gathered first: a collective every rank calls)."""
    from ..distributed import full_state_dict
    from ..models import PaTHLM

    cfg = trainer.cfg
    if not trainer.sharded:
        return export_hf(trainer.model, cfg) if trainer.is_main else None
    state = full_state_dict(trainer.model)
    if not trainer.is_main:
        return None
    model = PaTHLM(cfg.model)
    model.load_state_dict(state)
    return export_hf(model, cfg)
