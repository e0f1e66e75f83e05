"""Tiny teachers of every supported family, built locally from configs (nothing is
downloaded), and a tiny prepared text folder with a teacher folder that uses its
tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn

from tests.train.test_pretrain import make_prepared

# family id -> (config class, model class, extra config fields)
SHAPES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "llama-bias": ("LlamaConfig", "LlamaForCausalLM", dict(attention_bias=True)),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16)),
    # SmolLM2: a Llama with grouped key/value heads and a tied head
    "smollm2": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=1,
                                                        tie_word_embeddings=True)),
}
BASE = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            rms_norm_eps=1e-5, rope_theta=500.0, tie_word_embeddings=False)


def make_teacher(family: str, dtype=torch.float64, scale: float = 0.05, **over) -> nn.Module:
    """A tiny teacher of `family` (SHAPES) with every weight moved off its init (norm
    weights away from 1, biases away from 0), in eval mode."""
    import transformers

    config_cls, model_cls, extra = SHAPES[family]
    fields = {**BASE, **extra, **over}
    theta = fields.pop("rope_theta")
    config = getattr(transformers, config_cls)(
        **fields, rope_parameters={"rope_type": "default", "rope_theta": theta},
        attn_implementation="sdpa")
    model = getattr(transformers, model_cls)(config).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    return model.eval()


class Float64RMSNorm(nn.Module):
    """The teacher's RMSNorm (same weight) computed in the input's dtype: transformers
    computes it in float32 even for a float64 model."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.weight, self.eps = norm.weight, norm.variance_epsilon

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Float64Rotary(nn.Module):
    """The teacher's default RoPE with its angles in float64 (transformers: float32)."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.inv_freq = theta ** -(torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)

    def forward(self, x, position_ids):
        ang = position_ids[..., None].to(torch.float64) * self.inv_freq  # [B, T, D/2]
        emb = torch.cat([ang, ang], dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def float64_islands_removed(teacher: nn.Module) -> nn.Module:
    """Replace the teacher's float32 islands (RMSNorms, RoPE angles) by float64 modules
    holding the same weights, so that a float64 comparison is limited by float64
    rounding only. The weights and the teacher's state dict stay as they were."""
    for module in list(teacher.modules()):
        for name, child in list(module.named_children()):
            if type(child).__name__.endswith("RMSNorm"):
                setattr(module, name, Float64RMSNorm(child))
    config = teacher.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // \
        config.num_attention_heads
    teacher.model.rotary_emb = Float64Rotary(head_dim, config.rope_parameters["rope_theta"])
    return teacher


@pytest.fixture(scope="session")
def prepared(tmp_path_factory) -> Path:
    """A 512-token tokenizer (root/tok) and a prepared folder (root/data)."""
    return make_prepared(tmp_path_factory.mktemp("convert_text"))


def make_teacher_dir(prepared: Path, out: Path) -> Path:
    """A tiny float32 Llama folder `out` with the tokenizer of `prepared` (a
    `make_prepared` folder). Its q and k weights are scaled up (sharp, position-dependent
    attention), so that a student without RoPE starts measurably away from it and the
    stages have something to fix."""
    from transformers import AutoTokenizer

    torch.manual_seed(0)
    teacher = make_teacher("llama", dtype=torch.float32, scale=0.1, vocab_size=512,
                           hidden_size=32, intermediate_size=64, max_position_embeddings=128)
    with torch.no_grad():
        for layer in teacher.model.layers:
            layer.self_attn.q_proj.weight.mul_(4.0)
            layer.self_attn.k_proj.weight.mul_(4.0)
    teacher.save_pretrained(out)
    AutoTokenizer.from_pretrained(prepared.parent / "tok").save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def teacher_dir(prepared, tmp_path_factory) -> Path:
    """`make_teacher_dir` of the session's prepared folder."""
    return make_teacher_dir(prepared, tmp_path_factory.mktemp("teacher") / "llama")
