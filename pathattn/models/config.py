"""`ModelConfig`: the one dataclass that describes a decoder-only language model of
`pathattn.models`, with named presets (`PRESETS`).

Field names follow Hugging Face's (LLaMA-style) configs, so the HF `PretrainedConfig` is a
thin adapter over this dataclass (`to_dict` / `from_dict`). Every block's attention layer
is the registered attention type `attn_type` names (`pathattn.models.attention_types`,
which lists them and where new types register). `w_rank`, `conv_size` and `beta_max` are
read by the PaTH types only, `rope_theta` by "rope" only; `qk_norm`, `qkv_bias` and
`o_bias` by all of them (the biases default to off, LLaMA's layout).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..ops.path.backends import check_backend_name
from ..utils import is_int, is_real
from .attention_types import ATTN_TYPES, get_attention_type

__all__ = ["ModelConfig", "PRESETS", "ATTN_TYPES"]

# name -> field values that differ from the defaults; `ModelConfig.preset(name, **over)`.
PRESETS: dict[str, dict[str, Any]] = {
    # unit tests: a few milliseconds per forward on a CPU
    "tiny": dict(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, w_rank=8,
                 max_position_embeddings=256),
    # flip-flop language modelling (paper, "Synthetic Tasks"): one layer, two heads, width
    # 64; vocab 5 is the flip-flop task's (w, r, i, 0, 1), override it for other tasks
    "fflm-1l": dict(vocab_size=5, hidden_size=64, intermediate_size=256,
                    num_hidden_layers=1, num_attention_heads=2, w_rank=32,
                    max_position_embeddings=2048),
    # language-model pretraining (`pathattn pretrain`); vocab_size is the tokenizer's.
    # cpu-tiny: tests and demos, minutes on 2 cores (about 0.3M parameters + embeddings)
    "cpu-tiny": dict(vocab_size=1024, hidden_size=64, intermediate_size=176,
                     num_hidden_layers=2, num_attention_heads=4, w_rank=16,
                     max_position_embeddings=256),
    # cpu-small: the CPU-scale comparison, about 20M parameters with an 8K vocab (tied)
    "cpu-small": dict(vocab_size=8192, hidden_size=512, intermediate_size=1024,
                      num_hidden_layers=6, num_attention_heads=8, w_rank=32,
                      max_position_embeddings=2048),
    # 760m: the paper's scale (section 4.2; GPU clusters). Our choice of shape: 24 layers,
    # width 1536, 24 heads of 64, SwiGLU 4096, 32K vocab, untied head, 4096 context:
    # about 780M parameters
    "760m": dict(vocab_size=32768, hidden_size=1536, intermediate_size=4096,
                 num_hidden_layers=24, num_attention_heads=24, w_rank=32,
                 tie_word_embeddings=False, max_position_embeddings=4096),
    # a GPT-2-small-sized model (about 110M parameters with the 32k vocab, tied)
    "small": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048,
                  num_hidden_layers=12, num_attention_heads=12, w_rank=32,
                  max_position_embeddings=2048),
}


@dataclass
class ModelConfig:
    """Decoder-only LM hyper-parameters (HF names). Validated on construction and by
    `validate()`; invalid values raise a ValueError that names the field.

    Args:
        vocab_size: V, token ids lie in [0, V).
        hidden_size: model width.
        intermediate_size: hidden width of the SwiGLU MLP.
        num_hidden_layers: number of blocks.
        num_attention_heads: HQ query heads.
        num_key_value_heads: H key/value heads (None = HQ, multi-head; HQ % H == 0).
        head_dim: D (None = hidden_size // num_attention_heads; must be even for "rope").
        max_position_embeddings: informational (HF compatibility), not enforced.
        rms_norm_eps: epsilon of every RMSNorm; tie_word_embeddings: LM head = embedding.
        attn_type: a registered attention type (`ATTN_TYPES`).
        w_rank, conv_size: rank of PaTH's w projection (None or 0: full rank), kernel size
            of its short convolution (paper: 3).
        qk_norm: per-head RMSNorm of q and k.
        beta_max: PaTH's beta = beta_max * sigmoid(.), in (0, 2]; use < 2 for bf16.
        rope_theta: RoPE base ("rope").
        initializer_range: std of the normal init of linear and embedding weights.
        qkv_bias, o_bias: biases on the q, k, v and on the output projections.
        backend: the PaTH op's backend ("auto" or a registered name).
        num_reflections: R >= 1 Householder reflections per token and key/value head in
            the PaTH types (1: the paper's PaTH).
    """

    vocab_size: int = 32000
    hidden_size: int = 768
    intermediate_size: int = 2048
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    attn_type: str = "path"
    w_rank: int | None = 32
    conv_size: int = 3
    qk_norm: bool = False
    beta_max: float = 2.0
    rope_theta: float = 10000.0
    initializer_range: float = 0.02
    qkv_bias: bool = False
    o_bias: bool = False
    backend: str = "auto"
    num_reflections: int = 1

    def __post_init__(self):
        self.validate()

    # ------------------------------------------------------------------------ checks

    def validate(self) -> ModelConfig:
        """Raise ValueError naming the first invalid field; return self when valid."""
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "max_position_embeddings", "conv_size",
                     "num_reflections"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for name in ("num_key_value_heads", "head_dim"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value < 1):
                raise ValueError(f"{name} must be None or a positive int, got {value!r}")
        if self.w_rank is not None and (not is_int(self.w_rank) or self.w_rank < 0):
            raise ValueError(f"w_rank must be None or a non-negative int, got {self.w_rank!r}")
        for name in ("rms_norm_eps", "rope_theta", "initializer_range"):
            value = getattr(self, name)
            if not is_real(value) or not value > 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if not is_real(self.beta_max) or not 0 < self.beta_max <= 2:
            raise ValueError(f"beta_max must be a number in (0, 2], got {self.beta_max!r}")
        for name in ("tie_word_embeddings", "qk_norm", "qkv_bias", "o_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        attn = get_attention_type(self.attn_type)  # ValueError naming the registered types
        check_backend_name(self.backend)
        HQ, H = self.num_attention_heads, self.kv_heads
        if HQ % H:
            raise ValueError(f"num_key_value_heads={H} must divide num_attention_heads={HQ} "
                             "(GQA / MQA)")
        if self.head_dim is None and self.hidden_size % HQ:
            raise ValueError(f"head_dim: hidden_size={self.hidden_size} is not divisible by "
                             f"num_attention_heads={HQ}; pass head_dim explicitly")
        if attn.check is not None:
            attn.check(self)
        return self

    # -------------------------------------------------------------- derived quantities

    @property
    def kv_heads(self) -> int:
        """H: num_key_value_heads, or num_attention_heads when None."""
        return self.num_attention_heads if self.num_key_value_heads is None else \
            self.num_key_value_heads

    @property
    def head_size(self) -> int:
        """D: head_dim, or hidden_size // num_attention_heads when None."""
        return self.hidden_size // self.num_attention_heads if self.head_dim is None else \
            self.head_dim

    # ------------------------------------------------------------- dicts and presets

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every field (JSON-serialisable)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Inverse of `to_dict`; unknown keys raise ValueError (missing keys take the
        defaults)."""
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown ModelConfig field(s): {unknown}")
        return cls(**d)

    @classmethod
    def preset(cls, name: str, **overrides) -> ModelConfig:
        """The preset `name` of `PRESETS` ("tiny", "fflm-1l", "small"), with field
        overrides, e.g. `ModelConfig.preset("fflm-1l", vocab_size=8, attn_type="rope")`."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; presets: {sorted(PRESETS)}")
        return cls.from_dict({**PRESETS[name], **overrides})
