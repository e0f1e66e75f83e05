"""The registry of attention types: `ModelConfig.attn_type` names one of them, and every
block of a model asks the registry for its attention layer.

Registered here:

    "path"      PaTHAttention (paper section 2.2)
    "path_fox"  PaTHAttention with forget gates (PaTH-FoX, section 2.2)
    "rope"      RoPEAttention (section 2.1 baseline)
    "fox"       FoXAttention (Forgetting Transformer baseline)
    "sba"       SBAttention (stick-breaking attention baseline, Tan et al. 2024)

A new type is one layer module plus one `register_attention_type` call; the model, the
Hugging Face adapter, the trainers and their command-line choices (`ATTN_TYPES`, a live
view of the registry) pick it up from there. The layer must offer the interface of
`PaTHAttention`: `forward(x, cu_seqlens)`, `prefill(x, attention_mask, history) -> (y,
cache)`, `decode(x, cache, mask)` (a mask's zeros, anywhere, remove their tokens),
`attention_weights(x, attention_mask)` and `step_attention_weights(x, cache, mask)`; the
cache with `__len__`, `key_mask`, `min_len`, `reorder(index)` and `truncate(n)` (any n >=
min_len; min_len 0 after a prefill with history). `tests/nn/test_layer_contract.py` checks
every registered type against this contract.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch.nn as nn

from ..nn import FoXAttention, PaTHAttention, RoPEAttention, SBAttention

if TYPE_CHECKING:
    from .config import ModelConfig

__all__ = ["AttentionType", "register_attention_type", "unregister_attention_type",
           "get_attention_type", "attention_type_names", "ATTN_TYPES"]


@dataclass(frozen=True)
class AttentionType:
    """A registered attention type.

    name: the `ModelConfig.attn_type` value.
    build: config -> the attention layer of one block, with the config's sizes.
    check: None or config -> None, raising ValueError naming the field for a config this
        type cannot build (run by `ModelConfig.validate`).
    description: one line for listings.
    """

    name: str
    build: Callable[[ModelConfig], nn.Module]
    check: Callable[[ModelConfig], None] | None = None
    description: str = ""


_REGISTRY: dict[str, AttentionType] = {}


def register_attention_type(name: str, build: Callable[[ModelConfig], nn.Module], *,
                            check: Callable[[ModelConfig], None] | None = None,
                            description: str = "", replace: bool = False) -> AttentionType:
    """Register attention type `name` (see `AttentionType`); registering a taken name
    raises ValueError unless replace=True. Returns the entry."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name must be an identifier-like string, got {name!r}")
    if not callable(build):
        raise ValueError(f"build must be callable (config -> layer), got {build!r}")
    if check is not None and not callable(check):
        raise ValueError(f"check must be callable or None, got {check!r}")
    if name in _REGISTRY and not replace:
        raise ValueError(f"attention type {name!r} is already registered (replace=True to "
                         "override it)")
    entry = AttentionType(name, build, check, description)
    _REGISTRY[name] = entry
    return entry


def unregister_attention_type(name: str) -> AttentionType:
    """Remove `name` from the registry (a plugin or test undoing its registration); returns
    the removed entry, ValueError when it is not registered."""
    entry = get_attention_type(name)
    del _REGISTRY[name]
    return entry


def get_attention_type(name: str) -> AttentionType:
    """The registered entry `name`; ValueError naming the registered types otherwise."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"attn_type must be one of {attention_type_names()}, got "
                         f"{name!r}") from None


def attention_type_names() -> tuple[str, ...]:
    """The registered names, in registration order."""
    return tuple(_REGISTRY)


class AttentionTypeNames(Sequence):
    """A read-only, always current view of the registered names: behaves as the tuple
    `attention_type_names()` (`in`, iteration, indexing, len, ==, repr), so it serves
    directly as the `choices` of a command-line flag."""

    def __getitem__(self, index):
        return attention_type_names()[index]

    def __len__(self) -> int:
        return len(_REGISTRY)

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and name in _REGISTRY

    def __iter__(self):
        return iter(attention_type_names())

    def __eq__(self, other) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, Sequence) else other)

    def __hash__(self):
        return hash(attention_type_names())

    def __repr__(self) -> str:
        return repr(attention_type_names())


ATTN_TYPES = AttentionTypeNames()


# ----------------------------------------------------------------- built-in types


def _common(config: ModelConfig) -> dict:
    """The layer arguments every type shares."""
    return dict(hidden_size=config.hidden_size, num_heads=config.num_attention_heads,
                num_kv_heads=config.num_key_value_heads, head_dim=config.head_dim,
                qk_norm=config.qk_norm, norm_eps=config.rms_norm_eps,
                bias=config.qkv_bias, o_bias=config.o_bias)


def _path(forget_gate: bool) -> Callable[[ModelConfig], nn.Module]:
    def build(config: ModelConfig) -> nn.Module:
        return PaTHAttention(**_common(config), w_rank=config.w_rank,
                             conv_size=config.conv_size, use_forget_gate=forget_gate,
                             beta_max=config.beta_max, backend=config.backend,
                             num_reflections=config.num_reflections)
    return build


def _check_rope(config: ModelConfig) -> None:
    if config.head_size % 2:
        raise ValueError(f"head_dim must be even for attn_type='rope', got {config.head_size}")


register_attention_type("path", _path(False), description="PaTH attention")
register_attention_type("path_fox", _path(True), description="PaTH attention with forget gates")
register_attention_type(
    "rope", lambda c: RoPEAttention(**_common(c), rope_base=c.rope_theta), check=_check_rope,
    description="softmax attention with rotary embeddings")
register_attention_type("fox", lambda c: FoXAttention(**_common(c)),
                        description="Forgetting Transformer attention")
register_attention_type("sba", lambda c: SBAttention(**_common(c)),
                        description="stick-breaking attention")
