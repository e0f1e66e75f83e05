"""`PaTHConfig`: the Hugging Face config of pathattn's language model, a thin adapter over
`pathattn.models.ModelConfig`, which decides every model fact once.

Every `ModelConfig` field is a config attribute of the same name and default (vocab_size,
hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
head_dim, max_position_embeddings, rms_norm_eps, tie_word_embeddings, attn_type, w_rank,
conv_size, qk_norm, beta_max, rope_theta, initializer_range, qkv_bias, o_bias, backend,
num_reflections); the values are validated by `ModelConfig` on construction (ValueError
naming the field). The usual HF fields (use_cache, pad / bos / eos token ids, ...) pass
through to `PreTrainedConfig`.

Saving writes config.json with pathattn's `auto_map` and the modules it names beside it
(`pathattn.hf.export`), so that a saved folder loads by name with
`trust_remote_code=True` in a process that never imported pathattn.
"""

from __future__ import annotations

import dataclasses
import os

from transformers import PreTrainedConfig

from ..models import ModelConfig
from .export import AUTO_MAP, write_remote_code

__all__ = ["PaTHConfig", "MODEL_TYPE"]

MODEL_TYPE = "pathattn"
_FIELDS = {f.name: f.default for f in dataclasses.fields(ModelConfig)}


class PaTHConfig(PreTrainedConfig):
    """HF config of `PaTHForCausalLM` (model_type "pathattn").

    Args:
        use_cache: return a `PaTHGenerationCache` from forward passes in eval mode (the
            default for generate()).
        **kwargs: `ModelConfig` fields (module docstring; unspecified ones take
            ModelConfig's defaults) and `PreTrainedConfig` options.

    Example: `PaTHConfig(vocab_size=32000, hidden_size=512, num_hidden_layers=8,
    num_attention_heads=8, attn_type="path_fox")`, or `PaTHConfig.from_model_config(cfg)`.
    """

    model_type = MODEL_TYPE
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(self, use_cache: bool = True, **kwargs):
        fields = {name: kwargs.pop(name, default) for name, default in _FIELDS.items()}
        ModelConfig(**fields)  # validates, ValueError naming the field
        super().__init__(**kwargs)
        for name, value in fields.items():  # after super(): it sets its own defaults
            setattr(self, name, value)
        self.use_cache = use_cache
        self.auto_map = dict(AUTO_MAP)  # pathattn's modules, whatever a loaded file said

    def save_pretrained(self, save_directory: str | os.PathLike, push_to_hub: bool = False,
                        **kwargs) -> None:
        """`PreTrainedConfig.save_pretrained`, then the modules that config.json's auto_map
        names, beside it (`pathattn.hf.export.write_remote_code`)."""
        super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)
        write_remote_code(save_directory)

    @classmethod
    def register_for_auto_class(cls, auto_class: str = "AutoConfig") -> None:
        """Nothing to do: every save already writes pathattn's auto_map and modules.
        (transformers calls this after loading remote code; its own version would copy
        this package's source files into the next folder saved.)"""

    def to_model_config(self) -> ModelConfig:
        """The `ModelConfig` of this config's fields (validated)."""
        return ModelConfig(**{name: getattr(self, name) for name in _FIELDS})

    @classmethod
    def from_model_config(cls, config: ModelConfig, **kwargs) -> PaTHConfig:
        """A PaTHConfig with `config`'s fields, plus HF options in kwargs."""
        if not isinstance(config, ModelConfig):
            raise ValueError(f"config must be a ModelConfig, got {type(config).__name__}")
        return cls(**config.to_dict(), **kwargs)
