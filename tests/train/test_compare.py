"""`pathattn compare`: one run per attention type, a table, the final metrics and a plot."""

from __future__ import annotations

import json

import pytest

from pathattn.cli import main
from pathattn.train import markdown_table

TINY = ["--task", "flipflop", "--layers", "1", "--heads", "2", "--dim", "16", "--steps", "4",
        "--batch-size", "2", "--num-pairs", "8", "--eval-every", "2", "--eval-batches", "1",
        "--final-eval-batches", "1", "--checkpoint-every", "4", "--no-progress"]


def test_compare_writes_table_json_and_plot(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", *TINY, "--attns", "path", "rope", "--out", str(out)]) == 0
    final = json.loads((out / "results.json").read_text())
    assert set(final) == {"path", "rope"}
    for attn in ("path", "rope"):
        assert final[attn]["step"] == 4
        assert (out / attn / "metrics.json").exists()
        records = [json.loads(x) for x in (out / attn / "eval.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records] == [2, 4]
        assert all(isinstance(r["val_dense"], float) for r in records)  # flat records
    table = (out / "results.md").read_text()
    assert table.splitlines()[0] == ("| attention (flipflop) | step | val error | "
                                     "val_sparse error | val_dense error |")
    assert table == markdown_table(final, "flipflop")
    assert (out / "error_vs_step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| path | 4 |" in capsys.readouterr().out


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
