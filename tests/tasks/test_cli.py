"""`pathattn data`: valid JSONL of the right shapes for every task, in-process through
`main([...])` and once through `python -m pathattn`; option checking."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pathattn.cli import main

CASES = {
    "flipflop": (["--split", "val_sparse"], 512),
    "a5": (["--alphabet", "generators", "--length", "12"], 12),
    "s5": (["--length", "10"], 10),
    "mqrar": (["--n-back", "3", "--keys", "4", "--length", "40"], 40),
}


def _read(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("task", list(CASES))
def test_data_writes_jsonl(task, tmp_path):
    extra, length = CASES[task]
    out = tmp_path / f"{task}.jsonl"
    assert main(["data", task, "--n", "5", "--out", str(out), "--seed", "1", *extra]) == 0
    records = _read(out)
    assert len(records) == 5
    for rec in records:
        assert set(rec) == {"tokens", "targets"}
        assert len(rec["tokens"]) == len(rec["targets"]) == length
        assert all(isinstance(t, str) for t in rec["tokens"])
        assert all(t is None or isinstance(t, str) for t in rec["targets"])
    if task == "flipflop":
        for rec in records:
            assert rec["targets"] == rec["tokens"][1:] + [None]
    if task == "mqrar":
        assert all(t is None for rec in records for t in rec["targets"][1::2])
    again = tmp_path / "again.jsonl"
    main(["data", task, "--n", "5", "--out", str(again), "--seed", "1", *extra])
    assert _read(again) == records


def test_n_larger_than_a_batch(tmp_path):
    out = tmp_path / "a5.jsonl"
    main(["data", "a5", "--n", "150", "--length", "3", "--out", str(out)])
    records = _read(out)
    assert len(records) == 150 and len({tuple(r["tokens"]) for r in records}) > 100


@pytest.mark.parametrize("argv", [["flipflop", "--keys", "3"], ["a5", "--split", "val"],
                                  ["mqrar", "--length", "7"], ["s5", "--alphabet", "cycles"]],
                         ids=["keys-for-flipflop", "split-for-a5", "odd-length", "bad-alphabet"])
def test_rejects_bad_options(argv, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["data", *argv, "--n", "1", "--out", str(tmp_path / "x.jsonl")])
    assert e.value.code == 2


def test_python_m_pathattn(tmp_path):
    out = tmp_path / "mqrar.jsonl"
    subprocess.run([sys.executable, "-m", "pathattn", "data", "mqrar", "--n", "3",
                    "--length", "16", "--out", str(out)], check=True, capture_output=True)
    records = _read(out)
    assert len(records) == 3 and all(len(r["tokens"]) == 16 for r in records)
