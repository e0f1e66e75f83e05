"""Training checkpoints: model weights as safetensors, everything else (optimizer state, step,
RNG states, data-stream state, config) as a torch file of plain tensors / numbers / strings
that loads with `torch.load(..., weights_only=True)` (no unpickling of arbitrary objects).

Layout of `out_dir/checkpoints/`:

    model_{step:08d}.safetensors   weights (tied weights stored once; metadata: step, aliases)
    state_{step:08d}.pt            {"step", "optimizer", "torch_rng", "data", "config"}
    latest.json                    {"step", "model", "state"}: the current checkpoint

A run sharded with FSDP writes `sharded_{step:08d}/` (a `torch.distributed.checkpoint`
folder holding the weights and the optimizer state, each rank its shards) in place of the
weights file, and a state file without "optimizer" (`pathattn.train.sharded_checkpoint`);
everything below applies to both kinds.

Every file is written atomically and durably (`pathattn.utils.io`: a temp file next to
it, fsync, rename, fsync of the folder), with the ordinary permissions of a new file.
`latest.json` is replaced only after both files of the new step are on disk, and older
checkpoints are deleted only after that, so a kill at any point leaves a complete, loadable
checkpoint (the new one or the previous one).

Keeping: the last `keep` checkpoints (default 2) stay on disk, so that a damaged latest one
(truncated or empty weights, missing or truncated state, corrupt latest.json) is not the
end of a run: `load_checkpoint` tries latest.json's step first, then the older checkpoints
on disk, newest first, and skips a damaged one with a `CheckpointWarning` naming the bad
file. When none is intact it raises `CheckpointError` naming every bad file.

Symlinks: a symlink in place of `checkpoints/` is replaced by a real folder when a
checkpoint is written and unlinked (never followed) when the checkpoints are deleted.

Trust: latest.json is data, never a path. Its "model" and "state" must be exactly the names
of the pattern above for its "step" (no directory part, no other name), otherwise it counts
as corrupt (the error names the file and the expected names). Files are opened by those
names inside `checkpoints/` only, without following symlinks, and files are deleted only
when their names match the pattern, found by listing `checkpoints/`: nothing outside the
folder is read, written or deleted because of what latest.json says.
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import shutil
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from ..utils.io import (
    atomic_write_bytes,
    atomic_write_json,
    real_dir,
    remove_file,
    remove_temp_files,
)

__all__ = ["save_checkpoint", "load_checkpoint", "latest_step", "checkpoint_dir",
           "CheckpointError", "CheckpointWarning", "KEEP", "remove_checkpoints",
           "discard_after"]

LATEST = "latest.json"
KEEP = 2
_MODEL_RE = re.compile(r"model_(\d{8})\.safetensors")
_STATE_RE = re.compile(r"state_(\d{8})\.pt")
_SHARDED_RE = re.compile(r"sharded_(\d{8})")
_PARTIAL_RE = re.compile(r"\.sharded_(\d{8})\.partial")


class CheckpointError(ValueError):
    """A checkpoint file (or latest.json) that is missing, damaged or not of the expected
    name; the message names the file."""


class CheckpointWarning(UserWarning):
    """A damaged checkpoint was skipped and an older one is used instead."""


def checkpoint_dir(out_dir: str | os.PathLike) -> Path:
    return Path(out_dir) / "checkpoints"


def model_name(step: int) -> str:
    return f"model_{step:08d}.safetensors"


def state_name(step: int) -> str:
    return f"state_{step:08d}.pt"


def sharded_name(step: int) -> str:
    """The folder of a sharded (FSDP) checkpoint's weights and optimizer state."""
    return f"sharded_{step:08d}"


def partial_name(step: int) -> str:
    """The folder a sharded checkpoint is written into before it is renamed into place."""
    return f".{sharded_name(step)}.partial"


def write_latest(ckdir: Path, step: int, sharded: bool = False) -> None:
    """Point latest.json at the checkpoint of `step` (atomically)."""
    latest = {"step": step, "model": sharded_name(step) if sharded else model_name(step),
              "state": state_name(step)}
    atomic_write_json(ckdir / LATEST, latest)


def _remove_leftovers(ckdir: str | os.PathLike) -> list[str]:
    """Delete what interrupted saves left in the checkpoints folder `ckdir`: temp files of
    checkpoint files and latest.json, and folders of unfinished sharded saves. Returns the
    names deleted. Only names of those exact forms are touched."""
    ckdir = Path(ckdir)
    removed = remove_temp_files(ckdir, lambda target: bool(
        target == LATEST or _MODEL_RE.fullmatch(target) or _STATE_RE.fullmatch(target)))
    for name in _listdir(ckdir):
        if _PARTIAL_RE.fullmatch(name):
            remove_tree(ckdir / name)
            removed.append(name)
    return removed


def _listdir(folder: Path) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except FileNotFoundError:
        return []


# --------------------------------------------------------------------------- saving

def _model_bytes(model: torch.nn.Module, step: int) -> bytes:
    """safetensors bytes of model.state_dict(); a tensor shared by several names (tied
    embeddings) is stored under its first name and the others are listed as aliases."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, t in model.state_dict().items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
               tuple(t.stride()), t.dtype)
        if key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = t.detach().contiguous().cpu()
    metadata = {"step": str(step), "aliases": json.dumps(aliases)}
    return st_save(tensors, metadata=metadata)


def save_checkpoint(out_dir: str | os.PathLike, step: int, model: torch.nn.Module,
                    state: dict[str, Any], keep: int = KEEP) -> Path:
    """Write the checkpoint of `step` (module docstring) and return its directory.

    Args:
        out_dir: run directory; files go to out_dir/checkpoints.
        step: optimizer steps taken.
        model: the model whose state_dict is saved as safetensors.
        state: the rest (must hold only tensors, numbers, strings, bools, None, lists,
            tuples and dicts, so that it loads with weights_only=True); "step" is added.
        keep: checkpoints kept on disk (this one and the keep - 1 newest older ones); files
            of later steps (left by a run that was resumed from an older checkpoint) go too.
    """
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise ValueError(f"keep must be a positive int, got {keep!r}")
    ckdir = real_dir(checkpoint_dir(out_dir))  # a symlink there is replaced, not followed
    atomic_write_bytes(ckdir / model_name(step), _model_bytes(model, step))
    buf = io.BytesIO()
    torch.save({**state, "step": step}, buf)
    atomic_write_bytes(ckdir / state_name(step), buf.getvalue())
    write_latest(ckdir, step)
    keep_last(ckdir, step, keep)
    return ckdir


def keep_last(ckdir: Path, step: int, keep: int) -> None:
    """Delete the checkpoints older than the `keep` newest up to `step`, and every later
    one."""
    older = sorted(s for s in _steps_on_disk(ckdir) if s < step)
    _delete_steps(ckdir, older[:max(0, len(older) - (keep - 1))])
    _delete_steps(ckdir, [s for s in _steps_on_disk(ckdir) if s > step])


def _steps_on_disk(ckdir: Path) -> set[int]:
    """Steps that have a weights file or folder or a state file (of the checkpoint name
    patterns)."""
    steps = set()
    for name in _listdir(ckdir):
        m = (_MODEL_RE.fullmatch(name) or _STATE_RE.fullmatch(name)
             or _SHARDED_RE.fullmatch(name))
        if m:
            steps.add(int(m.group(1)))
    return steps


def _delete_steps(ckdir: Path, steps: Iterable[int]) -> None:
    for step in steps:
        for name in (model_name(step), state_name(step)):
            remove_file(ckdir / name)
        remove_tree(ckdir / sharded_name(step))


def remove_tree(path: Path) -> None:
    """Delete a checkpoint folder (a symlink in its place is unlinked, never followed)."""
    if path.is_symlink():
        remove_file(path)
    elif path.is_dir():
        shutil.rmtree(path)


def remove_checkpoints(out_dir: str | os.PathLike) -> None:
    """Delete every checkpoint of out_dir (files of the checkpoint pattern, latest.json and
    temp leftovers; nothing else) and the checkpoints folder when that leaves it empty; a
    symlink in place of the folder is unlinked, nothing is deleted where it points."""
    ckdir = checkpoint_dir(out_dir)
    if ckdir.is_symlink():
        remove_file(ckdir)
        return
    _remove_leftovers(ckdir)
    remove_file(ckdir / LATEST)
    _delete_steps(ckdir, _steps_on_disk(ckdir))
    try:
        ckdir.rmdir()
    except OSError:  # missing, or holds files that are not ours
        pass


def discard_after(out_dir: str | os.PathLike, step: int) -> None:
    """Make out_dir/checkpoints agree with a run resumed from `step`: delete temp leftovers
    and the files of later steps (an interrupted save, or a damaged checkpoint that was
    skipped), and point latest.json at `step` when it names anything else."""
    ckdir = checkpoint_dir(out_dir)
    _remove_leftovers(ckdir)
    _delete_steps(ckdir, [s for s in _steps_on_disk(ckdir) if s > step])
    try:
        current = _read_latest(ckdir)
    except CheckpointError:
        current = None
    if current != step:
        write_latest(ckdir, step, sharded=(ckdir / sharded_name(step)).is_dir()
                     and not (ckdir / model_name(step)).exists())


# -------------------------------------------------------------------------- loading

def _read_latest(ckdir: Path) -> int | None:
    """The step latest.json names, None when there is no latest.json; CheckpointError
    when it is not {"step": N, "model": model_{N:08d}.safetensors, "state":
    state_{N:08d}.pt} (module docstring: names are checked, never followed)."""
    path = ckdir / LATEST
    try:
        text = _read_bytes(path).decode()
    except CheckpointError:
        if not os.path.lexists(path):
            return None
        raise
    try:
        latest = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e})") from None
    step = latest.get("step") if isinstance(latest, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f'{path}: expected {{"step": <non-negative int>, "model": ..., '
                              f'"state": ...}}, got {text.strip()[:200]!r}')
    expected = {"model": (model_name(step), sharded_name(step)), "state": (state_name(step),)}
    for key, names in expected.items():
        if latest.get(key) not in names:
            wanted = " or ".join(map(repr, names))
            raise CheckpointError(f"{path}: {key!r} must be the name {wanted} (inside "
                                  f"{ckdir}, for step {step}), got {latest.get(key)!r}")
    return step


def _read_bytes(path: Path) -> bytes:
    """The bytes of a regular file, not following a symlink; CheckpointError when it is
    missing, a symlink or unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CheckpointError(f"{path} is a symlink; checkpoint files must be regular "
                                  "files inside the checkpoints folder") from None
        raise CheckpointError(f"{path} cannot be read ({e})") from None
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _read_model(path: Path, step: int) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, aliases) of a weights file; CheckpointError when it is missing, truncated,
    not safetensors or of another step."""
    data = _read_bytes(path)
    if len(data) < 8:
        raise CheckpointError(f"{path} is truncated ({len(data)} bytes)")
    try:
        tensors = st_load(data)
        size = int.from_bytes(data[:8], "little")
        metadata = json.loads(data[8:8 + size]).get("__metadata__") or {}
        aliases = json.loads(metadata.get("aliases", "{}"))
    except (SafetensorError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{path} is truncated or not a safetensors file ({e})") from None
    if metadata.get("step") != str(step):
        raise CheckpointError(f"{path}: weights of step {metadata.get('step')}, expected "
                              f"step {step}")
    return tensors, aliases


def read_state(path: Path, step: int) -> dict[str, Any]:
    """The state dict of a state file; CheckpointError when it is missing, damaged or of
    another step."""
    data = _read_bytes(path)
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - a damaged zip / pickle raises many types
        raise CheckpointError(f"{path} is truncated or damaged ({type(e).__name__}: "
                              f"{str(e)[:200]})") from None
    if not isinstance(state, dict) or state.get("step") != step:
        got = state.get("step") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{path}: state of step {got!r}, expected step {step}")
    return state


def candidate_steps(ckdir: Path) -> tuple[list[int], list[str]]:
    """Steps to try, newest first: latest.json's, then older ones on disk (files of later
    steps are an unfinished save and are ignored); without a usable latest.json every step
    on disk. Also returns the problems met (latest.json's)."""
    on_disk = sorted(_steps_on_disk(ckdir), reverse=True)
    try:
        latest = _read_latest(ckdir)
    except CheckpointError as e:
        return on_disk, [str(e)]
    if latest is None:
        return on_disk, []
    return [latest] + [s for s in on_disk if s < latest], []


def latest_step(out_dir: str | os.PathLike) -> int | None:
    """Step that out_dir's latest.json names, or None when there is none (CheckpointError
    when latest.json is corrupt; `load_checkpoint` then falls back to older files)."""
    return _read_latest(checkpoint_dir(out_dir))


def load_checkpoint(out_dir: str | os.PathLike, model: torch.nn.Module | None = None
                    ) -> dict[str, Any]:
    """Load out_dir's newest intact checkpoint (module docstring: latest.json's, else older
    ones with a CheckpointWarning per damaged file): the weights into `model` (when given;
    every parameter and buffer must be present) and return the state dict (loaded with
    weights_only=True; state["step"] is its step).

    Raises FileNotFoundError when out_dir has no checkpoint at all, CheckpointError (a
    ValueError) when none is intact, ValueError when the weights do not fit `model`."""
    ckdir = checkpoint_dir(out_dir)
    steps, problems = candidate_steps(ckdir)
    for problem in problems:
        warnings.warn(f"{problem}; looking for checkpoints in {ckdir}", CheckpointWarning,
                      stacklevel=2)
    if not steps and not problems:
        raise FileNotFoundError(f"no checkpoint in {ckdir} (missing {LATEST})")
    for step in steps:
        if is_sharded(ckdir, step):
            raise CheckpointError(f"the checkpoint of step {step} in {ckdir} is sharded "
                                  f"({sharded_name(step)}/, written by an FSDP run): resume "
                                  "it under torchrun with --dp fsdp")
        try:
            tensors, aliases = _read_model(ckdir / model_name(step), step)
            state = read_state(ckdir / state_name(step), step)
        except CheckpointError as e:
            problems.append(str(e))
            warnings.warn(f"skipping the checkpoint of step {step}: {e}", CheckpointWarning,
                          stacklevel=2)
            continue
        if model is not None:
            _load_weights(model, tensors, aliases, ckdir / model_name(step))
        return state
    raise CheckpointError(f"no intact checkpoint in {ckdir}: " + "; ".join(problems))


def is_sharded(ckdir: Path, step: int) -> bool:
    """Whether the checkpoint of `step` is a sharded one (a folder, no weights file)."""
    return (ckdir / sharded_name(step)).is_dir() and not (ckdir / model_name(step)).exists()


def _load_weights(model: torch.nn.Module, tensors: dict[str, torch.Tensor],
                  aliases: dict[str, str], path: Path) -> None:
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    missing = [m for m in missing if m not in aliases]
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not fit the model: missing "
                         f"{missing}, unexpected {unexpected}")
