"""Fault injection on the training hyper-parameters: an infinite or NaN learning rate,
weight decay or gradient clip is refused where the config is validated (`SyntheticConfig`), so
the Python API and every training command get a ValueError naming the argument, and the
CLI prints it without a traceback and exits non-zero. grad_clip 0 (no clipping) still
trains."""

from __future__ import annotations

import json
import math

import pytest

from pathattn.cli import main
from pathattn.train import SyntheticConfig, Trainer
from tests.train.test_trainer import tiny

INF, NAN = float("inf"), float("nan")
BAD = [("lr", INF), ("lr", -INF), ("lr", NAN), ("weight_decay", INF), ("weight_decay", NAN),
       ("grad_clip", INF), ("grad_clip", NAN)]
FLAGS = {"lr": "--lr", "weight_decay": "--weight-decay", "grad_clip": "--grad-clip"}
TINY = ["--task", "flipflop", "--attn", "rope", "--dim", "16", "--heads", "2", "--steps",
        "2", "--batch-size", "2", "--num-pairs", "4", "--final-eval-batches", "1",
        "--no-progress"]


def _ids(case) -> str:
    return f"{case[0]}={case[1]}"


@pytest.mark.parametrize("field,value", BAD, ids=[_ids(c) for c in BAD])
def test_config_rejects_non_finite(field, value):
    with pytest.raises(ValueError, match=f"{field} must be a finite"):
        SyntheticConfig(**{field: value})


@pytest.mark.parametrize("field,value", BAD, ids=[_ids(c) for c in BAD])
def test_trainer_revalidates_a_mutated_config(tmp_path, field, value):
    cfg = tiny(tmp_path)
    setattr(cfg, field, value)  # dataclasses do not validate on assignment
    with pytest.raises(ValueError, match=field):
        Trainer(cfg)
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("command", ["train", "compare", "layers"])
@pytest.mark.parametrize("field,value", [("lr", INF), ("weight_decay", INF),
                                         ("grad_clip", INF)],
                         ids=["lr=inf", "weight_decay=inf", "grad_clip=inf"])
def test_cli_refuses_cleanly(tmp_path, capsys, command, field, value):
    args = [a for a in TINY if command == "train" or a not in ("--attn", "rope")]
    with pytest.raises(SystemExit) as exit_info:
        main([command, *args, FLAGS[field], str(value), "--out", str(tmp_path / "x")])
    assert exit_info.value.code != 0
    err = capsys.readouterr().err
    assert f"{field} must be a finite" in err and "Traceback" not in err
    assert not (tmp_path / "x" / "log.jsonl").exists()


def test_grad_clip_zero_still_means_no_clipping(tmp_path):
    metrics = Trainer(tiny(tmp_path, attn="rope", steps=2, grad_clip=0.0)).train()
    assert metrics["step"] == 2
    log = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 for r in log)
