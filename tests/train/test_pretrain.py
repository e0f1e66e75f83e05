"""Language-model pretraining end to end, offline: tokenizer -> prepared data -> `pathattn
pretrain` -> the export loaded by the Auto classes; exact resume; gradient accumulation;
the exported model's validation perplexity equals the trainer's."""

from __future__ import annotations

import json
import math
import shutil
import sysconfig
from pathlib import Path

import pytest
import torch

from pathattn.cli import main
from pathattn.data import EvalLoader
from pathattn.models import ModelConfig
from pathattn.train import PretrainConfig, Trainer, read_jsonl

STDLIB = Path(sysconfig.get_paths()["stdlib"])
FILES = ["json/encoder.py", "json/decoder.py", "json/scanner.py", "json/__init__.py",
         "email/utils.py", "email/header.py", "email/charset.py", "email/errors.py",
         "email/quoprimime.py", "email/base64mime.py"]


def make_prepared(root: Path) -> Path:
    """A 512-token tokenizer and a prepared folder of ten stdlib files (3 in val) under
    root; returns the prepared folder."""
    corpus = root / "corpus"
    corpus.mkdir()
    for name in FILES:
        shutil.copy(STDLIB / name, corpus / name.replace("/", "_"))
    assert main(["tokenizer", "--input", str(corpus), "--vocab-size", "512",
                 "--out", str(root / "tok")]) == 0
    assert main(["prepare", "--input", str(corpus), "--tokenizer", str(root / "tok"),
                 "--out", str(root / "data"), "--val-fraction", "0.3", "--workers", "1"]) == 0
    return root / "data"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    return make_prepared(tmp_path_factory.mktemp("text"))


def small_config(data: Path, out: Path, **over) -> PretrainConfig:
    model = ModelConfig.preset("cpu-tiny", vocab_size=512, attn_type=over.pop("attn", "path"))
    base = dict(data=str(data), model=model, steps=6, seq_len=64, batch_size=2,
                warmup_steps=1, eval_every=3, eval_batches=1, final_eval_batches=2,
                log_every=1, checkpoint_every=2, out_dir=str(out), progress=False)
    return PretrainConfig(**{**base, **over})


def test_cli_slice_exports_a_loadable_model(prepared, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = tmp_path / "run"
    assert main(["pretrain", "--data", str(prepared), "--preset", "cpu-tiny", "--attn",
                 "path_fox", "--steps", "4", "--seq-len", "64", "--batch-size", "2",
                 "--eval-every", "2", "--eval-batches", "1", "--log-every", "1", "--no-progress",
                 "--model-arg", "beta_max=1.99", "--out", str(run)]) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert set(metrics) >= {"step", "val_loss", "val_ppl"} and metrics["step"] == 4
    config = json.loads((run / "config.json").read_text())
    assert config["model"]["beta_max"] == 1.99 and config["model"]["attn_type"] == "path_fox"
    assert [r["step"] for r in read_jsonl(run / "log.jsonl")] == [1, 2, 3, 4]
    assert {"tokens_per_s", "tokens"} <= set(read_jsonl(run / "log.jsonl")[-1])

    model = AutoModelForCausalLM.from_pretrained(run / "hf").eval()
    tok = AutoTokenizer.from_pretrained(run / "hf")
    assert tok.eos_token is not None and tok.pad_token is not None
    ids = tok("def main():", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert out.shape == (1, ids.shape[1] + 5)
    # the exported model's perplexity on the val split (through the HF model) is val_ppl
    val = EvalLoader(prepared, config["seq_len"], config["batch_size"])
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in val:
            logits = model(input_ids=batch.input_ids, cu_seqlens=batch.cu_seqlens).logits
            total += float(torch.nn.functional.cross_entropy(
                logits[0].float(), batch.labels[0], ignore_index=-100, reduction="sum"))
            count += batch.num_scored
    assert math.exp(total / count) == pytest.approx(metrics["val_ppl"], rel=1e-6)


def test_resume_is_exact(prepared, tmp_path):
    """Stopped after 3 steps and resumed: the same losses, bit for bit, as one run."""
    with Trainer(small_config(prepared, tmp_path / "one")) as t:
        t.train()
    with Trainer(small_config(prepared, tmp_path / "two")) as t:
        t.train(until=3)
    with Trainer(small_config(prepared, tmp_path / "two"), resume=True) as t:
        t.train()
    losses = [[r["loss"] for r in read_jsonl(tmp_path / name / "log.jsonl")]
              for name in ("one", "two")]
    assert len(losses[0]) == 6 and losses[0] == losses[1]


def test_gradient_accumulation_equals_the_bigger_batch(prepared, tmp_path):
    """accum=2 micro-batches of 2 rows = one batch of 4 rows (the same tokens)."""
    runs = {}
    for name, over in (("accum", dict(batch_size=2, accum=2)), ("big", dict(batch_size=4))):
        with Trainer(small_config(prepared, tmp_path / name, steps=2, **over)) as t:
            t.train(until=2)
            runs[name] = (t.model.state_dict(),
                          [r["loss"] for r in read_jsonl(tmp_path / name / "log.jsonl")])
    assert runs["accum"][1] == pytest.approx(runs["big"][1], rel=1e-5)
    for key, value in runs["big"][0].items():
        torch.testing.assert_close(runs["accum"][0][key], value, rtol=1e-4, atol=1e-6)


def test_tokens_budget_and_errors(prepared, tmp_path, capsys):
    from pathattn.cli import build_parser
    from pathattn.cli.pretrain import pretrain_config

    args = build_parser().parse_args(["pretrain", "--data", str(prepared), "--tokens", "1000",
                                      "--seq-len", "64", "--batch-size", "2",
                                      "--out", str(tmp_path / "r")])
    cfg = pretrain_config(args)
    assert cfg.steps == math.ceil(1000 / 128) and cfg.warmup_steps == 1
    assert cfg.model.vocab_size == 512
    with pytest.raises(SystemExit) as e:
        main(["pretrain", "--steps", "2", "--out", str(tmp_path / "r")])
    assert e.value.code == 2 and "--data" in capsys.readouterr().err
    with pytest.raises(ValueError, match="vocab_size 64 is smaller"):
        Trainer(small_config(prepared, tmp_path / "small", model=ModelConfig.preset(
            "cpu-tiny", vocab_size=64)))
