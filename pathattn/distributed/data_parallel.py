"""Data- and context-parallel training of an unchanged model under torchrun (applied from
outside the model).

`DistributedTraining.from_env(model, context_parallel=N)` reads torchrun's environment
(WORLD_SIZE, RANK, MASTER_ADDR / MASTER_PORT), initialises the default process group
(gloo on CPU, NCCL on CUDA) and lays the W ranks out as a grid of W / N data-parallel
replicas times N context-parallel ranks (rank = replica * N + shard):

* every rank draws the same global batch [B, T] from the seeded stream (so the data are
  exactly those of a single-process run) and keeps its rows (`torch.tensor_split` of B
  over the replicas) and its sequence shard (`tensor_split` of T over the N ranks of its
  context-parallel group);
* the model is wrapped in DistributedDataParallel over all W ranks (`dp="ddp"`) or
  sharded over them with FSDP2 (`dp="fsdp"`, `pathattn.distributed.fsdp`), and run inside
  `context_parallel(model, group)` when N > 1;
* the model is any module whose forward takes the micro-batch's keyword arguments
  (input_ids, labels [b, t], ...) and returns (logits or None, loss), with loss the mean
  of a per-token loss over this rank's scored positions (labels != -100): a `PaTHLM`'s
  cross-entropy, or a distillation loss (`pathattn.convert.DistillModel`). The loop's
  single-process rule for micro-batches applies across ranks: a rank's loss counts in
  proportion to its n_r scored positions. The objective each rank back-propagates is
  loss * n_r * W / n, with n the number of scored targets of the *global* batch (known to
  every rank): DDP and FSDP average the W gradients, so the update is the gradient of the
  global batch's mean loss over scored tokens, as in the single-process run (not a mean
  of per-rank means, which would weight tokens differently when ranks score different
  numbers of targets). The logged loss is the all-reduced sum of loss * n_r, over n. A
  rank without a scored position still runs its forward and backward (every rank takes
  part in the gradient reduction), with one position scored and weight 0.

Data that each rank reads itself (pretraining: `pathattn.data.TokenLoader`) is split over
the W / N replicas by `replica_layout`; the N ranks of a replica read the same rows and keep
their sequence shard (`shard_loss`).

Only rank 0 (`is_main`) writes logs and metrics, and checkpoints unless the model is sharded
(then every rank writes its shards); see `pathattn.train.Trainer`.
"""

from __future__ import annotations

import contextlib
import datetime
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..models import IGNORE_INDEX
from ..utils.device import distributed_backend
from .model_parallel import context_parallel

__all__ = ["DistributedTraining", "torchrun_world_size", "replica_layout", "DP_MODES",
           "init_from_env"]


def torchrun_world_size() -> int:
    """WORLD_SIZE of the environment (1 outside torchrun)."""
    value = os.environ.get("WORLD_SIZE", "1")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"WORLD_SIZE: expected an int, got {value!r}") from None


def replica_layout(context_parallel: int = 1) -> tuple[int, int, int, int]:
    """(replica index, replicas, shard index, shards) of this process in the grid of the
    module docstring: rank = replica * context_parallel + shard. Outside torchrun (0, 1,
    0, 1). Data that each rank reads itself (`pathattn.data.TokenLoader`) is split over the
    replicas; the ranks of a replica read the same rows and split their tokens."""
    cp = context_parallel
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
        raise ValueError(f"context_parallel must be a positive int, got {cp!r}")
    if dist.is_initialized():
        world, rank = dist.get_world_size(), dist.get_rank()
    else:
        world = torchrun_world_size()
        rank = int(os.environ.get("RANK", "0")) if world > 1 else 0
    if world == 1 and cp > 1:
        raise ValueError(f"context_parallel={cp} needs as many processes (launch with "
                         "torchrun --nproc_per_node ...)")
    if world % cp:
        raise ValueError(f"context_parallel must divide the world size {world}, got {cp}")
    dp_rank, cp_rank = divmod(rank, cp)
    return dp_rank, world // cp, cp_rank, cp


def init_from_env(device: torch.device | str = "cpu") -> bool:
    """Under torchrun (WORLD_SIZE > 1): initialise the default process group from its
    variables unless it is already (gloo on CPU, NCCL on CUDA); returns whether this is a
    multi-process run. For commands that coordinate ranks around the training loop
    (`pathattn convert` between its stages)."""
    if dist.is_initialized():
        return dist.get_world_size() > 1
    if torchrun_world_size() <= 1:
        return False
    _init_from_env(torch.device(device))
    return True


def _launched_by_torchrun() -> bool:
    """Whether torchrun's variables are set (a one-process torchrun run included: FSDP2 on
    one rank, to compare with the plain run)."""
    return all(k in os.environ for k in ("RANK", "MASTER_ADDR", "MASTER_PORT",
                                         "WORLD_SIZE"))


def _init_from_env(device: torch.device) -> None:
    if dist.is_initialized():
        return
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise ValueError(f"WORLD_SIZE > 1 but {missing} not set: launch with torchrun")
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)  # NCCL's communicators bind to the current device
    dist.init_process_group(distributed_backend(device),
                            timeout=datetime.timedelta(minutes=30))


DP_MODES = ("ddp", "fsdp")


class DistributedTraining:
    """Data parallelism (DDP or FSDP2) and optional context parallelism for one model; see
    the module docstring. Build with `from_env`.

    Args:
        model: the model (unchanged; FSDP shards its parameters in place).
        context_parallel: ranks sharing each sequence (a divisor of the world size).
        dp: "ddp" (`DistributedDataParallel`: every rank holds the whole model) or "fsdp"
            (`pathattn.distributed.fsdp.shard_model`: by default `fully_shard` of each
            transformer block, then of the root; parameters, gradients and optimizer state
            sharded over all ranks, gathered per block for its forward and backward).
        dtype: "bfloat16" gives FSDP a mixed-precision policy (bf16 parameters in compute,
            float32 gradient reduction, float32 master weights); ignored by DDP, which
            runs under the loop's autocast.
    """

    def __init__(self, model: torch.nn.Module, context_parallel: int = 1, dp: str = "ddp",
                 dtype: str = "float32"):
        if not dist.is_initialized():
            raise ValueError("group: torch.distributed is not initialised")
        if dp not in DP_MODES:
            raise ValueError(f"dp must be one of {DP_MODES}, got {dp!r}")
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        self.dp_rank, self.dp, self.cp_rank, self.cp = replica_layout(context_parallel)
        self.cp_group = None
        if self.cp > 1:  # every rank creates every group, in the same order
            for d in range(self.dp):
                group = dist.new_group(list(range(d * self.cp, (d + 1) * self.cp)))
                if d == self.dp_rank:
                    self.cp_group = group
        self.mode = dp
        self.module = model
        if dp == "fsdp":
            from .fsdp import shard_model

            self.ddp = shard_model(model, dtype)
        else:
            self.ddp = DistributedDataParallel(model) if self.world_size > 1 else model

    @property
    def sharded(self) -> bool:
        """Whether parameters are sharded (FSDP): every rank must take part in each forward,
        and checkpoints are written by every rank (`pathattn.train.sharded_checkpoint`)."""
        return self.mode == "fsdp"

    @classmethod
    def from_env(cls, model: torch.nn.Module, context_parallel: int = 1,
                 device: torch.device | str = "cpu", dp: str = "ddp",
                 dtype: str = "float32") -> DistributedTraining | None:
        """None in a single process (WORLD_SIZE unset or 1, context_parallel 1, dp "ddp");
        otherwise initialises the process group from torchrun's variables (once) and wraps
        model."""
        world = torchrun_world_size()
        if world <= 1 and context_parallel == 1 and dp == "ddp":
            return None
        if world <= 1 and not dist.is_initialized() and not _launched_by_torchrun():
            if context_parallel != 1:
                raise ValueError(f"context_parallel={context_parallel} needs as many "
                                 "processes (launch with torchrun --nproc_per_node ...)")
            raise ValueError(f"dp={dp!r} needs torch.distributed (launch with torchrun "
                             "--nproc_per_node ...)")
        _init_from_env(torch.device(device))
        return cls(model, context_parallel, dp, dtype)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's rows and sequence shard of a global [B, T] batch tensor."""
        B, T = x.shape[:2]
        if B < self.dp or T < self.cp:
            raise ValueError(f"batch_size: a global batch [B={B}, T={T}] cannot be split "
                             f"over {self.dp} replicas x {self.cp} sequence shards")
        rows = torch.tensor_split(x, self.dp, dim=0)[self.dp_rank]
        return torch.tensor_split(rows, self.cp, dim=1)[self.cp_rank]

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """Global batch tokens, targets [B, T] -> (loss, objective): loss is the global
        batch's mean loss over scored targets (detached, equal on every rank), objective the
        tensor this rank back-propagates (module docstring)."""
        n = int((targets != IGNORE_INDEX).sum())
        tok, tgt = self.shard(tokens), self.shard(targets)
        cp = (context_parallel(self.module, self.cp_group) if self.cp > 1
              else contextlib.nullcontext())
        return self._weighted({"input_ids": tok, "labels": tgt}, n, cp)

    def shard_loss(self, inputs: dict[str, torch.Tensor], global_scored: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """A micro-batch already cut to this replica's rows (the model's forward arguments:
        input_ids, labels [b, T], optionally cu_seqlens) and the number of scored targets of
        the global micro-batch over all replicas -> (the micro-batch's mean loss over those
        targets, all-reduced and detached; the objective this rank back-propagates): the
        same weighting as `loss` (module docstring), for data that each replica reads itself
        (`pathattn.data.TokenLoader` over `replica_layout`). Under context parallelism each
        rank keeps its sequence shard of the rows (plain windows only: packed rows would
        need the ring to know the documents)."""
        inputs = dict(inputs)
        cp = contextlib.nullcontext()
        if self.cp > 1:
            if inputs.get("cu_seqlens") is not None:
                raise ValueError("cu_seqlens: context parallelism takes plain windows "
                                 "(--packing windows), not packed documents")
            T = inputs["input_ids"].shape[1]
            if T < self.cp:
                raise ValueError(f"seq_len: rows of {T} tokens cannot be split over "
                                 f"{self.cp} sequence shards")
            for key in ("input_ids", "labels"):  # [b, T / cp]
                inputs[key] = torch.tensor_split(inputs[key], self.cp, dim=1)[self.cp_rank]
            cp = context_parallel(self.module, self.cp_group)
        return self._weighted(inputs, int(global_scored), cp)

    def _weighted(self, inputs: dict[str, torch.Tensor], n_global: int, cp
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """(global mean loss, this rank's objective) of this rank's part `inputs` of a
        batch with n_global scored targets (module docstring)."""
        labels = inputs["labels"]
        n = int((labels != IGNORE_INDEX).sum())
        if n == 0:  # a mean over nothing is NaN: score one position, with weight 0
            labels = labels.clone()
            labels.view(-1)[0] = inputs["input_ids"].reshape(-1)[0]
            inputs = {**inputs, "labels": labels}
        with cp:
            _, loss = self.ddp(**inputs)
        local = loss.float() * n  # this rank's sum of per-token losses
        summed = local.detach().clone()
        dist.all_reduce(summed)
        denom = max(n_global, 1)  # no scored target: zero objective (single process: NaN)
        mean = summed / denom if n_global else summed * float("nan")
        return mean, local * (self.world_size / denom)

    def barrier(self) -> None:
        dist.barrier()

    def close(self) -> None:
        """Wait for every rank, then tear the process group down."""
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
