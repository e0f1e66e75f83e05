"""Fully sharded data parallelism (FSDP2, `torch.distributed.fsdp.fully_shard`) applied to
an unchanged model from outside.

`shard_model(model, dtype)` shards the model by its plan. The default plan shards each
block of the model's transformer layers (`transformer_blocks`: `model.layers` of a
`PaTHLM`, `model.model.layers` of a Hugging Face causal LM, or any single `nn.ModuleList`
named `layers` in the tree) as its own unit, then the root (embeddings, final norm, LM
head): a block's parameters are all-gathered just before its forward and backward and
freed after, gradients are reduce-scattered (averaged over the ranks, as DDP does), and
the optimizer holds only this rank's shards. A model type that is called in another way
registers its own plan (`register_shard_plan`; the distillation model of
`pathattn.convert` does: its student's attention layers are called on their own in stage
1, and its teacher is sharded too). The mesh is one dimension over every rank of the
default group, on CPU (gloo) or CUDA (NCCL).

`shard_frozen(model, dtype)` shards a model that is only run forward (a distillation
teacher): the same units, gradients off, eval mode, and the root's parameters freed after
every forward as well (FSDP keeps a training root's parameters gathered for the backward
that follows; a frozen model has none), so a rank holds 1 / P of the model plus the one
block being computed.

Mixed precision: with dtype "bfloat16" the policy computes with bf16 parameters and
reduces gradients in float32, while the sharded master weights and the optimizer stay
float32; with "float32" nothing is cast, and the run equals the one-process run up to the
order of floating-point sums.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn

__all__ = ["shard_model", "shard_frozen", "shard_units", "register_shard_plan",
           "transformer_blocks", "full_state_dict"]

_PLANS: dict[type, Callable[[nn.Module, str], None]] = {}


def register_shard_plan(model_cls: type):
    """Decorator: `plan(model, dtype)` shards models of type model_cls (and subclasses) in
    place for `shard_model`, typically by `shard_units` and `shard_frozen`."""
    def wrap(plan):
        _PLANS[model_cls] = plan
        return plan
    return wrap


def transformer_blocks(model: nn.Module) -> nn.ModuleList:
    """The model's transformer blocks: `model.layers` when it is an `nn.ModuleList`, else
    the one `nn.ModuleList` named `layers` in its tree (ValueError when there is none or
    several)."""
    layers = getattr(model, "layers", None)
    if isinstance(layers, nn.ModuleList):
        return layers
    found = [name for name, m in model.named_modules()
             if name.rsplit(".", 1)[-1] == "layers" and isinstance(m, nn.ModuleList)]
    if len(found) != 1:
        raise ValueError(f"model: FSDP shards the blocks of an nn.ModuleList named `layers`; "
                         f"{type(model).__name__} has {len(found)} ({found})")
    return model.get_submodule(found[0])


def _policy(dtype: str):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    if dtype == "bfloat16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def _mesh(model: nn.Module):
    from torch.distributed.device_mesh import init_device_mesh

    device = next(model.parameters()).device
    return init_device_mesh(device.type, (dist.get_world_size(),))


def shard_units(root: nn.Module, units: Sequence[nn.Module], dtype: str = "float32", *,
                reshard_root: bool | None = None) -> nn.Module:
    """`fully_shard` each module of `units` (inner ones before the modules holding them),
    then `root`, over every rank, with the dtype's mixed-precision policy (module
    docstring). reshard_root: free the root's parameters after each forward (None: FSDP's
    choice, kept for the backward). Returns root."""
    from torch.distributed.fsdp import fully_shard

    mesh, policy = _mesh(root), _policy(dtype)
    for unit in units:
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    fully_shard(root, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_root)
    return root


def shard_model(model: nn.Module, dtype: str = "float32") -> nn.Module:
    """Shard `model` in place over the default process group by its registered plan, or
    the default one (module docstring); returns it (its class becomes an FSDP subclass;
    forward and state_dict keys are unchanged)."""
    _policy(dtype)  # a bad dtype fails before anything is sharded
    plan = next((_PLANS[c] for c in type(model).__mro__ if c in _PLANS), None)
    if plan is not None:
        plan(model, dtype)
        return model
    return shard_units(model, list(transformer_blocks(model)), dtype)


def shard_frozen(model: nn.Module, dtype: str = "float32") -> nn.Module:
    """Shard a model that only runs forward (module docstring): eval mode, no gradients,
    each of its `transformer_blocks` a unit, the root resharded after every forward.
    Returns it."""
    model.eval().requires_grad_(False)
    return shard_units(model, list(transformer_blocks(model)), dtype, reshard_root=True)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Collective: the unsharded state dict of a sharded model on rank 0 (CPU tensors), an
    empty dict on the other ranks."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))
