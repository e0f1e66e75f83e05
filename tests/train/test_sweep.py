"""`pathattn layers` / `fewest_layers`: the sweep stops at the first solving depth, reuses
finished runs, and writes its table."""

from __future__ import annotations

import json

import pytest

from pathattn.cli import main
from pathattn.train import TrainConfig, fewest_layers, solve_score

TINY = dict(task="a5", dim=16, heads=2, steps=2, batch_size=2, length=4, warmup_steps=1,
            eval_every=100, eval_batches=1, final_eval_batches=1, checkpoint_every=100,
            progress=False)


def test_solve_score_per_task():
    assert solve_score({"val_seq_acc": 0.95}, "a5") == 0.95
    assert solve_score({"val_token_acc": 0.5}, "mqrar") == 0.5
    assert solve_score({"val": 0.25}, "flipflop") == 0.75


def test_sweep_stops_at_first_solving_depth_and_reuses_runs(tmp_path):
    base = TrainConfig(**TINY, out_dir=str(tmp_path))
    # threshold 0 is reached by every run: depth 1 solves, depth 2 never trains
    res = fewest_layers(base, ["path"], [1, 2], tmp_path, threshold=0.0)
    assert res["path"]["solved_at"] == 1 and list(res["path"]["runs"]) == [1]
    assert not (tmp_path / "path-L2").exists()
    # threshold 1.0 is out of reach for a 2-step model: both depths run, none solves
    res = fewest_layers(base, ["path"], [1, 2], tmp_path, threshold=1.0)
    assert res["path"]["solved_at"] is None and list(res["path"]["runs"]) == [1, 2]
    mtime = (tmp_path / "path-L1" / "metrics.json").stat().st_mtime_ns
    fewest_layers(base, ["path"], [1], tmp_path, threshold=1.0)  # finished run: reused
    assert (tmp_path / "path-L1" / "metrics.json").stat().st_mtime_ns == mtime
    assert json.loads((tmp_path / "layers.json").read_text())["path"]["solved_at"] is None


def test_cli_layers_writes_table(tmp_path, capsys):
    out = tmp_path / "sweep"
    args = ["layers", "--task", "a5", "--dim", "16", "--heads", "2", "--steps", "2",
            "--batch-size", "2", "--length", "4", "--eval-batches", "1",
            "--final-eval-batches", "1", "--attns", "path", "rope", "--depths", "1",
            "--out", str(out), "--no-progress"]
    assert main(args) == 0
    table = (out / "layers.md").read_text()
    assert table.splitlines()[0].startswith("| attention (a5) | 1 layer |")
    assert "| path |" in table and "| rope |" in table
    assert "wrote" in capsys.readouterr().out


def test_bad_sweep_arguments(tmp_path):
    base = TrainConfig(**TINY, out_dir=str(tmp_path))
    with pytest.raises(ValueError, match="layers"):
        fewest_layers(base, ["path"], [0], tmp_path)
    with pytest.raises(ValueError, match="attns"):
        fewest_layers(base, ["path", "path"], [1], tmp_path)
    with pytest.raises(ValueError, match="threshold"):
        fewest_layers(base, ["path"], [1], tmp_path, threshold=1.5)
