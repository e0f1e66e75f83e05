"""Checkpoints of a model sharded with FSDP2 (`--dp fsdp`), by `torch.distributed.checkpoint`
(DCP): every rank writes and reads its own shards of the weights and the optimizer state,
no rank ever holds the whole model.

Layout (next to the files of `pathattn.train.checkpoint`, same keeping and trust rules):

    sharded_{step:08d}/     the DCP folder: {"model": weights, "optim": AdamW state}, one
                            `.distcp` file per rank and DCP's `.metadata`
    state_{step:08d}.pt     rank 0's loop state: {"step", "torch_rng", "tokens", "data",
                            "config"} (no "optimizer": it is in the folder)
    latest.json             {"step", "model": "sharded_{step:08d}", "state": ...}

A save is atomic as a whole: every rank writes into `.sharded_{step:08d}.partial/`; once
DCP has finished (its metadata is written after every rank's shards), rank 0 renames the
folder into place, then writes the state file, then latest.json, then deletes older
checkpoints. A kill at any point leaves the previous checkpoint loadable; leftovers of an
interrupted save are deleted on resume.

Loading: rank 0 chooses the newest checkpoint whose folder holds DCP metadata and whose
state file is intact (latest.json's first, then older ones, with a `CheckpointWarning`
per damaged one) and broadcasts the step; every rank then reads its shards. DCP reshards on
load, so a run may resume on another number of ranks (the data order then changes: each
rank reads its own rows). The run folder must be on a file system that every rank sees.
"""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..utils.io import atomic_write_bytes, move_into_place, real_dir
from .checkpoint import (
    CheckpointError,
    CheckpointWarning,
    candidate_steps,
    checkpoint_dir,
    keep_last,
    partial_name,
    read_state,
    remove_tree,
    sharded_name,
    state_name,
    write_latest,
)

__all__ = ["save_sharded_checkpoint", "load_sharded_checkpoint"]


def _state_dicts(model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    return get_state_dict(model, optimizer)  # (model, optimizer) sharded, by parameter name


def save_sharded_checkpoint(out_dir: str | os.PathLike, step: int, model: torch.nn.Module,
                            optimizer: torch.optim.Optimizer, state: dict[str, Any],
                            keep: int) -> None:
    """Collective: every rank of the default group calls it with its shard of `model` and
    `optimizer`; rank 0's `state` (tensors, numbers, strings, containers: loads with
    weights_only=True) is the loop state. See the module docstring."""
    import torch.distributed.checkpoint as dcp

    ckdir = checkpoint_dir(out_dir)
    main = dist.get_rank() == 0
    partial = ckdir / partial_name(step)
    if main:
        real_dir(ckdir)  # a symlink in its place is replaced, never followed
        remove_tree(partial)
        partial.mkdir()
    dist.barrier()
    msd, osd = _state_dicts(model, optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(partial))
    if main:  # DCP returns once every rank's shards and the metadata are written
        final = ckdir / sharded_name(step)
        remove_tree(final)
        move_into_place(partial, final)
        buf = io.BytesIO()
        torch.save({**state, "step": step}, buf)
        atomic_write_bytes(ckdir / state_name(step), buf.getvalue())
        write_latest(ckdir, step, sharded=True)
        keep_last(ckdir, step, keep)
    dist.barrier()


def _choose(ckdir: Path) -> tuple[int | None, str]:
    """Rank 0: the newest loadable sharded step, or (None, why not)."""
    steps, problems = candidate_steps(ckdir)
    for problem in problems:
        warnings.warn(f"{problem}; looking for checkpoints in {ckdir}", CheckpointWarning,
                      stacklevel=3)
    if not steps and not problems:
        return None, f"no checkpoint in {ckdir} (missing latest.json)"
    for step in steps:
        folder = ckdir / sharded_name(step)
        try:
            if folder.is_symlink() or not folder.is_dir():
                raise CheckpointError(f"{folder} is missing (a sharded checkpoint is a "
                                      "folder; an unsharded run's checkpoint cannot be "
                                      "resumed with --dp fsdp)")
            if not (folder / ".metadata").is_file():
                raise CheckpointError(f"{folder} has no DCP .metadata (an interrupted save)")
            read_state(ckdir / state_name(step), step)
        except CheckpointError as e:
            problems.append(str(e))
            warnings.warn(f"skipping the checkpoint of step {step}: {e}", CheckpointWarning,
                          stacklevel=3)
            continue
        return step, ""
    return None, f"no intact checkpoint in {ckdir}: " + "; ".join(problems)


def load_sharded_checkpoint(out_dir: str | os.PathLike, model: torch.nn.Module,
                            optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Collective: load the newest intact sharded checkpoint into every rank's shards of
    `model` and `optimizer`; returns the loop state (state["step"] its step). Raises
    FileNotFoundError when there is no checkpoint, CheckpointError when none is intact (on
    every rank alike)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    ckdir = checkpoint_dir(out_dir)
    choice = [_choose(ckdir) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(choice, src=0)
    step, why = choice[0]
    if step is None:
        if why.startswith("no checkpoint"):
            raise FileNotFoundError(why)
        raise CheckpointError(why)
    msd, osd = _state_dicts(model, optimizer)
    sd = {"model": msd, "optim": osd}
    dcp.load(sd, checkpoint_id=str(ckdir / sharded_name(step)))
    set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    return read_state(ckdir / state_name(step), step)
