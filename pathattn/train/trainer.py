"""`Trainer`: the one training loop, for every workload (`pathattn.train.workload`): the
synthetic tasks of `pathattn.tasks` and language-model pretraining (`PretrainConfig`).

Each step: forward of each micro-batch (autocast for dtype="bfloat16"), the loss as the
mean over the step's scored targets (on one process or P ranks alike), backward, gradient
clipping, AdamW at the learning rate of `lr_at` (no weight decay on norms, biases and
embeddings). Writes log.jsonl, eval.jsonl, metrics.json, config.json and checkpoints/ in
`cfg.out_dir`; resumes exactly (bit-identical losses); locks the run folder; finishes the
step and checkpoints on SIGINT / SIGTERM; stops at a non-finite loss, gradient norm, weight
or metric (`pathattn.train.divergence`). Outputs, resume and signals in detail:
docs/training.md.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from tqdm.auto import tqdm

from ..distributed.data_parallel import DistributedTraining, replica_layout
from ..models import IGNORE_INDEX
from ..tasks import flatten_metrics
from ..utils import autocast_context
from ..utils.device import fused_optimizer, to_device
from ..utils.io import append_text, atomic_write_json, remove_temp_files, writable_dir
from .checkpoint import (
    CheckpointError,
    discard_after,
    latest_step,
    load_checkpoint,
    save_checkpoint,
)
from .divergence import NonFiniteTraining, check_finite_weights, non_finite
from .loop_config import LoopConfig
from .run_dir import LOG_FILES, clear_run, finished_metrics, prepare_run_dir, truncate_jsonl
from .sharded_checkpoint import load_sharded_checkpoint, save_sharded_checkpoint
from .signals import StopRequests, TrainingInterrupted
from .synthetic import SyntheticConfig
from .workload import build_workload

__all__ = ["Trainer", "lr_at", "param_groups", "train_or_reuse", "open_run", "TrainingInterrupted",
           "TIMING_FIELDS"]

# log.jsonl fields that depend on the wall clock
TIMING_FIELDS = ("elapsed_s", "tokens_per_s")


def lr_at(step: int, cfg: LoopConfig) -> float:
    """Learning rate of optimizer step `step` (0-based: the update that takes the model
    from `step` to `step + 1` steps). For step < warmup_steps a linear warmup, from
    lr * warmup_start_ratio up to lr at the last warmup step; then a cosine from lr down to
    lr * min_lr_ratio, reached at step == cfg.steps."""
    if step < cfg.warmup_steps:
        start = cfg.warmup_start_ratio
        if start == 0:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        return cfg.lr * (start + (1 - start) * (step + 1) / cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
    ratio = cfg.min_lr_ratio
    return cfg.lr * (ratio + (1 - ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: [decayed, not decayed]. Not decayed: parameters with fewer than two
    dims (norm weights, biases, gate biases) and embedding weights (a tied LM head is the
    same tensor, counted once)."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay = [], []
    for p in model.parameters():  # distinct parameters, a tied weight once
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or id(p) in embeddings else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


class Trainer:
    """The training loop (docs/training.md) of `model` on `train_data`, evaluated by
    `evaluator`, as `config` says.

    Args:
        model: forward(**micro_batch) -> (logits or None, loss), loss the mean over the
            micro-batch's scored positions (labels != -100), as `pathattn.models.PaTHLM`.
        train_data: an iterator of steps (lists of micro-batch dicts) with `state_dict()`,
            `load_state_dict(state)` and `batches` (steps drawn), for exact resume.
        evaluator: `evaluator(model, batches) -> {split: {metric: value}}` on `batches`
            batches per split (None: the config's eval_batches).
        config: the loop's config (`LoopConfig`: SyntheticConfig, PretrainConfig, ...).
        resume: continue from config.out_dir's checkpoint (its config must match but for
            `progress`, `out_dir`, `keep_checkpoints`; ValueError otherwise).
        device: where the model runs (default CPU).
        context_parallel: under torchrun, the number of ranks that share each sequence
            (`pathattn.distributed.DistributedTraining`; data parallelism over the rest).
        dp: under torchrun, "ddp" (every rank holds the model) or "fsdp" (FSDP2, sharded
            checkpoints). Only rank 0 writes logs and metrics (and locks the folder).
        overwrite: replace a run the folder holds (without it: RunDirError).
        name: the progress bar's label.

    `Trainer(config, ...)` is short for `Trainer.from_config(config, ...)`: the workload
    registered for the config's type builds model, data and evaluation.
    """

    def __init__(self, model: nn.Module | LoopConfig, train_data: Any = None,
                 evaluator: Callable | None = None, config: LoopConfig | None = None, *,
                 resume: bool = False, device: torch.device | str = "cpu",
                 context_parallel: int = 1, dp: str = "ddp", overwrite: bool = False,
                 name: str | None = None):
        if isinstance(model, LoopConfig):
            if train_data is not None or evaluator is not None or config is not None:
                raise ValueError("Trainer(config) builds the model, data and evaluator of "
                                 "the config's workload; pass Trainer(model, train_data, "
                                 "evaluator, config) to give them yourself")
            cfg = model.validate()
            torch.manual_seed(cfg.seed)
            workload = build_workload(cfg, torch.device(device), replica_layout(
                context_parallel)[:2])
            model, train_data, evaluator = (workload.model, workload.train_data,
                                            workload.evaluate)
            name = workload.name if name is None else name
            config = cfg
        if not isinstance(config, LoopConfig):
            raise ValueError(f"config must be a LoopConfig (SyntheticConfig, PretrainConfig, ...), "
                             f"got {type(config).__name__}")
        if not isinstance(model, nn.Module):
            raise ValueError(f"model must be an nn.Module, got {type(model).__name__}")
        for attr in ("state_dict", "load_state_dict", "batches", "__next__"):
            if not hasattr(train_data, attr):
                raise ValueError(f"train_data must be an iterator of steps with "
                                 f"state_dict(), load_state_dict() and batches; it has no "
                                 f"{attr!r}")
        if not callable(evaluator):
            raise ValueError(f"evaluator must be callable(model, batches), got {evaluator!r}")
        cfg = self.cfg = config.validate()
        if resume and overwrite:
            raise ValueError("resume and overwrite exclude each other (--resume continues the "
                             "run in the folder, --overwrite replaces it)")
        self.device = torch.device(device)
        self.out_dir = writable_dir(cfg.out_dir)  # ValueError: a file, or read-only
        self.lock = None
        self.fresh = not resume  # a failed first step leaves no run behind (train())
        self.model, self.data, self.evaluator = model, train_data, evaluator
        self.name = name or type(cfg).__name__
        # torchrun: DDP / FSDP (+ context parallelism) from outside the model; None otherwise
        self.parallel = DistributedTraining.from_env(self.model, context_parallel, self.device,
                                                     dp=dp, dtype=cfg.dtype)
        self.is_main = self.parallel is None or self.parallel.is_main
        self.sharded = self.parallel is not None and self.parallel.sharded
        if self.is_main:  # before anything in the folder is read or written
            self.lock = prepare_run_dir(self.out_dir, resume=resume, overwrite=overwrite)
        if self.sharded:  # every rank past the folder checks before anyone loads
            self.parallel.barrier()
        self.optimizer = torch.optim.AdamW(param_groups(self.model, cfg.weight_decay),
                                           lr=cfg.lr, betas=(0.9, 0.95),
                                           **fused_optimizer(self.device))
        self.step = 0
        self.tokens = 0  # input tokens of all steps so far
        try:
            if resume:
                self._resume()
            else:
                self._truncate_logs(0)
            if self.is_main:
                atomic_write_json(self.out_dir / "config.json", cfg.to_dict(), indent=2)
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_config(cls, cfg: LoopConfig, **kwargs) -> Trainer:
        """The Trainer of the workload registered for cfg's type (`pathattn.train.workload`:
        SyntheticConfig -> a synthetic task, PretrainConfig -> text pretraining); kwargs as for
        the constructor."""
        return cls(cfg, **kwargs)

    # ------------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Everything but the weights (loads with weights_only=True); the optimizer state
        only when the model is not sharded (sharded, it is saved with the weights)."""
        state = {"torch_rng": torch.get_rng_state(),
                 "tokens": self.tokens,
                 "data": self.data.state_dict(),
                 "config": self.cfg.to_dict()}
        if not self.sharded:
            state["optimizer"] = self.optimizer.state_dict()
        return state

    def close(self) -> None:
        """Release the run folder's lock (module docstring); the Trainer must not write
        afterwards."""
        if self.lock is not None:
            self.lock.release()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def save(self) -> None:
        """Checkpoint of the current step (collective when the model is sharded);
        NonFiniteTraining instead when a weight is not finite (checked on one process)."""
        if self.sharded:
            save_sharded_checkpoint(self.out_dir, self.step, self.model, self.optimizer,
                                    self.state_dict(), keep=self.cfg.keep_checkpoints)
            return
        if not self.is_main:
            return
        check_finite_weights(self.model, self.step, self._last_checkpoint(), self.out_dir)
        save_checkpoint(self.out_dir, self.step, self.model, self.state_dict(),
                        keep=self.cfg.keep_checkpoints)

    def _last_checkpoint(self) -> int | None:
        """The step of the checkpoint latest.json names (None: none, or unreadable)."""
        try:
            return latest_step(self.out_dir)
        except CheckpointError:
            return None

    def _check_finite(self, step: int, values: dict, what: str) -> None:
        """NonFiniteTraining naming the keys of `values` that are not finite (module
        `divergence`), before they are applied, logged or saved."""
        bad = non_finite(values)
        if bad:
            shown = ", ".join(f"{k} {values.get(k, 'nan')}" for k in bad)
            raise NonFiniteTraining(step, f"{what} ({shown})", self._last_checkpoint(),
                                    self.out_dir)

    def _resume(self) -> None:
        if self.sharded:
            state = load_sharded_checkpoint(self.out_dir, self.model, self.optimizer)
        else:
            state = load_checkpoint(self.out_dir, self.model)
        saved = type(self.cfg).from_dict(state["config"]).run_identity()
        mine = self.cfg.run_identity()
        diff = sorted(k for k in mine if mine[k] != saved[k])
        if diff:
            raise ValueError(f"resume: config differs from the checkpoint's in {diff} "
                             f"(checkpoint: {[saved[k] for k in diff]}, given: "
                             f"{[mine[k] for k in diff]})")
        if not self.sharded:
            self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        self.data.load_state_dict(state["data"])
        self.step = int(state["step"])
        self.tokens = int(state.get("tokens", 0))
        if self.data.batches != self.step:
            raise ValueError(f"resume: checkpoint data stream drew {self.data.batches} "
                             f"batches at step {self.step}")
        self._truncate_logs(self.step)

    def _truncate_logs(self, step: int) -> None:
        """Make the folder agree with a run at `step` (module docstring): log.jsonl keeps
        the records of steps <= step, eval.jsonl too but for the final evaluation's record
        when step == cfg.steps (train() redoes it); temp leftovers and checkpoint files of
        later steps go."""
        if not self.is_main:
            return
        remove_temp_files(self.out_dir, LOG_FILES)
        truncate_jsonl(self.out_dir / "log.jsonl", step)
        truncate_jsonl(self.out_dir / "eval.jsonl",
                       step - 1 if step == self.cfg.steps else step)
        if step > 0:
            discard_after(self.out_dir, step)

    def _append(self, name: str, record: dict[str, Any]) -> None:
        if not self.is_main:
            return
        append_text(self.out_dir / name, json.dumps(record, allow_nan=False) + "\n")

    # ---------------------------------------------------------------------- training

    def train_step(self) -> dict[str, float]:
        """One optimizer step on the next training step's micro-batches; returns {"loss",
        "lr", "grad_norm"} (loss: mean over the step's scored targets)."""
        cfg = self.cfg
        micro = [{k: to_device(v, self.device) if torch.is_tensor(v) else v
                  for k, v in mb.items()}
                 for mb in next(self.data)]
        # "global_scored" / "global_tokens": scored targets / input tokens of the global
        # micro-batch when each rank reads its own rows (pretraining); absent when every
        # rank draws the global batch (tasks)
        global_scored = [mb.pop("global_scored", None) for mb in micro]
        global_tokens = [mb.pop("global_tokens", None) for mb in micro]
        lr = lr_at(self.step, cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        if self.parallel is not None and None not in global_scored:
            loss_sum = self._sharded_backward(micro, sum(global_scored))
        else:
            loss_sum = self._backward(micro)
        grad_norm = self._clip_gradients(cfg.grad_clip)
        self._check_finite(self.step + 1, {"loss": loss_sum, "grad_norm": grad_norm},
                           "the loss or gradient norm is")  # before the update
        self.optimizer.step()
        self.step += 1
        self.tokens += sum(mb["input_ids"].numel() if n is None else n
                           for mb, n in zip(micro, global_tokens, strict=True))
        return {"loss": loss_sum, "lr": lr, "grad_norm": grad_norm}

    def _clip_gradients(self, max_norm: float) -> float:
        """Global gradient norm (over every rank's shards when sharded), gradients scaled
        to at most max_norm when max_norm > 0."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        if max_norm > 0:
            norm = nn.utils.clip_grad_norm_(params, max_norm)
        else:
            norm = nn.utils.get_total_norm([p.grad for p in params])
        if hasattr(norm, "full_tensor"):  # a DTensor (FSDP): the norm over all shards
            norm = norm.full_tensor()
        return float(norm)

    def _backward(self, micro: list[dict]) -> float:
        """Gradients of the step's mean loss over scored targets (micro-batches weighted by
        their scored targets); returns that loss."""
        scored = [int((mb["labels"] != IGNORE_INDEX).sum()) for mb in micro]
        total = max(1, sum(scored))
        loss_sum = 0.0
        for mb, n in zip(micro, scored, strict=True):
            with autocast_context(self.cfg.dtype, self.device):
                if self.parallel is None:
                    _, loss = self.model(**mb)
                    objective = loss * (n / total) if len(micro) > 1 else loss
                else:  # this rank's share of the global batch's mean loss
                    if len(micro) > 1 or "cu_seqlens" in mb:
                        raise ValueError("torchrun: data parallelism takes one dense "
                                         "micro-batch per step")
                    loss, objective = self.parallel.loss(mb["input_ids"], mb["labels"])
            objective.backward()
            loss_sum += float(loss.detach()) * (n / total if len(micro) > 1 else 1.0)
        return loss_sum

    def _sharded_backward(self, micro: list[dict], global_scored: int) -> float:
        """As `_backward` under torchrun when each rank holds its own rows of every
        micro-batch (`DistributedTraining.shard_loss`)."""
        loss_sum = 0.0
        for mb in micro:
            with autocast_context(self.cfg.dtype, self.device):
                loss, objective = self.parallel.shard_loss(mb, global_scored)
            objective.backward()
            loss_sum += float(loss)
        return loss_sum

    def evaluate(self, batches: int | None = None) -> dict[str, dict[str, float]]:
        """Metrics on every validation split (the evaluator's), on `batches` batches per
        split (default cfg.eval_batches). Collective when the model is sharded (every rank
        runs the same batches). NonFiniteTraining when a metric is not finite."""
        metrics = self.evaluator(self.model, batches)
        self._check_finite(self.step, flatten_metrics(metrics), "the validation metrics are")
        return metrics

    def _evaluates(self) -> bool:
        """Whether this rank runs evaluations: rank 0, and every rank of a sharded model
        (each forward gathers parameters from all of them)."""
        return self.is_main or self.sharded

    def train(self, until: int | None = None) -> dict[str, Any]:
        """Train from the current step up to `until` (default cfg.steps) steps. Logs every
        log_every steps, evaluates every eval_every, checkpoints every checkpoint_every.
        When cfg.steps is reached: final checkpoint, evaluation and metrics.json, which is
        returned as a dict; stopping earlier (`until` < cfg.steps, e.g. to simulate an
        interrupted run) returns {"step": step} and writes no final checkpoint. A fresh run
        that fails before its first step leaves no run in the folder (a rerun needs no
        --overwrite); a non-finite value stops it (NonFiniteTraining)."""
        try:
            return self._train(until)
        except Exception:
            if self.fresh and self.step == 0 and self.is_main:
                clear_run(self.out_dir)
            raise

    def _train(self, until: int | None) -> dict[str, Any]:
        cfg = self.cfg
        until = cfg.steps if until is None else min(int(until), cfg.steps)
        self.model.train()
        bar = tqdm(total=cfg.steps, initial=self.step, desc=f"train {self.name}",
                   disable=not (cfg.progress and sys.stderr.isatty()), dynamic_ncols=True)
        start, start_tokens = time.perf_counter(), self.tokens
        # torchrun: no graceful stop (every rank would have to agree on the step)
        with StopRequests(enabled=self.parallel is None) as stop:
            try:
                while self.step < until:
                    stats = self.train_step()
                    bar.update(1)
                    if self.step % cfg.log_every == 0 or self.step == cfg.steps:
                        elapsed = time.perf_counter() - start
                        self._append("log.jsonl", {
                            "step": self.step, **stats, "tokens": self.tokens,
                            "elapsed_s": elapsed,
                            "tokens_per_s": (self.tokens - start_tokens) / max(elapsed, 1e-9)})
                        bar.set_postfix(loss=f"{stats['loss']:.4f}", lr=f"{stats['lr']:.2e}")
                    if (self.step % cfg.eval_every == 0 and self.step < cfg.steps
                            and self._evaluates()):
                        self._append("eval.jsonl",
                                     {"step": self.step, **flatten_metrics(self.evaluate())})
                    saved = self.step % cfg.checkpoint_every == 0 and self.step < cfg.steps
                    if saved:
                        self.save()
                    if stop.signum is not None:
                        self._stop(stop.signum, saved)
            finally:
                bar.close()
            if self.step < cfg.steps:
                return {"step": self.step}
            self.save()
            if stop.signum is not None:
                self._stop(stop.signum, saved=True)
            if not self._evaluates():
                return {"step": self.step}
            # a stop requested from here on is moot: the run completes
            metrics = {"step": self.step,
                       **flatten_metrics(self.evaluate(self.cfg.final_eval_batches))}
            if not self.is_main:
                return {"step": self.step}
            self._append("eval.jsonl", metrics)
            atomic_write_json(self.out_dir / "metrics.json", metrics, indent=2)
        return metrics

    def _stop(self, signum: int, saved: bool) -> None:
        """The end of a run stopped by a signal: a checkpoint of the current step (unless
        just written), then TrainingInterrupted."""
        if not saved:
            self.save()
        raise TrainingInterrupted(signum, self.step, self.out_dir)


def train_or_reuse(cfg: SyntheticConfig, *, resume: bool = False, overwrite: bool = False,
                   reuse_finished: bool = False) -> dict[str, Any]:
    """The final metrics of the run of `cfg`, for commands that run several (compare,
    layers): with reuse_finished or resume, a finished run of the same config in
    cfg.out_dir is reused (`run_dir.finished_metrics`); with resume, a run with a checkpoint
    is continued and one without starts over; overwrite replaces whatever is there;
    otherwise a fresh run (RunDirError when the folder holds one). The Trainer's lock is
    released at the end."""
    if (resume or reuse_finished) and not overwrite:
        metrics = finished_metrics(cfg)
        if metrics is not None:
            return metrics
    with open_run(cfg, resume=resume, overwrite=overwrite) as trainer:
        return trainer.train()


def open_run(cfg: LoopConfig, *, resume: bool = False, overwrite: bool = False,
             **kwargs) -> Trainer:
    """The Trainer of cfg's run: with resume, continued from its checkpoint (started over
    when it stopped before its first one); otherwise a fresh run, overwrite replacing
    whatever the folder holds. kwargs: further Trainer options (dp, device, ...)."""
    if resume:
        try:
            return Trainer(cfg, resume=True, **kwargs)
        except FileNotFoundError:  # stopped before its first checkpoint
            return Trainer(cfg, overwrite=True, **kwargs)
    return Trainer(cfg, overwrite=overwrite, **kwargs)
