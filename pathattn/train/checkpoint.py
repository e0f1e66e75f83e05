"""Training checkpoints: model weights as safetensors, everything else (optimizer state, step,
RNG states, data-stream state, config) as a torch file of plain tensors / numbers / strings
that loads with `torch.load(..., weights_only=True)` (no unpickling of arbitrary objects).

Layout of `out_dir/checkpoints/`:

    model_{step:08d}.safetensors   weights (tied weights stored once; metadata: step, aliases)
    state_{step:08d}.pt            {"step", "optimizer", "torch_rng", "data", "config"}
    latest.json                    {"step", "model", "state"}: the current checkpoint

Every file is written atomically (temp file in the same directory, fsync, `os.replace`,
fsync of the directory). `latest.json` is replaced only after both files of the new step
are on disk, and the previous step's files are deleted only after that, so a crash at any
point leaves a complete, loadable checkpoint (the new one or the previous one).
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

__all__ = ["atomic_write_bytes", "save_checkpoint", "load_checkpoint", "latest_step",
           "checkpoint_dir"]

LATEST = "latest.json"
_replace = os.replace  # indirection so tests can make the final rename fail


def checkpoint_dir(out_dir: str | os.PathLike) -> Path:
    return Path(out_dir) / "checkpoints"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` atomically: a temp file in the same directory, flushed and
    fsynced, then `os.replace`d over `path`. On any failure the temp file is removed and
    `path` keeps its previous content."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync_dir(path.parent)


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
                    state: dict[str, Any]) -> Path:
    """Write the checkpoint of `step` (module docstring) and return its directory.

    Args:
        out_dir: run directory; files go to out_dir/checkpoints.
        step: optimizer steps taken.
        model: the model whose state_dict is saved as safetensors.
        state: the rest (must hold only tensors, numbers, strings, bools, None, lists,
            tuples and dicts, so that it loads with weights_only=True); "step" is added.
    """
    ckdir = checkpoint_dir(out_dir)
    ckdir.mkdir(parents=True, exist_ok=True)
    previous = _read_latest(ckdir)
    model_name, state_name = f"model_{step:08d}.safetensors", f"state_{step:08d}.pt"
    atomic_write_bytes(ckdir / model_name, _model_bytes(model, step))
    buf = io.BytesIO()
    torch.save({**state, "step": step}, buf)
    atomic_write_bytes(ckdir / state_name, buf.getvalue())
    latest = {"step": step, "model": model_name, "state": state_name}
    atomic_write_bytes(ckdir / LATEST, (json.dumps(latest) + "\n").encode())
    if previous is not None and previous["step"] != step:
        for key in ("model", "state"):
            (ckdir / previous[key]).unlink(missing_ok=True)
    return ckdir


def _read_latest(ckdir: Path) -> dict[str, Any] | None:
    path = ckdir / LATEST
    if not path.exists():
        return None
    return json.loads(path.read_text())


def latest_step(out_dir: str | os.PathLike) -> int | None:
    """Step of out_dir's current checkpoint, or None when there is none."""
    latest = _read_latest(checkpoint_dir(out_dir))
    return None if latest is None else int(latest["step"])


def load_checkpoint(out_dir: str | os.PathLike, model: torch.nn.Module | None = None
                    ) -> dict[str, Any]:
    """Load out_dir's current checkpoint: the weights into `model` (when given; every
    parameter and buffer must be present) and return the state dict (weights_only=True).
    Raises FileNotFoundError when out_dir has no checkpoint, ValueError on a mismatch."""
    ckdir = checkpoint_dir(out_dir)
    latest = _read_latest(ckdir)
    if latest is None:
        raise FileNotFoundError(f"no checkpoint in {ckdir} (missing {LATEST})")
    state = torch.load(ckdir / latest["state"], map_location="cpu", weights_only=True)
    if int(state["step"]) != int(latest["step"]):
        raise ValueError(f"checkpoint {ckdir}: state step {state['step']} != latest step "
                         f"{latest['step']}")
    if model is not None:
        model_path = ckdir / latest["model"]
        with safe_open(str(model_path), framework="pt") as f:
            metadata = f.metadata() or {}
        if int(metadata.get("step", -1)) != int(latest["step"]):
            raise ValueError(f"checkpoint {model_path}: weights of step "
                             f"{metadata.get('step')} != latest step {latest['step']}")
        aliases = json.loads(metadata.get("aliases", "{}"))
        tensors = st_load(model_path.read_bytes())
        missing, unexpected = model.load_state_dict(tensors, strict=False)
        missing = [m for m in missing if m not in aliases]
        if missing or unexpected:
            raise ValueError(f"checkpoint {model_path} does not fit the model: missing "
                             f"{missing}, unexpected {unexpected}")
    return state
