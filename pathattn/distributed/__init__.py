"""Parallelism applied from outside the model (the model code stays unchanged).

* `context_parallel_path_attn`: context-parallel (ring) PaTH attention over
  torch.distributed (paper section 3.5), from `pathattn.ops.path.cp`, where the op lives;
* `context_parallel(model, group)`: runs every PaTH layer of an unchanged model on a
  sequence shard (`model_parallel.py`);
* `DistributedTraining`: data parallelism (DDP or FSDP2) with optional context parallelism
  for the trainer under torchrun (`data_parallel.py`); FSDP2 sharding plans in `fsdp.py`
  (`shard_model`, `shard_frozen` for a model that only runs forward, `register_shard_plan`
  for a model type called in its own way).

See docs/context_parallel.md.
"""

from ..ops.path.cp import context_parallel_path_attn
from .data_parallel import DP_MODES, DistributedTraining, init_from_env, replica_layout
from .fsdp import (
    full_state_dict,
    register_shard_plan,
    shard_frozen,
    shard_model,
    shard_units,
    transformer_blocks,
)
from .model_parallel import context_parallel, halo_exchange

__all__ = ["context_parallel_path_attn", "context_parallel", "halo_exchange",
           "DistributedTraining", "DP_MODES", "replica_layout", "init_from_env", "shard_model",
           "shard_frozen", "shard_units", "register_shard_plan", "transformer_blocks",
           "full_state_dict"]
