"""`pathattn.train`: SyntheticConfig validation, LR schedule, data streams, the Trainer's
outputs, exact resume and the `pathattn train` CLI. Tiny models, a few steps each."""

from __future__ import annotations

import json
import math

import pytest
import torch

from pathattn.cli import main
from pathattn.train import SyntheticConfig, TaskStream, Trainer, build_task, lr_at, param_groups
from pathattn.train.synthetic import model_vocab_size

FF_KEYS = ("val", "val_sparse", "val_dense")


def tiny(tmp_path, **over) -> SyntheticConfig:
    """A flip-flop run of a 1-layer, 16-wide model on 16-token sequences."""
    kw = dict(task="flipflop", dim=16, heads=2, layers=1, steps=4, batch_size=2, num_pairs=8,
              warmup_steps=2, eval_every=100, eval_batches=1, final_eval_batches=1,
              log_every=1,
              checkpoint_every=100, out_dir=str(tmp_path / "run"), progress=False)
    return SyntheticConfig(**{**kw, **over})


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


# ------------------------------------------------------------------------- config


@pytest.mark.parametrize("field,value", [
    ("task", "parity"), ("attn", "alibi"), ("dtype", "float16"), ("layers", 0),
    ("steps", -1), ("batch_size", 1.5), ("lr", 0.0), ("weight_decay", -0.1),
    ("min_lr_ratio", 1.5), ("grad_clip", -1.0), ("warmup_steps", -1), ("eval_every", 0),
    ("num_pairs", 1), ("length", 5), ("out_dir", ""),
], ids=lambda v: str(v))
def test_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SyntheticConfig(**{field: value})


def test_validation_task_options_and_heads():
    with pytest.raises(ValueError, match="n_back"):
        SyntheticConfig(task="flipflop", n_back=2)
    with pytest.raises(ValueError, match="length"):
        SyntheticConfig(task="mqrar", length=7)  # odd: MQRAR needs (key, value) pairs
    with pytest.raises(ValueError, match="dim"):
        SyntheticConfig(dim=30, heads=4)
    with pytest.raises(ValueError, match="unknown"):
        SyntheticConfig.from_dict({"epochs": 3})
    assert SyntheticConfig.preset("a5-cpu").task == "a5"


# ------------------------------------------------------------- schedule and groups


def test_lr_schedule_values():
    cfg = SyntheticConfig(lr=1.0, warmup_steps=10, steps=110, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1)
    assert lr_at(4, cfg) == pytest.approx(0.5)
    assert lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.55)  # halfway down the cosine
    assert lr_at(35, cfg) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)))
    assert lr_at(110, cfg) == pytest.approx(0.1)
    no_warmup = SyntheticConfig(lr=2.0, warmup_steps=0, steps=10, min_lr_ratio=0.0)
    assert lr_at(0, no_warmup) == pytest.approx(2.0)


def test_param_groups_skip_norms_biases_embeddings(tmp_path):
    model = Trainer(tiny(tmp_path, attn="path_fox")).model
    decay, no_decay = param_groups(model, 0.1)
    ids = {id(p) for p in no_decay["params"]}
    assert id(model.embed_tokens.weight) in ids  # also the tied LM head
    assert id(model.norm.weight) in ids and id(model.layers[0].attn_norm.weight) in ids
    assert all(p.ndim >= 2 for p in decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0


# ----------------------------------------------------------------------- streams


@pytest.mark.parametrize("task,opts", [("flipflop", dict(num_pairs=4)),
                                       ("a5", dict(length=6)),
                                       ("mqrar", dict(length=10, keys=3))],
                         ids=["flipflop", "a5", "mqrar"])
def test_stream_matches_task_iter_and_resumes(task, opts):
    cfg = SyntheticConfig(task=task, batch_size=2, **opts)
    reference = iter(build_task(cfg))
    expected = [next(reference) for _ in range(3)]
    stream = TaskStream.for_split(cfg, "train")
    first = next(stream)
    state = stream.state_dict()
    rest = [next(stream), next(stream)]
    skip = 1 if task == "a5" else 0  # word problems: a BOS column first, not scored
    for got, want in zip([first, *rest], expected, strict=True):
        assert torch.equal(got[0][:, skip:], want[0]) and torch.equal(got[1][:, skip:], want[1])
    if skip:
        vocab = len(build_task(cfg).vocab)
        assert (first[0][:, 0] == vocab).all() and (first[1][:, 0] == -100).all()
        assert model_vocab_size(build_task(cfg)) == vocab + 1
    resumed = TaskStream.for_split(cfg, "train")
    resumed.load_state_dict(state)
    assert resumed.batches == 1
    assert torch.equal(next(resumed)[0][:, skip:], expected[1][0])


# ---------------------------------------------------------------------- training


def test_tiny_run_writes_log_and_metrics(tmp_path):
    cfg = tiny(tmp_path, log_every=2)
    metrics = Trainer(cfg).train()
    out = tmp_path / "run"
    log = read_jsonl(out / "log.jsonl")
    assert [r["step"] for r in log] == [2, 4]
    for record in log:
        assert {"step", "loss", "lr", "grad_norm"} <= set(record)
        assert math.isfinite(record["loss"]) and record["lr"] > 0
    assert log[0]["lr"] == pytest.approx(lr_at(1, cfg))
    saved = json.loads((out / "metrics.json").read_text())
    assert saved == metrics and saved["step"] == 4
    for split in FF_KEYS:  # the contract: error rates as fractions under the split names
        assert isinstance(saved[split], float) and 0.0 <= saved[split] <= 1.0
        assert 0.0 <= saved[f"{split}_seq_error_rate"] <= 1.0
    assert (out / "checkpoints" / "latest.json").exists()
    assert SyntheticConfig.from_dict(json.loads((out / "config.json").read_text())) == cfg


def test_word_problem_metrics_bfloat16(tmp_path):
    cfg = tiny(tmp_path, task="a5", num_pairs=None, length=4, steps=2, dtype="bfloat16",
               attn="rope")
    metrics = Trainer(cfg).train()
    assert set(metrics) == {"step", "val_token_acc", "val_seq_acc", "val_scored",
                            "val_sequences"}
    assert 0.0 <= metrics["val_seq_acc"] <= metrics["val_token_acc"] <= 1.0


def test_exact_resume_gives_identical_losses(tmp_path):
    full = tiny(tmp_path / "full", steps=6, checkpoint_every=3, eval_every=3)
    Trainer(full).train()
    want = [r["loss"] for r in read_jsonl(tmp_path / "full" / "run" / "log.jsonl")]

    part = tiny(tmp_path / "part", steps=6, checkpoint_every=3, eval_every=3)
    Trainer(part).train(until=4)  # "killed" after step 4, last checkpoint at step 3
    resumed = Trainer(part, resume=True)
    assert resumed.step == 3 and resumed.data.batches == 3
    resumed.train()
    log = read_jsonl(tmp_path / "part" / "run" / "log.jsonl")
    assert [r["step"] for r in log] == list(range(1, 7))  # step 4 of the first try dropped
    assert [r["loss"] for r in log] == want  # bit-identical
    full_w = Trainer(full, resume=True).model.state_dict()
    part_w = Trainer(part, resume=True).model.state_dict()
    assert all(torch.equal(full_w[k], part_w[k]) for k in full_w)


def test_resume_rejects_a_different_config(tmp_path):
    cfg = tiny(tmp_path, steps=2)
    Trainer(cfg).train()
    with pytest.raises(ValueError, match="lr"):
        Trainer(tiny(tmp_path, steps=2, lr=0.5), resume=True)
    with pytest.raises(FileNotFoundError):
        Trainer(tiny(tmp_path / "empty"), resume=True)


# --------------------------------------------------------------------------- CLI


def test_cli_train_and_resume(tmp_path, capsys):
    out = tmp_path / "cli"
    args = ["train", "--task", "flipflop", "--attn", "path", "--layers", "1", "--heads", "2",
            "--dim", "16", "--steps", "2", "--batch-size", "2", "--num-pairs", "6",
            "--eval-batches", "1", "--final-eval-batches", "2", "--log-every", "1",
            "--out", str(out), "--no-progress"]
    assert main(args) == 0
    assert [r["step"] for r in read_jsonl(out / "log.jsonl")] == [1, 2]
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(FF_KEYS) <= set(metrics)
    assert metrics["val_sequences"] == 4  # --final-eval-batches 2 of --batch-size 2
    assert main(["train", "--out", str(out), "--resume", "--no-progress"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["train", "--out", str(out), "--resume", "--steps", "5"])
    with pytest.raises(SystemExit):
        main(["train", "--out", str(tmp_path / "x"), "--dtype", "float16"])
    assert "dtype" in capsys.readouterr().err
