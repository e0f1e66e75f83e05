"""PaTH attention layers (paper section 2.2) and the RoPE / FoX / stick-breaking baselines,
each with a training `forward`, a `prefill` and a `decode`."""

from .baselines import FoXAttention, RoPEAttention, RoPECache
from .norm import RMSNorm
from .path_attention import LayerCache, PaTHAttention
from .rope import RotaryEmbedding
from .sba import SBAttention
from .short_conv import ShortConv

__all__ = ["PaTHAttention", "LayerCache", "RoPEAttention", "RoPECache", "FoXAttention",
           "SBAttention", "ShortConv", "RotaryEmbedding", "RMSNorm"]
