"""Context-parallel (ring) PaTH attention over torch.distributed (paper section 3.5):
`context_parallel_path_attn` (`attention`), its per-shard pieces (`shard`) and the
point-to-point ring (`Ring`, `ring`) that model wrappers also use for halo exchanges."""

from .attention import context_parallel_path_attn
from .ring import Ring

__all__ = ["context_parallel_path_attn", "Ring"]
