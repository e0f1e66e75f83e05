"""The device of a command, and what follows from it, decided in one place.

`resolve_device(name)`: the torch device of a `--device` value ("cpu", "cuda", "cuda:1";
None: cuda when available, else cpu). Under torchrun (LOCAL_RANK set), "cuda" means this
process's GPU, cuda:LOCAL_RANK, and it becomes the current CUDA device, so that NCCL,
DDP and FSDP2 use it. A CUDA device without CUDA, or a device name torch does not know,
is a ValueError naming the flag.

What a CUDA device changes (a CPU run is the same as before, bit for bit):

    distributed_backend   "nccl" for CUDA, "gloo" otherwise
    fused_optimizer       AdamW's fused kernel on CUDA (one launch per step for every
                          parameter); the default for-each implementation elsewhere
    to_device             batches copied from pinned host memory without waiting
                          (non_blocking) to CUDA; a plain .to elsewhere
"""

from __future__ import annotations

import os

import torch

__all__ = ["resolve_device", "distributed_backend", "fused_optimizer", "to_device"]


def resolve_device(name: str | torch.device | None = None, flag: str = "--device"
                   ) -> torch.device:
    """The torch.device of a --device value (module docstring). ValueError naming `flag`
    when it is not a device, or a CUDA device when CUDA is not available (or has fewer
    devices than its index)."""
    if name is None or name == "":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"{flag}: {name!r} is not a torch device ({e})") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{flag} {name}: CUDA is not available here (torch "
                             f"{torch.__version__}, CUDA build {torch.version.cuda}); use "
                             f"{flag} cpu, or install a CUDA build of torch on a GPU machine")
        if device.index is None and "LOCAL_RANK" in os.environ:  # torchrun: this rank's GPU
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f"{flag} {device}: this machine has {count} CUDA device(s)")
        if device.index is not None:
            torch.cuda.set_device(device)
    elif device.type not in ("cpu", "meta"):
        try:
            torch.empty(0, device=device)
        except (RuntimeError, AssertionError) as e:
            raise ValueError(f"{flag} {name}: not usable here ({str(e).splitlines()[0]})"
                             ) from None
    return device


def distributed_backend(device: torch.device | str) -> str:
    """The torch.distributed backend for processes computing on `device`: NCCL on CUDA,
    gloo otherwise."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def fused_optimizer(device: torch.device | str) -> dict:
    """The keyword arguments that select AdamW's implementation for parameters on
    `device`: {"fused": True} on CUDA, {} (the default) elsewhere."""
    return {"fused": True} if torch.device(device).type == "cuda" else {}


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """x on `device`: from pinned memory without waiting for the copy on CUDA (a later
    op on the device's stream orders after it), a plain .to elsewhere."""
    if device.type == "cuda" and x.device.type == "cpu":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)
