"""The per-family weight map: an attn_type="rope" student computes its teacher's logits
(float64, relative error 1e-10: the proof that every tensor lands where it belongs), a
PaTH student holds the teacher's tensors and the documented init of the new ones, and
unsupported teachers fail with a message that names what is supported."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from pathattn.convert import (
    FAMILIES,
    PaTHInit,
    UnsupportedTeacher,
    student_config,
    student_from_teacher,
)
from pathattn.models import ModelConfig, PaTHLM

from .conftest import SHAPES, float64_islands_removed, make_teacher


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("family", sorted(SHAPES))
def test_rope_student_computes_the_teachers_logits(family):
    teacher = make_teacher(family)
    student = student_from_teacher(teacher, attn_type="rope")
    float64_islands_removed(teacher)
    ids = torch.randint(0, teacher.config.vocab_size, (2, 24))
    with torch.no_grad():
        want = teacher(input_ids=ids).logits
        got = student(input_ids=ids, use_cache=False).logits
    assert got.dtype == torch.float64
    assert _rel(got, want) < 1e-10


def test_stock_float32_teacher_agrees_to_rounding():
    """Without any change to the teacher, in float32: agreement to float32 rounding."""
    teacher = make_teacher("qwen3", dtype=torch.float32)
    student = student_from_teacher(teacher, attn_type="rope")
    ids = torch.randint(0, teacher.config.vocab_size, (2, 24))
    with torch.no_grad():
        assert _rel(student(input_ids=ids, use_cache=False).logits,
                    teacher(input_ids=ids).logits) < 1e-5


@pytest.mark.parametrize("family", sorted(SHAPES))
def test_config_map(family):
    teacher = make_teacher(family)
    cfg = student_config(teacher, "path")
    tc = teacher.config
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.kv_heads, cfg.vocab_size,
            cfg.intermediate_size, cfg.num_hidden_layers, cfg.rms_norm_eps,
            cfg.rope_theta, cfg.tie_word_embeddings, cfg.max_position_embeddings) == (
        tc.hidden_size, tc.num_attention_heads, tc.num_key_value_heads, tc.vocab_size,
        tc.intermediate_size, tc.num_hidden_layers, tc.rms_norm_eps, 500.0,
        tc.tie_word_embeddings, tc.max_position_embeddings)
    assert cfg.head_size == (getattr(tc, "head_dim", None) or 12)
    assert cfg.qk_norm == (family == "qwen3")
    assert cfg.qkv_bias == (family in ("qwen2", "llama-bias"))
    assert cfg.o_bias == (family == "llama-bias")


@pytest.mark.parametrize("attn", ["path", "path_fox"])
@pytest.mark.parametrize("family", ["qwen2", "qwen3", "smollm2"])
def test_path_student_holds_the_teacher_and_the_documented_init(family, attn):
    teacher = make_teacher(family)
    student = student_from_teacher(teacher, attn_type=attn, init=PaTHInit(beta=0.25))
    s, t = student.state_dict(), teacher.state_dict()
    pairs = FAMILIES[type(teacher).__name__].weights(teacher.config)
    for s_name, t_name in pairs:
        assert torch.equal(s[s_name], t[t_name]), s_name
    if teacher.config.tie_word_embeddings:
        assert student.lm_head.weight is student.model.embed_tokens.weight
    x = torch.randn(2, 5, teacher.config.hidden_size, dtype=torch.float64)
    for block in student.model.layers:
        attn_layer = block.attn
        assert torch.allclose(attn_layer.beta(x), torch.full((2, 5, attn_layer.num_kv_heads),
                                                             0.25, dtype=torch.float64))
        if attn == "path_fox":
            bias = attn_layer.g_proj.bias
            assert bool(((bias >= 3.0) & (bias <= 6.0)).all())
    # the student is seeded: the same teacher gives the same student
    again = student_from_teacher(teacher, attn_type=attn, init=PaTHInit(beta=0.25))
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in s.items())


def test_path_student_starts_near_the_teacher():
    """Small beta: H_t near I, the student is the teacher without position encoding; its
    outputs differ from the teacher's but are finite and of the same scale."""
    teacher = make_teacher("llama")
    student = student_from_teacher(teacher, attn_type="path")
    ids = torch.randint(0, teacher.config.vocab_size, (1, 16))
    with torch.no_grad():
        got = student(input_ids=ids, use_cache=False).logits
        want = teacher(input_ids=ids).logits
        beta = student.model.layers[0].attn.beta(torch.zeros(1, 1, 48, dtype=torch.float64))
    assert torch.isfinite(got).all()
    assert math.isclose(float(got.std()), float(want.std()), rel_tol=0.5)
    assert float(beta.max()) == pytest.approx(0.1)


def test_unsupported_family_names_the_class_and_the_supported_ones():
    from transformers import GPT2Config, GPT2LMHeadModel

    teacher = GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50))
    with pytest.raises(UnsupportedTeacher) as e:
        student_from_teacher(teacher)
    msg = str(e.value)
    assert "GPT2LMHeadModel" in msg
    assert all(name in msg for name in FAMILIES)


def test_unsupported_options_are_named():
    with pytest.raises(UnsupportedTeacher, match="hidden_act='gelu'"):
        student_from_teacher(make_teacher("llama", hidden_act="gelu"))
    with pytest.raises(UnsupportedTeacher, match="mlp_bias"):
        student_from_teacher(make_teacher("llama", mlp_bias=True))
    teacher = make_teacher("llama")
    teacher.config.rope_parameters = {"rope_type": "linear", "factor": 2.0,
                                      "rope_theta": 500.0}
    with pytest.raises(UnsupportedTeacher, match="rope_type 'linear'"):
        student_from_teacher(teacher, attn_type="rope")
    student_from_teacher(teacher, attn_type="path")  # PaTH has no RoPE to scale


def test_bias_fields_default_off_and_place_biases():
    """qkv_bias / o_bias: off by default (existing models and checkpoints unchanged);
    qkv_bias puts biases on q, k, v only (Qwen2), o_bias on o."""
    plain = PaTHLM(ModelConfig.preset("tiny"))
    attn = plain.layers[0].attn
    assert all(getattr(attn, f"{p}_proj").bias is None for p in "qkvo")
    # a config dict written before the fields existed loads as the same model
    old = {k: v for k, v in ModelConfig.preset("tiny").to_dict().items()
           if k not in ("qkv_bias", "o_bias")}
    assert ModelConfig.from_dict(old) == ModelConfig.preset("tiny")
    for attn_type in ("path", "path_fox", "rope", "fox"):
        lm = PaTHLM(ModelConfig.preset("tiny", attn_type=attn_type, qkv_bias=True))
        attn = lm.layers[0].attn
        assert all(isinstance(getattr(attn, f"{p}_proj").bias, nn.Parameter) for p in "qkv")
        assert attn.o_proj.bias is None
        lm = PaTHLM(ModelConfig.preset("tiny", attn_type=attn_type, o_bias=True))
        assert lm.layers[0].attn.o_proj.bias is not None
        assert lm.layers[0].attn.q_proj.bias is None
    with pytest.raises(ValueError, match="qkv_bias"):
        ModelConfig.preset("tiny", qkv_bias=1)
