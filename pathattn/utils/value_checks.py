"""Where the value checks of a decode step run: on the host or on the device.

A check of a tensor's values (ids in [0, V), a mask of 0 / 1) reads them on the host. On
the CPU that costs a memory read; on a GPU it makes the host wait until the device has
computed them, once per check, which at one token per step stalls the launch queue every
token. So the per-token paths (the decode steps of the models and layers) ask
`checks_on_host(device)`:

    True  (CPU)          the values are read and a bad one raises a ValueError at the call,
                         as at every entry point;
    False (GPU, other)   the shapes, dtypes and devices are still checked on the host, the
                         values by `assert_on_device` (torch._assert_async): no host
                         synchronisation; a bad value stops the process with a device-side
                         assertion carrying the message (an out-of-range id would trigger
                         one in the embedding anyway, without naming the argument).

Prompts, training batches and every other entry point keep the host checks on every
device: they run once per call, not once per token. `device_side_checks()` makes the CPU
take the device's path (tests use it to prove that a GPU decode step never reads a value
on the host; `HostReads` records the reads); a bad value then raises a RuntimeError.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["checks_on_host", "device_side_checks", "assert_on_device", "mask_on_device"]

_forced = 0  # > 0 inside device_side_checks()


def checks_on_host(device: torch.device) -> bool:
    """Whether a decode step checks the values of tensors on `device` on the host (module
    docstring): True on the CPU outside `device_side_checks()`, False elsewhere."""
    return torch.device(device).type == "cpu" and _forced == 0


@contextlib.contextmanager
def device_side_checks():
    """Within this context, decode steps on the CPU check values as on a GPU (no host
    read; a bad value raises a RuntimeError from torch._assert_async)."""
    global _forced
    _forced += 1
    try:
        yield
    finally:
        _forced -= 1


def assert_on_device(ok: torch.Tensor, message: str) -> None:
    """ok (a bool tensor with one element) must be True: checked by the device, in order
    with the work queued before it, without the host waiting for it."""
    torch._assert_async(ok, message)


BINARY = "attention_mask must hold only 0 (masked) and 1 (token)"


def mask_on_device(mask, B: int, T: int, device) -> torch.Tensor:
    """A decode step's attention_mask [B, T] (1 = token, 0 = masked) -> bool [B, T], its
    values checked on the device (a bool mask needs no check). Type, shape, dtype and device
    are checked on the host: ValueError naming attention_mask, with the messages of the
    host-side check of the masks (`pathattn.ops.common.padding.check_attention_mask`)."""
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != (B, T):
        shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"attention_mask must be a tensor of shape [B, T] = {(B, T)}, "
                         f"got {shape}")
    if mask.dtype.is_complex or mask.dtype.is_floating_point:
        raise ValueError(f"attention_mask must be bool or integer (1 = token, 0 = masked), "
                         f"got {mask.dtype}")
    if mask.device != torch.device(device):
        raise ValueError(f"attention_mask is on {mask.device} but q is on {device}")
    if mask.dtype == torch.bool:
        return mask
    assert_on_device(((mask == 0) | (mask == 1)).all(), BINARY)
    return mask.bool()
