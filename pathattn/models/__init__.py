"""Language models built from `pathattn.nn` layers: `ModelConfig` (one dataclass, named
presets) and the decoder-only `PaTHLM` with training, prefill and decode paths."""

from .attention_types import (
    ATTN_TYPES,
    AttentionType,
    attention_type_names,
    get_attention_type,
    register_attention_type,
    unregister_attention_type,
)
from .config import PRESETS, ModelConfig
from .lm import IGNORE_INDEX, Block, ModelCache, PaTHLM, RMSNorm, SwiGLU

__all__ = ["ModelConfig", "PRESETS", "ATTN_TYPES", "PaTHLM", "ModelCache", "Block",
           "RMSNorm", "SwiGLU", "IGNORE_INDEX", "AttentionType", "register_attention_type",
           "unregister_attention_type", "get_attention_type", "attention_type_names"]
