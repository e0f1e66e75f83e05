"""Parallelism applied from outside the model (STYLE point 9): context-parallel (ring) PaTH
attention over torch.distributed (paper section 3.5) and data-parallel training helpers."""

from .context_parallel import context_parallel_path_attn

__all__ = ["context_parallel_path_attn"]
