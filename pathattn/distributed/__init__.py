"""Parallelism applied from outside the model (the model code stays unchanged).

* `context_parallel_path_attn`: context-parallel (ring) PaTH attention over
  torch.distributed (paper section 3.5), in `context_parallel.py` (per-shard pieces in
  `shard.py`, point-to-point plumbing in `ring.py`);
* `context_parallel(model, group)`: runs every PaTH layer of an unchanged model on a
  sequence shard (`model_parallel.py`);
* `DistributedTraining`: data parallelism (DDP or FSDP2) with optional context parallelism
  for the trainer under torchrun (`data_parallel.py`, FSDP2 sharding in `fsdp.py`).

See docs/context_parallel.md.
"""

from .context_parallel import context_parallel_path_attn
from .data_parallel import DP_MODES, DistributedTraining, replica_layout
from .fsdp import full_state_dict, shard_model
from .model_parallel import context_parallel, halo_exchange

__all__ = ["context_parallel_path_attn", "context_parallel", "halo_exchange",
           "DistributedTraining", "DP_MODES", "replica_layout", "shard_model",
           "full_state_dict"]
