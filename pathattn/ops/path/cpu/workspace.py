"""The fused kernels' workspace: memory kept for reuse between calls.

The CPU op allocates the same large temporaries at every call (the UT transform's outputs,
the group tiles of the scans, the backward's accumulators). Taken from the system
allocator, each is fresh memory whose pages the operating system faults in and zeroes
again at each call; at T = 4096 that is tens of MB per forward + backward and costs about
as much as a pass over the data. The kernels therefore take blocks of 128 KiB and more
from a cache of blocks freed by earlier calls (the smallest cached block of the requested
size up to twice it: every layer of a model and every step of a run asks for the same
sizes, and other sequence lengths reuse them too), and a freed block goes back to the
cache.

The cache holds at most `limit_bytes` of free blocks (1 GiB by default; beyond it the
oldest freed blocks go back to the system). It never holds memory a live tensor uses: it
only keeps what the op would otherwise hand back. `set_workspace_limit(0)` turns caching
off; `release_workspace()` frees the cached blocks now.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .build import load_kernels

__all__ = ["WorkspaceInfo", "workspace_info", "set_workspace_limit", "release_workspace"]


class WorkspaceInfo(NamedTuple):
    cached_bytes: int  # free blocks held for reuse
    limit_bytes: int  # at most this many cached bytes
    hits: int  # requests served from the cache, since the process started
    misses: int  # requests that allocated new memory


def workspace_info() -> WorkspaceInfo:
    """The workspace's state (all zeros when the kernels are not built)."""
    if not load_kernels():
        return WorkspaceInfo(0, 0, 0, 0)
    return WorkspaceInfo(*torch.ops.pathattn_cpu.workspace_info())


def set_workspace_limit(n_bytes: int) -> None:
    """Keep at most n_bytes (an int >= 0) of freed blocks for reuse; 0 turns caching off.
    Cached blocks beyond the new limit are freed at once."""
    if isinstance(n_bytes, bool) or not isinstance(n_bytes, int) or n_bytes < 0:
        raise ValueError(f"n_bytes must be an int >= 0, got {n_bytes!r}")
    if load_kernels():
        torch.ops.pathattn_cpu.workspace_set_limit(n_bytes)


def release_workspace() -> None:
    """Free every cached block now (blocks in use by live tensors are not touched)."""
    if load_kernels():
        torch.ops.pathattn_cpu.workspace_release()
