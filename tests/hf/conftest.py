"""A tiny pathattn export shared by the Hugging Face ecosystem tests (remote code, lm-eval's
command line, fine-tuning): built once per session from sixteen short local documents."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests._tiny_text import tiny_prepared


@dataclass
class Export:
    """data: a prepared folder; tokenizer: its tokenizer folder; model: the `pathattn
    pretrain` export (export_hf) of a randomly initialised two-layer PaTH model."""

    data: Path
    tokenizer: Path
    model: Path


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory) -> Export:
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from pathattn.models import ModelConfig, PaTHLM
    from pathattn.train.pretrain import PretrainConfig, export_hf

    root = tmp_path_factory.mktemp("hf_export")
    tok, data = tiny_prepared(root)
    config = ModelConfig(vocab_size=300, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, w_rank=8,
                         max_position_embeddings=256)
    torch.manual_seed(0)
    cfg = PretrainConfig(data=str(data), model=config, out_dir=str(root / "run"))
    out = export_hf(PaTHLM(config), cfg)
    return Export(data=data, tokenizer=tok, model=out)
