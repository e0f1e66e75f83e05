"""`pathattn compare`: one run per attention type and seed, tables, the per-seed final
metrics with their median / min / max, and a plot; resume reuses finished runs."""

from __future__ import annotations

import json

import pytest

from pathattn.cli import main
from pathattn.train import SyntheticConfig, compare, markdown_table
from pathattn.train.compare import results_markdown, seed_report, spread_table

TINY = ["--task", "flipflop", "--layers", "1", "--heads", "2", "--dim", "16", "--steps", "4",
        "--batch-size", "2", "--num-pairs", "8", "--eval-every", "2", "--eval-batches", "1",
        "--final-eval-batches", "1", "--checkpoint-every", "4", "--no-progress"]
SPLITS = ("val", "val_sparse", "val_dense")


def _mtimes(run_dir) -> dict[str, int]:
    """mtime of every file of a run (metrics, logs, checkpoints): a retrained run changes
    them."""
    return {str(p.relative_to(run_dir)): p.stat().st_mtime_ns
            for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != ".lock"}


def _median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def test_compare_writes_table_json_and_plot(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", *TINY, "--attns", "path", "rope", "--out", str(out)]) == 0
    report = json.loads((out / "results.json").read_text())
    assert set(report) == {"path", "rope"}
    for attn in ("path", "rope"):
        assert list(report[attn]["seeds"]) == ["0"]  # the config's seed only
        final = report[attn]["seeds"]["0"]
        assert final == json.loads((out / attn / "metrics.json").read_text())
        assert final["step"] == 4
        records = [json.loads(x) for x in (out / attn / "eval.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records] == [2, 4]
        assert all(isinstance(r["val_dense"], float) for r in records)  # flat records
        for split in SPLITS:
            assert report[attn]["errors"][split] == {
                "per_seed": {"0": final[split]}, "median": final[split],
                "min": final[split], "max": final[split]}
    table = (out / "results.md").read_text()
    assert table.splitlines()[0] == ("| attention (flipflop) | step | val error | "
                                     "val_sparse error | val_dense error |")
    finals = {attn: report[attn]["seeds"]["0"] for attn in ("path", "rope")}
    assert table == markdown_table(finals, "flipflop")  # one seed: the one-table layout
    assert (out / "error_vs_step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| path | 4 |" in capsys.readouterr().out


def test_seeds_report_spread_and_resume_reuses_runs(tmp_path, capsys):
    out = tmp_path / "cmp"
    # a one-seed comparison first (the layout before --seeds) ...
    assert main(["compare", *TINY, "--attns", "path", "rope", "--out", str(out)]) == 0
    before = {attn: _mtimes(out / attn) for attn in ("path", "rope")}
    # ... then more seeds: the seed-0 runs are reused, seeds 1 and 2 train beside them
    seeds = ["--seeds", "0", "1", "2"]
    assert main(["compare", *TINY, "--attns", "path", "rope", *seeds, "--out", str(out),
                 "--resume"]) == 0
    assert {attn: _mtimes(out / attn) for attn in ("path", "rope")} == before
    runs = {(attn, seed): out / (attn if seed == 0 else f"{attn}-seed{seed}")
            for attn in ("path", "rope") for seed in (0, 1, 2)}
    report = json.loads((out / "results.json").read_text())
    for attn in ("path", "rope"):
        assert list(report[attn]["seeds"]) == ["0", "1", "2"]
        for seed in (0, 1, 2):
            run = runs[attn, seed]
            assert json.loads((run / "config.json").read_text())["seed"] == seed
            final = json.loads((run / "metrics.json").read_text())
            assert report[attn]["seeds"][str(seed)] == final
        for split in SPLITS:
            values = [json.loads((runs[attn, s] / "metrics.json").read_text())[split]
                      for s in (0, 1, 2)]
            spread = report[attn]["errors"][split]
            assert spread["per_seed"] == {str(s): v for s, v in zip((0, 1, 2), values, strict=True)}
            assert spread["median"] == pytest.approx(_median(values))
            assert (spread["min"], spread["max"]) == (min(values), max(values))
    # seeds give different runs (model init and data)
    assert report["path"]["seeds"]["0"] != report["path"]["seeds"]["1"]
    table = (out / "results.md").read_text()
    assert table.startswith("| attention (flipflop) | seeds | val error: median [min, max] |")
    assert "| path | 0 1 2 |" in table and "| rope, seed 2 | 4 |" in table
    assert (out / "error_vs_step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # everything finished: a resumed comparison trains nothing
    every = {key: _mtimes(run) for key, run in runs.items()}
    capsys.readouterr()
    assert main(["compare", *TINY, "--attns", "path", "rope", *seeds, "--out", str(out),
                 "--resume"]) == 0
    assert {key: _mtimes(run) for key, run in runs.items()} == every
    assert json.loads((out / "results.json").read_text()) == report
    assert capsys.readouterr().out.startswith(table)


def test_python_api_seeds_and_even_median(tmp_path):
    base = SyntheticConfig(task="flipflop", dim=16, heads=2, steps=2, batch_size=2, num_pairs=8,
                       eval_every=2, eval_batches=1, final_eval_batches=1,
                       checkpoint_every=2, progress=False, seed=3, out_dir=str(tmp_path))
    report = compare(base, ["path"], tmp_path, seeds=[5, 3])
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["path", "path-seed5"]
    errors = report["path"]["errors"]["val"]
    assert list(errors["per_seed"]) == [5, 3]
    a, b = errors["per_seed"].values()
    assert errors["median"] == pytest.approx((a + b) / 2)
    assert (errors["min"], errors["max"]) == (min(a, b), max(a, b))


@pytest.mark.parametrize("seeds, message", [
    ([], "expected at least one argument"),
    (["0", "-1"], "seeds must be non-negative ints, got [-1]"),
    (["1", "2", "1"], "seeds must be distinct, got [1] more than once"),
    (["x"], "invalid int value"),
], ids=["empty", "negative", "duplicate", "not-int"])
def test_cli_rejects_bad_seeds(tmp_path, capsys, seeds, message):
    with pytest.raises(SystemExit):
        main(["compare", *TINY, "--seeds", *seeds, "--out", str(tmp_path / "x")])
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x" / "path").exists()  # nothing trained


@pytest.mark.parametrize("seeds", [[], [-1], [0, 0], [True], "01", [1.5]],
                         ids=["empty", "negative", "duplicate", "bool", "str", "float"])
def test_api_rejects_bad_seeds(tmp_path, seeds):
    base = SyntheticConfig(task="flipflop", dim=16, heads=2, steps=2, out_dir=str(tmp_path))
    with pytest.raises(ValueError, match="seeds"):
        compare(base, ["path"], tmp_path, seeds=seeds)


def test_markdown_table_percentages():
    table = markdown_table({"path": {"step": 10, "val": 0.0005, "val_sparse": 0.01,
                                     "val_dense": 0.0}}, "flipflop")
    assert "| path | 10 | 0.05 % | 1 % | 0 % |" in table


@pytest.mark.parametrize("attns", [["path", "path"], ["nope"]], ids=["duplicate", "unknown"])
def test_compare_rejects_bad_attns(tmp_path, attns):
    with pytest.raises(SystemExit):
        main(["compare", *TINY, "--attns", *attns, "--out", str(tmp_path / "x")])


def test_markdown_table_shows_counts_when_known():
    table = markdown_table({"path": {"step": 10, "val": 0.0, "val_scored": 2500,
                                     "val_sparse": 0.25, "val_sparse_scored": 8,
                                     "val_dense": 0.0}}, "flipflop")
    assert "| path | 10 | 0 % (0 / 2500) | 25 % (2 / 8) | 0 % |" in table


def test_spread_table_and_results_markdown():
    runs = {0: {"step": 10, "val": 0.0, "val_sparse": 0.2, "val_dense": 0.0},
            1: {"step": 10, "val": 0.0, "val_sparse": 0.0, "val_dense": 0.38},
            2: {"step": 10, "val": 0.01, "val_sparse": 0.05, "val_dense": 0.0}}
    report = seed_report({"path": runs}, "flipflop")
    assert report["path"]["errors"]["val_sparse"] == {
        "per_seed": {0: 0.2, 1: 0.0, 2: 0.05}, "median": 0.05, "min": 0.0, "max": 0.2}
    table = spread_table(report, "flipflop")
    assert "| path | 0 1 2 | 0 % [0 %, 1 %] | 5 % [0 %, 20 %] | 0 % [0 %, 38 %] |" in table
    md = results_markdown(report, "flipflop")
    assert md.startswith(table) and "| path, seed 1 | 10 | 0 % | 0 % | 38 % |" in md


def test_compare_takes_model_args(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", *TINY, "--attns", "path", "--model-arg", "beta_max=1.5",
                 "--out", str(out)]) == 0
    assert json.loads((out / "path" / "config.json").read_text())["model"] == {"beta_max": 1.5}
    with pytest.raises(SystemExit):
        main(["compare", *TINY, "--model-arg", "beta_max", "--out", str(tmp_path / "x")])
    assert "--model-arg: expected KEY=VALUE" in capsys.readouterr().err


def test_reports_cover_earlier_seeds_of_the_same_config(tmp_path):
    """A comparison extended seed by seed reports every finished seed of its config in the
    folder; a run of another config, or unfinished, is left out."""
    out = tmp_path / "cmp"
    assert main(["compare", *TINY, "--attns", "path", "--seeds", "0", "1", "--out",
                 str(out)]) == 0
    first = json.loads((out / "results.json").read_text())
    # seed 3 of another config (more steps) and an unfinished seed 4 beside them
    other = [x if x != "4" else "6" for x in TINY]  # --steps 4 -> 6 (checkpoints at 4)
    assert main(["train", *other, "--attn", "path", "--seed", "3", "--out",
                 str(out / "path-seed3")]) == 0
    (out / "path-seed4").mkdir()
    (out / "path-seed4" / "config.json").write_text(
        (out / "path-seed1" / "config.json").read_text().replace('"seed": 1', '"seed": 4'))
    assert main(["compare", *TINY, "--attns", "path", "--seeds", "2", "--out",
                 str(out)]) == 0
    report = json.loads((out / "results.json").read_text())
    assert list(report["path"]["seeds"]) == ["2", "0", "1"]  # requested first
    for seed in ("0", "1"):
        assert report["path"]["seeds"][seed] == first["path"]["seeds"][seed]
    assert list(report["path"]["errors"]["val"]["per_seed"]) == ["2", "0", "1"]
    assert "| path | 2 0 1 |" in (out / "results.md").read_text()
