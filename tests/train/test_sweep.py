"""`pathattn layers` / `fewest_layers`: the sweep stops at the first solving depth, runs
once per seed, reports the fewest depths with their median / min / max, reuses finished
runs, and writes its tables."""

from __future__ import annotations

import json

import pytest

from pathattn.cli import main
from pathattn.train import SyntheticConfig, fewest_layers, layers_table, solve_score
from pathattn.train.sweep import layers_markdown, layers_spread_table

TINY = dict(task="a5", dim=16, heads=2, steps=2, batch_size=2, length=4, warmup_steps=1,
            eval_every=100, eval_batches=1, final_eval_batches=1, checkpoint_every=100,
            progress=False)
CLI_TINY = ["--task", "a5", "--dim", "16", "--heads", "2", "--steps", "2", "--batch-size",
            "2", "--length", "4", "--eval-batches", "1", "--final-eval-batches", "1",
            "--no-progress"]


def test_solve_score_per_task():
    assert solve_score({"val_seq_acc": 0.95}, "a5") == 0.95
    assert solve_score({"val_token_acc": 0.5}, "mqrar") == 0.5
    assert solve_score({"val": 0.25}, "flipflop") == 0.75


def test_sweep_stops_at_first_solving_depth_and_reuses_runs(tmp_path):
    base = SyntheticConfig(**TINY, out_dir=str(tmp_path))
    # threshold 0 is reached by every run: depth 1 solves, depth 2 never trains
    res = fewest_layers(base, ["path"], [1, 2], tmp_path, threshold=0.0)
    assert res["path"]["seeds"][0]["solved_at"] == 1
    assert list(res["path"]["seeds"][0]["runs"]) == [1]
    assert res["path"]["solved_at"] == {"per_seed": {0: 1}, "median": 1, "min": 1, "max": 1}
    assert not (tmp_path / "path-L2").exists()
    # threshold 1.0 is out of reach for a 2-step model: both depths run, none solves
    res = fewest_layers(base, ["path"], [1, 2], tmp_path, threshold=1.0)
    assert res["path"]["seeds"][0]["solved_at"] is None
    assert list(res["path"]["seeds"][0]["runs"]) == [1, 2]
    assert res["path"]["solved_at"]["median"] is None
    mtime = (tmp_path / "path-L1" / "metrics.json").stat().st_mtime_ns
    fewest_layers(base, ["path"], [1], tmp_path, threshold=1.0)  # finished run: reused
    assert (tmp_path / "path-L1" / "metrics.json").stat().st_mtime_ns == mtime
    report = json.loads((tmp_path / "layers.json").read_text())
    assert report["path"]["seeds"]["0"]["solved_at"] is None


def test_sweep_seeds_report_and_reuse(tmp_path):
    base = SyntheticConfig(**TINY, out_dir=str(tmp_path))
    fewest_layers(base, ["path", "rope"], [1], tmp_path, threshold=1.0)  # one seed first
    one_seed = (tmp_path / "path-L1" / "metrics.json").stat().st_mtime_ns
    # three seeds at an unreachable threshold: every seed's depth-1 score, seed 0 reused
    res = fewest_layers(base, ["path", "rope"], [1], tmp_path, threshold=1.0,
                        seeds=[0, 1, 2])
    assert (tmp_path / "path-L1" / "metrics.json").stat().st_mtime_ns == one_seed
    folders = {(attn, s): tmp_path / (f"{attn}-L1" if s == 0 else f"{attn}-L1-seed{s}")
               for attn in ("path", "rope") for s in (0, 1, 2)}
    for (attn, s), folder in folders.items():
        metrics = json.loads((folder / "metrics.json").read_text())
        assert json.loads((folder / "config.json").read_text())["seed"] == s
        assert res[attn]["seeds"][s]["runs"] == {1: solve_score(metrics, "a5")}
    mtimes = {key: (f / "metrics.json").stat().st_mtime_ns for key, f in folders.items()}
    # a threshold that rope's seed 0 reaches at depth 1 and other seeds may not: the
    # fewest depths, and so median / min / max, come out of the seeds' own scores
    scores = {s: res["rope"]["seeds"][s]["runs"][1] for s in (0, 1, 2)}
    threshold = scores[0]
    res = fewest_layers(base, ["path", "rope"], [1, 2], tmp_path, threshold=threshold,
                        seeds=[0, 1, 2])
    assert {key: (f / "metrics.json").stat().st_mtime_ns
            for key, f in folders.items()} == mtimes  # depth 1 reused everywhere
    for attn in ("path", "rope"):
        fewest = {}
        for s in (0, 1, 2):
            sweep = res[attn]["seeds"][s]
            solved = [n for n, score in sweep["runs"].items() if score >= threshold]
            fewest[s] = solved[0] if solved else None
            assert sweep["solved_at"] == fewest[s]
            assert list(sweep["runs"]) == ([1] if fewest[s] == 1 else [1, 2])
        ranked = sorted(99 if v is None else v for v in fewest.values())
        expect = [None if v == 99 else v for v in (ranked[1], ranked[0], ranked[2])]
        got = res[attn]["solved_at"]
        assert [got["median"], got["min"], got["max"]] == expect
        assert got["per_seed"] == fewest
    assert res["rope"]["seeds"][0]["solved_at"] == 1
    report = json.loads((tmp_path / "layers.json").read_text())
    assert report["rope"]["solved_at"]["per_seed"] == {
        str(s): v for s, v in res["rope"]["solved_at"]["per_seed"].items()}
    table = (tmp_path / "layers.md").read_text()
    assert table == layers_markdown(res, base, threshold)
    assert table.splitlines()[0].endswith("| seed 0 | seed 1 | seed 2 | median | min | max |")
    assert "| rope, seed 0 |" in table and "| path, seed 2 |" in table


def test_cli_layers_writes_table(tmp_path, capsys):
    out = tmp_path / "sweep"
    args = ["layers", *CLI_TINY, "--attns", "path", "rope", "--depths", "1",
            "--out", str(out)]
    assert main(args) == 0
    table = (out / "layers.md").read_text()
    assert table.splitlines()[0].startswith("| attention (a5) | 1 layer |")
    assert "| path |" in table and "| rope |" in table
    assert "wrote" in capsys.readouterr().out
    # more seeds: seed 0 is the run above (reused), seed 1 trains beside it
    mtime = (out / "path-L1" / "metrics.json").stat().st_mtime_ns
    assert main([*args, "--seeds", "0", "1"]) == 0
    assert (out / "path-L1" / "metrics.json").stat().st_mtime_ns == mtime
    assert (out / "rope-L1-seed1" / "metrics.json").exists()
    report = json.loads((out / "layers.json").read_text())
    assert list(report["path"]["seeds"]) == ["0", "1"]


@pytest.mark.parametrize("seeds, message", [
    ([], "expected at least one argument"),
    (["-3"], "seeds must be non-negative ints, got [-3]"),
    (["2", "2"], "seeds must be distinct, got [2] more than once"),
], ids=["empty", "negative", "duplicate"])
def test_cli_layers_rejects_bad_seeds(tmp_path, capsys, seeds, message):
    with pytest.raises(SystemExit):
        main(["layers", *CLI_TINY, "--depths", "1", "--seeds", *seeds, "--out",
              str(tmp_path / "x")])
    assert message in capsys.readouterr().err


def test_layers_tables_of_seeds():
    base = SyntheticConfig(**TINY)
    results = {"path": {"seeds": {0: {"solved_at": 2, "runs": {1: 0.5, 2: 0.95}},
                                  1: {"solved_at": None, "runs": {1: 0.4, 2: 0.8}}},
                        "solved_at": {"per_seed": {0: 2, 1: None}, "median": None,
                                      "min": 2, "max": None}}}
    table = layers_spread_table(results, base, 0.9)
    assert "| path | 2 | > 2 | > 2 | 2 | > 2 |" in table
    md = layers_markdown(results, base, 0.9)
    assert md.startswith(table)
    assert "| path, seed 1 | 40.0 % | 80.0 % | > 2 |" in md
    one = layers_table({"path": results["path"]["seeds"][0]}, base, 0.9)
    assert "| path | 50.0 % | 95.0 % | 2 |" in one


def test_bad_sweep_arguments(tmp_path):
    base = SyntheticConfig(**TINY, out_dir=str(tmp_path))
    with pytest.raises(ValueError, match="layers"):
        fewest_layers(base, ["path"], [0], tmp_path)
    with pytest.raises(ValueError, match="attns"):
        fewest_layers(base, ["path", "path"], [1], tmp_path)
    with pytest.raises(ValueError, match="threshold"):
        fewest_layers(base, ["path"], [1], tmp_path, threshold=1.5)
    with pytest.raises(ValueError, match="seeds"):
        fewest_layers(base, ["path"], [1], tmp_path, seeds=[1, 1])


def test_sweep_reports_cover_complete_earlier_seeds(tmp_path):
    """A sweep extended seed by seed reports every other seed whose sweep over the same
    depths is complete on disk; an incomplete one is left out. Nothing of theirs trains."""
    base = SyntheticConfig(**TINY, out_dir=str(tmp_path))
    first = fewest_layers(base, ["path"], [1], tmp_path, threshold=1.0, seeds=[0, 1])
    mtimes = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*/metrics.json")}
    res = fewest_layers(base, ["path"], [1], tmp_path, threshold=1.0, seeds=[2])
    assert list(res["path"]["seeds"]) == [2, 0, 1]  # requested first
    for s in (0, 1):
        assert res["path"]["seeds"][s] == first["path"]["seeds"][s]
    assert list(res["path"]["solved_at"]["per_seed"]) == [2, 0, 1]
    # depths 1 and 2 unsolved: seeds 0 and 1 have only depth 1, an incomplete sweep
    res = fewest_layers(base, ["path"], [1, 2], tmp_path, threshold=1.0, seeds=[2])
    assert list(res["path"]["seeds"]) == [2]
    # threshold 0: depth 1 solves, so seeds 0 and 1 are complete again
    res = fewest_layers(base, ["path"], [1, 2], tmp_path, threshold=0.0, seeds=[2])
    assert {s: r["solved_at"] for s, r in res["path"]["seeds"].items()} == {2: 1, 0: 1, 1: 1}
    assert "| path, seed 1 |" in (tmp_path / "layers.md").read_text()
    assert all(p.stat().st_mtime_ns == t for p, t in mtimes.items())
