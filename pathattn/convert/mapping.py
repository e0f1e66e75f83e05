"""Per-family maps from a pretrained Hugging Face causal LM of the LLaMA family (the teacher)
to pathattn's `PaTHForCausalLM` (the student): which config values carry over and which
teacher tensor each student tensor is copied from.

Every family is one `Family` entry of `FAMILIES`, keyed by the teacher's class name:

    LlamaForCausalLM    RMSNorm pre-norm blocks, SwiGLU MLP, RoPE; optional biases on
                        q, k, v, o (attention_bias); SmolLM2 is this class with GQA and a
                        tied head
    MistralForCausalLM  LLaMA's layout (its sliding window is not carried over: the
                        student attends to the whole sequence)
    Qwen2ForCausalLM    LLaMA's layout plus biases on q, k, v (none on o)
    Qwen3ForCausalLM    LLaMA's layout plus a per-head RMSNorm of q and k before RoPE
                        (and an optional attention_bias as LLaMA's)

The weight map is explicit: one (student name, teacher name) pair per tensor, written
out per family (`Family.weights`), and `copy_teacher_weights` checks that it covers every
student tensor except the new PaTH ones and consumes every teacher tensor, so a family
whose layout changes fails loudly instead of leaving a tensor at its random init.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

__all__ = ["Family", "FAMILIES", "family_of", "student_config_fields", "weight_pairs",
           "copy_teacher_weights", "NEW_PATH_PARAMETERS", "UnsupportedTeacher"]

# attention parameters that a PaTH student has and a RoPE teacher has not (suffixes of
# `model.layers.N.attn.`): the w projection (low rank or full), its short convolution,
# the beta projection and the forget-gate projection (PaTH-FoX)
NEW_PATH_PARAMETERS = ("w_proj.", "w_conv.", "beta_proj.", "g_proj.")


class UnsupportedTeacher(ValueError):
    """The teacher's class or one of its options has no mapping; the message names it and
    what is supported."""


def _rope_theta(config) -> float:
    """The RoPE base of an HF config (transformers 5: rope_parameters["rope_theta"])."""
    params = getattr(config, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    return float(theta if theta is not None else 10000.0)


def rope_type(config) -> str:
    """The teacher's RoPE variant ("default" for plain RoPE)."""
    params = getattr(config, "rope_parameters", None) or {}
    return str(params.get("rope_type", params.get("type", "default")))


def _llama_fields(config) -> dict[str, Any]:
    """`ModelConfig` fields shared by the whole family."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    return dict(vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                intermediate_size=config.intermediate_size,
                num_hidden_layers=config.num_hidden_layers, num_attention_heads=heads,
                num_key_value_heads=kv,
                head_dim=None if head_dim * heads == config.hidden_size else head_dim,
                max_position_embeddings=config.max_position_embeddings,
                rms_norm_eps=float(config.rms_norm_eps),
                tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
                rope_theta=_rope_theta(config),
                initializer_range=float(getattr(config, "initializer_range", 0.02)))


def _attention_bias(config) -> bool:
    return bool(getattr(config, "attention_bias", False) or False)


@dataclass(frozen=True)
class Family:
    """One teacher family.

    Args:
        name: the teacher's class name (transformers), e.g. "Qwen2ForCausalLM".
        config: teacher config -> the student's `ModelConfig` fields (all but the PaTH
            ones: attn_type, w_rank, conv_size, beta_max).
        layer_tensors: teacher config -> (student suffix, teacher suffix) pairs of one
            block, under "model.layers.N." on both sides.
        attention_module: name of layer i's attention module in the teacher (its input,
            the normed hidden state, and output are stage 1's targets).
    """

    name: str
    config: Callable[[Any], dict[str, Any]]
    layer_tensors: Callable[[Any], list[tuple[str, str]]]
    attention_module: str = "model.layers.{i}.self_attn"

    def weights(self, config) -> list[tuple[str, str]]:
        """Every (student name, teacher name) pair of a teacher with `config`."""
        pairs = [("model.embed_tokens.weight", "model.embed_tokens.weight"),
                 ("model.norm.weight", "model.norm.weight")]
        if not getattr(config, "tie_word_embeddings", False):
            pairs.append(("lm_head.weight", "lm_head.weight"))
        for i in range(config.num_hidden_layers):
            pairs += [(f"model.layers.{i}.{s}", f"model.layers.{i}.{t}")
                      for s, t in self.layer_tensors(config)]
        return pairs


def _block(q_bias: bool, o_bias: bool, qk_norm: bool) -> list[tuple[str, str]]:
    """The block map: norms, q/k/v/o (biases as given), optional q/k norms, SwiGLU."""
    pairs = [("attn_norm.weight", "input_layernorm.weight"),
             ("mlp_norm.weight", "post_attention_layernorm.weight")]
    for p in ("q", "k", "v", "o"):
        pairs.append((f"attn.{p}_proj.weight", f"self_attn.{p}_proj.weight"))
        if (o_bias if p == "o" else q_bias):
            pairs.append((f"attn.{p}_proj.bias", f"self_attn.{p}_proj.bias"))
    if qk_norm:
        pairs += [("attn.q_norm.weight", "self_attn.q_norm.weight"),
                  ("attn.k_norm.weight", "self_attn.k_norm.weight")]
    pairs += [(f"mlp.{p}_proj.weight", f"mlp.{p}_proj.weight") for p in ("gate", "up", "down")]
    return pairs


def _llama_config(config) -> dict[str, Any]:
    bias = _attention_bias(config)
    return dict(_llama_fields(config), qkv_bias=bias, o_bias=bias)


def _llama_block(config) -> list[tuple[str, str]]:
    bias = _attention_bias(config)
    return _block(q_bias=bias, o_bias=bias, qk_norm=False)


def _qwen2_config(config) -> dict[str, Any]:
    return dict(_llama_fields(config), qkv_bias=True, o_bias=False)


def _qwen2_block(config) -> list[tuple[str, str]]:
    return _block(q_bias=True, o_bias=False, qk_norm=False)


def _qwen3_config(config) -> dict[str, Any]:
    bias = _attention_bias(config)
    return dict(_llama_fields(config), qkv_bias=bias, o_bias=bias, qk_norm=True)


def _qwen3_block(config) -> list[tuple[str, str]]:
    bias = _attention_bias(config)
    return _block(q_bias=bias, o_bias=bias, qk_norm=True)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("LlamaForCausalLM", _llama_config, _llama_block),
    Family("MistralForCausalLM", _llama_config, _llama_block),
    Family("Qwen2ForCausalLM", _qwen2_config, _qwen2_block),
    Family("Qwen3ForCausalLM", _qwen3_config, _qwen3_block),
)}


def family_of(teacher: nn.Module) -> Family:
    """The `Family` of a teacher model; UnsupportedTeacher naming its class and the
    supported ones otherwise, or naming an option the student cannot reproduce (an MLP
    activation other than SiLU, MLP biases)."""
    name = type(teacher).__name__
    family = FAMILIES.get(name)
    if family is None:
        raise UnsupportedTeacher(f"teacher: {name} is not supported; supported families: "
                                 f"{', '.join(sorted(FAMILIES))} (SmolLM2 loads as "
                                 "LlamaForCausalLM)")
    config = teacher.config
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise UnsupportedTeacher(f"teacher: {name} with hidden_act={act!r}; the student's "
                                 "MLP is SwiGLU (hidden_act='silu')")
    if getattr(config, "mlp_bias", False):
        raise UnsupportedTeacher(f"teacher: {name} with mlp_bias=True; the student's MLP "
                                 "has no biases")
    return family


def student_config_fields(teacher: nn.Module) -> dict[str, Any]:
    """The `ModelConfig` fields the student takes from the teacher (its family's map)."""
    return family_of(teacher).config(teacher.config)


def weight_pairs(teacher: nn.Module) -> list[tuple[str, str]]:
    """The (student name, teacher name) pairs of the teacher's family."""
    return family_of(teacher).weights(teacher.config)


@torch.no_grad()
def copy_teacher_weights(student: nn.Module, teacher: nn.Module) -> list[str]:
    """Copy the teacher's tensors into `student` (a `PaTHForCausalLM` built from
    `student_config_fields`) by the family's map, in the student's dtype. Returns the names
    of the student tensors left as they were (the new PaTH parameters). ValueError when the
    map misses a student tensor that is not a new PaTH one, or leaves a teacher tensor
    unused, or shapes differ."""
    pairs = weight_pairs(teacher)
    src = teacher.state_dict()
    dst = student.state_dict()
    tied = {"lm_head.weight"} if getattr(teacher.config, "tie_word_embeddings", False) else set()
    unused = set(src) - {t for _, t in pairs} - tied  # a tied head is the embedding
    if unused:
        raise ValueError(f"teacher {type(teacher).__name__}: tensors without a place in the "
                         f"student: {sorted(unused)[:8]}")
    for s, t in pairs:
        if s not in dst or t not in src:
            raise ValueError(f"mapping {t!r} -> {s!r}: "
                             f"{'student' if s not in dst else 'teacher'} has no such tensor")
        if dst[s].shape != src[t].shape:
            raise ValueError(f"mapping {t!r} -> {s!r}: shape {tuple(src[t].shape)} != "
                             f"{tuple(dst[s].shape)}")
        dst[s].copy_(src[t].to(dst[s].dtype))
    left = sorted(set(dst) - {s for s, _ in pairs} - tied)
    missing = [n for n in left if not any(f".attn.{p}" in n for p in NEW_PATH_PARAMETERS)]
    if missing:
        raise ValueError(f"teacher {type(teacher).__name__}: student tensors without a "
                         f"source: {missing[:8]}")
    return left
