"""`pathattn eval ppl` over model folders: report, training lengths, tokenizer check, and
the split between `ppl` (token streams) and `ppl_models` (model folders)."""

from __future__ import annotations

import json
import shutil

import pytest

from pathattn.evaluation import ppl, ppl_models
from pathattn.evaluation.ppl import evaluate_ppl

from . import test_ppl
from .test_ppl import TRAIN_LEN, _error, _run

assets = test_ppl.assets  # the models and data of test_ppl.py, a fixture of this module too


def test_command_writes_one_plot_and_json_for_both_models(assets, tmp_path, capsys):
    d = assets["dirs"]
    out = tmp_path / "out"
    assert _run(["--model", str(d["path"]), str(d["llama"]), "--data", str(assets["data"]),
                 "--lengths", "96", "24", "--max-docs", "1", "--batch-size", "4",
                 "--out", str(out), "--no-progress"]) == 0
    report = json.loads((out / "ppl.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == ["loss_by_position.png", "ppl.json"]
    assert (out / "loss_by_position.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report["lengths"] == [24, 96] and report["split"] == "val"
    assert report["tokens"] == len(assets["tokens"]) and report["documents"] == 1
    path, llama = report["models"]
    assert (path["name"], llama["name"]) == ("run", "llama")
    assert (path["train_length"], llama["train_length"]) == (TRAIN_LEN, 96)
    assert "seq_len" in path["train_length_source"]
    assert "max_position_embeddings" in llama["train_length_source"]
    for m, name in ((path, "path"), (llama, "llama")):
        direct = evaluate_ppl(assets["models"][name], assets["tokens"], [24, 96])
        assert m["ppl"]["24"] == pytest.approx(direct["ppl"][24], rel=1e-6)
        assert m["loss_by_position"]["length"] == 96
        assert m["loss_by_position"]["bins"][-1]["end"] == 97
    table = capsys.readouterr().out
    assert "| model | train length | ppl @ 24 | ppl @ 96 |" in table
    assert f"| run | {TRAIN_LEN} | {path['ppl']['24']:.3f} |" in table



def test_a_model_with_another_tokenizer_is_refused(assets, tmp_path, capsys):
    """Another vocabulary size; the same size but other merges, checked against the data's
    tokenizer folder, and (with that folder gone) by re-encoding the first document."""
    from transformers import AutoTokenizer

    from pathattn.cli import main

    root, data = assets["root"], assets["data"]
    corpus = tmp_path / "corpus"
    shutil.copytree(root / "corpus", corpus, ignore=shutil.ignore_patterns("json_*"))
    for vocab in ("400", "512"):
        assert main(["tokenizer", "--input", str(corpus), "--vocab-size", vocab,
                     "--out", str(tmp_path / f"tok{vocab}")]) == 0
        other = tmp_path / f"model{vocab}"
        shutil.copytree(assets["dirs"]["llama"], other)
        AutoTokenizer.from_pretrained(tmp_path / f"tok{vocab}").save_pretrained(other)
    assert len(AutoTokenizer.from_pretrained(tmp_path / "tok512")) == 512
    err = _error(["--model", str(tmp_path / "model400"), "--data", str(data)], capsys)
    assert "--model" in err and "not the one the data was prepared with" in err
    assert "its identity is sha256" in err and "400 ids" in err and "512 ids" in err
    err = _error(["--model", str(tmp_path / "model512"), "--data", str(data)], capsys)
    assert err.count("512 ids") == 2 and err.count("sha256") == 2  # same size, other merges
    # data prepared before identities were recorded: the vocabulary, then the first document
    old = tmp_path / "data_before_identities"
    shutil.copytree(data, old)
    meta = json.loads((old / "meta.json").read_text())
    del meta["tokenizer"]["identity"]
    (old / "meta.json").write_text(json.dumps(meta))
    err = _error(["--model", str(tmp_path / "model512"), "--data", str(old)], capsys)
    assert "vocabulary differs" in err
    moved = tmp_path / "data_without_tokenizer"
    shutil.copytree(old, moved)
    meta["tokenizer"]["path"] = str(tmp_path / "gone")
    (moved / "meta.json").write_text(json.dumps(meta))
    err = _error(["--model", str(tmp_path / "model512"), "--data", str(moved)], capsys)
    assert "re-encode" in err
    assert _run(["--model", str(assets["dirs"]["llama"]), "--data", str(moved),
                 "--lengths", "16", "--max-docs", "1", "--no-progress"]) == 0


def test_ppl_scores_streams_and_ppl_models_owns_the_folders():
    """One concern per module: model folders live in ppl_models only, and ppl has no
    module __getattr__ forwarding to it."""
    assert not hasattr(ppl, "__getattr__")
    for name in ppl_models.__all__:
        assert name not in ppl.__all__ and not hasattr(ppl, name)
    assert ppl_models.open_split is ppl.open_split
