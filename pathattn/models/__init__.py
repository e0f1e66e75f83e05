"""Language models built from `pathattn.nn` layers: `ModelConfig` (one dataclass, named
presets) and the decoder-only `PaTHLM` with training, prefill and decode paths."""

from .config import ATTN_TYPES, PRESETS, ModelConfig
from .lm import IGNORE_INDEX, Block, ModelCache, PaTHLM, RMSNorm, SwiGLU

__all__ = ["ModelConfig", "PRESETS", "ATTN_TYPES", "PaTHLM", "ModelCache", "Block",
           "RMSNorm", "SwiGLU", "IGNORE_INDEX"]
