"""The attention-type registry: the built-in types, `ATTN_TYPES` as a live view, and a type
registered from outside reaching the config, the model and the trainer's validation."""

from __future__ import annotations

import argparse

import pytest
import torch

from pathattn.models import (
    ATTN_TYPES,
    ModelConfig,
    PaTHLM,
    attention_type_names,
    get_attention_type,
    register_attention_type,
    unregister_attention_type,
)
from pathattn.nn import RoPEAttention
from pathattn.train import SyntheticConfig


def test_builtin_types_in_order():
    assert attention_type_names() == ("path", "path_fox", "rope", "fox", "sba")
    assert ATTN_TYPES == attention_type_names() and "sba" in ATTN_TYPES
    assert list(ATTN_TYPES) == list(attention_type_names()) and ATTN_TYPES[-1] == "sba"
    assert repr(ATTN_TYPES) == repr(attention_type_names()) and 3 not in ATTN_TYPES


@pytest.fixture
def rope_small_base():
    """A type registered from outside: RoPE with base 100, removed afterwards."""
    entry = register_attention_type(
        "rope100", lambda c: RoPEAttention(c.hidden_size, c.num_attention_heads,
                                           c.num_key_value_heads, rope_base=100.0),
        description="RoPE, base 100")
    yield entry
    unregister_attention_type("rope100")


def test_registered_type_reaches_config_model_and_choices(rope_small_base):
    assert "rope100" in ATTN_TYPES  # the same object the CLIs imported earlier
    model = PaTHLM(ModelConfig.preset("tiny", attn_type="rope100"))
    layer = model.layers[0].attn
    assert type(layer) is RoPEAttention and layer.rope.base == 100.0
    model(torch.randint(0, 32, (1, 5)))
    parser = argparse.ArgumentParser()
    parser.add_argument("--attn", choices=ATTN_TYPES)
    assert parser.parse_args(["--attn", "rope100"]).attn == "rope100"
    SyntheticConfig(task="flipflop", attn="rope100", dim=16, heads=2).validate()


def test_registry_errors(rope_small_base):
    with pytest.raises(ValueError, match="already registered"):
        register_attention_type("rope100", rope_small_base.build)
    with pytest.raises(ValueError, match="name"):
        register_attention_type("bad name", rope_small_base.build)
    with pytest.raises(ValueError, match="build must be callable"):
        register_attention_type("other", None)
    with pytest.raises(ValueError, match=r"attn_type must be one of \('path'.*'rope100'\)"):
        get_attention_type("alibi")
    with pytest.raises(ValueError, match="attn_type"):
        ModelConfig.preset("tiny", attn_type="alibi")
    with pytest.raises(ValueError, match="head_dim must be even"):
        ModelConfig.preset("tiny", attn_type="rope", head_dim=7)
