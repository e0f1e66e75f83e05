"""Point-to-point plumbing of the context-parallel ring: ranks of a process group, shard
metadata exchange with input checks, and tagged isend / irecv of lists of tensors.

Messages between one ordered pair of ranks are always posted in the same order on both
sides (gloo matches them by tag, NCCL by order).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["Ring", "ShardMeta", "exchange_meta"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class Ring:
    """Ranks of `group` (default: the world) in sequence order, with p2p helpers."""

    def __init__(self, group=None):
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("group: torch.distributed is not initialised; call "
                             "torch.distributed.init_process_group first (gloo on CPU, "
                             "nccl on GPU)")
        self.group = dist.group.WORLD if group is None else group
        self.rank = dist.get_rank(self.group)
        if self.rank < 0:
            raise ValueError("group: this process is not a member of the given group")
        self.size = dist.get_world_size(self.group)

    def _global(self, r: int) -> int:
        return dist.get_global_rank(self.group, r)

    def isend(self, tensors, dst: int, tag: int) -> list:
        """Send every tensor of `tensors` to group rank dst (tags tag, tag + 1, ...)."""
        return [dist.isend(t.contiguous(), self._global(dst), group=self.group, tag=tag + i)
                for i, t in enumerate(tensors)]

    def irecv(self, tensors, src: int, tag: int) -> list:
        """Receive into every tensor of `tensors` from group rank src."""
        return [dist.irecv(t, self._global(src), group=self.group, tag=tag + i)
                for i, t in enumerate(tensors)]

    @staticmethod
    def wait(works) -> None:
        for w in works:
            w.wait()


@dataclass(frozen=True)
class ShardMeta:
    """Sizes shared by all ranks and the shard length of every rank."""

    B: int
    HQ: int
    H: int
    D: int
    Dv: int
    lengths: tuple[int, ...]  # T of every rank's shard, in rank (= sequence) order


def exchange_meta(ring: Ring, q, k, v, g, scale: float, local_error: str | None) -> ShardMeta:
    """All-gather every rank's shapes, dtype, gate presence and scale, then check that they
    agree; every rank raises the same ValueError (no rank is left waiting in the ring)."""
    ok = local_error is None
    row = [float(ok)]
    if ok:
        B, T, HQ, D = q.shape
        row += [B, T, HQ, k.shape[2], D, v.shape[-1], _DTYPES.index(q.dtype),
                float(g is not None), scale]
    else:
        row += [0.0] * 9
    mine = torch.tensor(row, dtype=torch.float64, device=q.device if ok else "cpu")
    if not ok and dist.get_backend(ring.group) == "nccl":
        mine = mine.cuda()
    rows = [torch.empty_like(mine) for _ in range(ring.size)]
    dist.all_gather(rows, mine, group=ring.group)
    table = torch.stack(rows).cpu().tolist()
    if not ok:
        raise ValueError(local_error)
    bad = [r for r, x in enumerate(table) if not x[0]]
    if bad:
        raise ValueError(f"q, k, v, w, beta, g: invalid inputs on rank(s) {bad} of the group")
    names = {1: ("q", "batch size B"), 3: ("q", "number of query heads HQ"),
             4: ("k", "number of key/value heads H"), 5: ("q", "head dim D"),
             6: ("v", "value head dim Dv"), 7: ("q", "dtype"), 8: ("g", "presence (None or not)"),
             9: ("scale", "value")}
    for col, (name, what) in names.items():
        values = [x[col] for x in table]
        if len(set(values)) > 1:
            raise ValueError(f"{name}: {what} must be equal on every rank of the group, got "
                             f"{values} (rank order)")
    lengths = tuple(int(x[2]) for x in table)
    if min(lengths) < 1:
        raise ValueError(f"q: every rank must hold at least one token, got shard lengths "
                         f"{list(lengths)}")
    first = table[0]
    return ShardMeta(B=int(first[1]), HQ=int(first[3]), H=int(first[4]), D=int(first[5]),
                     Dv=int(first[6]), lengths=lengths)
