"""What the machine allows, checked before any work: whether a size can be allocated at all,
and child processes that do not outlive their parent.

Sizes (`check_fits_memory`): a command that would allocate more than the machine's
physical memory (or the device's, for CUDA) in one go is refused up front with the sizes
named, instead of failing after minutes of work, being killed by the kernel's OOM killer,
or aborting inside a native library. The check is a floor, not an estimate of the peak: it
refuses only what cannot fit.

Worker processes (`die_with_parent`): a worker calls it first; on Linux it asks the kernel
to SIGKILL it when its parent dies (prctl PR_SET_PDEATHSIG), elsewhere a daemon thread
polls the parent's pid; either way a parent killed with SIGKILL leaves no worker behind
(nor the multiprocessing resource tracker, which exits once the workers' pipes close).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import threading
import time

__all__ = ["physical_memory", "check_fits_memory", "die_with_parent", "GIB"]

GIB = 2 ** 30
_PR_SET_PDEATHSIG = 1


def physical_memory(device=None) -> int | None:
    """Bytes of memory of `device` (a torch device or None = the CPU's RAM); None when
    unknown."""
    if device is not None and getattr(device, "type", str(device)).startswith("cuda"):
        import torch

        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits_memory(nbytes: float, what: str, device=None) -> None:
    """ValueError "<what> needs at least X GiB, more than the N GiB of memory of this
    machine" when nbytes exceed `physical_memory(device)` (nothing when unknown)."""
    total = physical_memory(device)
    if total is not None and nbytes > total:
        where = "this machine" if device is None else f"device {device}"
        raise ValueError(f"{what} needs at least {nbytes / GIB:,.1f} GiB, more than the "
                         f"{total / GIB:,.1f} GiB of memory of {where}")


def _watch_parent(parent_pid: int, interval: float) -> None:
    while os.getppid() == parent_pid:
        time.sleep(interval)
    os._exit(1)


def die_with_parent(parent_pid: int, interval: float = 1.0) -> None:
    """Make this process end when the process `parent_pid` (its parent) ends (module
    docstring); exits at once when the parent is already gone."""
    libc_name = ctypes.util.find_library("c") if os.name == "posix" else None
    armed = False
    if libc_name and os.uname().sysname == "Linux":
        try:
            libc = ctypes.CDLL(libc_name, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)
    if not armed:
        threading.Thread(target=_watch_parent, args=(parent_pid, interval),
                         daemon=True).start()
