"""Every ModelConfig field is reachable from a training config and the command line:
SyntheticConfig.model holds the fields the task does not decide (`--model-arg KEY=VALUE`)."""

from __future__ import annotations

import pytest

from pathattn.cli.args import model_args
from pathattn.train import SyntheticConfig
from pathattn.train.synthetic import build_model_config


def test_overrides_reach_the_model():
    cfg = SyntheticConfig(model={"beta_max": 1.99, "w_rank": 8, "qk_norm": True,
                             "num_key_value_heads": 1})
    mc = build_model_config(cfg, vocab_size=5, seq_len=512)
    assert (mc.beta_max, mc.w_rank, mc.qk_norm, mc.num_key_value_heads) == (1.99, 8, True, 1)
    assert SyntheticConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("model, match", [
    ({"no_such_field": 1}, r"unknown ModelConfig field"),
    ({"hidden_size": 32}, r"set by the task"),
    ({"beta_max": 2.5}, r"^model: beta_max"),
    ("beta_max=1", r"^model must be a dict"),
], ids=["unknown", "task-decides", "invalid-value", "not-a-dict"])
def test_bad_overrides_name_the_field(model, match):
    with pytest.raises(ValueError, match=match):
        SyntheticConfig(model=model)


def test_cli_values_are_json():
    assert model_args(["beta_max=1.99", "qk_norm=true", "w_rank=null", "x=abc"]) == \
        {"beta_max": 1.99, "qk_norm": True, "w_rank": None, "x": "abc"}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        model_args(["beta_max"])
