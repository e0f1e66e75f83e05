"""The trainers take every registered attention type by name: the stick-breaking baseline
("sba") through `pathattn train`, `pathattn compare` and `pathattn pretrain`."""

from __future__ import annotations

import json

import pytest

from pathattn.cli import main

from .test_pretrain import make_prepared

TINY = ["--task", "flipflop", "--layers", "1", "--heads", "2", "--dim", "16", "--steps", "2",
        "--batch-size", "2", "--num-pairs", "6", "--eval-every", "2", "--eval-batches", "1",
        "--final-eval-batches", "1", "--no-progress"]


def test_train_and_compare_sba(tmp_path, capsys):
    assert main(["train", *TINY, "--attn", "sba", "--out", str(tmp_path / "t")]) == 0
    metrics = json.loads((tmp_path / "t" / "metrics.json").read_text())
    assert metrics["step"] == 2
    assert main(["compare", *TINY, "--attns", "rope", "sba", "--out", str(tmp_path / "c")]) == 0
    final = json.loads((tmp_path / "c" / "results.json").read_text())
    assert "sba" in json.dumps(final)
    capsys.readouterr()


@pytest.mark.slow
def test_pretrain_sba(tmp_path, capsys):
    data = make_prepared(tmp_path)
    run = tmp_path / "run"
    assert main(["pretrain", "--data", str(data), "--preset", "cpu-tiny", "--attn", "sba",
                 "--steps", "2", "--seq-len", "32", "--batch-size", "2", "--eval-every", "2",
                 "--eval-batches", "1", "--log-every", "1", "--no-progress",
                 "--out", str(run)]) == 0
    config = json.loads((run / "config.json").read_text())
    assert config["model"]["attn_type"] == "sba"
    assert json.loads((run / "metrics.json").read_text())["step"] == 2
    capsys.readouterr()
