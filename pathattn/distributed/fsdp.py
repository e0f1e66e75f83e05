"""Fully sharded data parallelism (FSDP2, `torch.distributed.fsdp.fully_shard`) applied to
an unchanged model from outside.

`shard_model(model, dtype)` shards each block of `model.layers` (a `PaTHLM`, or any model
whose transformer blocks are an `nn.ModuleList` named `layers`) as its own unit, then the
root (embeddings, final norm, LM head): a block's parameters are all-gathered just before
its forward and backward and freed after, gradients are reduce-scattered (averaged over
the ranks, as DDP does), and the optimizer holds only this rank's shards. The mesh is one
dimension over every rank of the default group, on CPU (gloo) or CUDA (NCCL).

Mixed precision: with dtype "bfloat16" the policy computes with bf16 parameters and
reduces gradients in float32, while the sharded master weights and the optimizer stay
float32; with "float32" nothing is cast, and the run equals the one-process run up to the
order of floating-point sums.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

__all__ = ["shard_model", "full_state_dict"]


def shard_model(model: nn.Module, dtype: str = "float32") -> nn.Module:
    """Shard `model` in place over the default process group (module docstring); returns
    it (its class becomes an FSDP subclass; forward and state_dict keys are unchanged)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"model: FSDP shards the blocks of `model.layers` (an "
                         f"nn.ModuleList); {type(model).__name__} has none")
    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if dtype == "bfloat16" else MixedPrecisionPolicy())
    for block in layers:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Collective: the unsharded state dict of a sharded model on rank 0 (CPU tensors), an
    empty dict on the other ranks."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))
