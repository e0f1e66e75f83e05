"""A tiny pathattn export shared by the Hugging Face ecosystem tests (remote code, lm-eval's
command line, fine-tuning): built once per session from sixteen short local documents."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

WORDS = "the a river stone mill cloud hill boat shore bird light road town green blue".split()


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
    from pathattn.cli import main
    from pathattn.models import ModelConfig, PaTHLM
    from pathattn.train.pretrain import PretrainConfig, export_hf

    root = tmp_path_factory.mktemp("hf_export")
    (root / "corpus").mkdir()
    rng = random.Random(0)
    for i in range(16):
        words = [rng.choice(WORDS) for _ in range(rng.randrange(20, 60))]
        (root / "corpus" / f"doc{i}.txt").write_text(" ".join(words) + ".\n")
    assert main(["tokenizer", "--input", str(root / "corpus"), "--vocab-size", "300",
                 "--out", str(root / "tok"), "--no-progress"]) == 0
    assert main(["prepare", "--input", str(root / "corpus"), "--tokenizer", str(root / "tok"),
                 "--out", str(root / "data"), "--val-fraction", "0.4", "--workers", "1"]) == 0
    config = ModelConfig(vocab_size=300, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, w_rank=8,
                         max_position_embeddings=256)
    torch.manual_seed(0)
    cfg = PretrainConfig(data=str(root / "data"), model=config, out_dir=str(root / "run"))
    out = export_hf(PaTHLM(config), cfg)
    return Export(data=root / "data", tokenizer=root / "tok", model=out)
