"""`pathattn.data.prepare` and `TokenDataset`: the files and meta.json, BOS / EOS around
every document, the same bytes for any number of workers, the split by document hash,
the default corpus record, atomic and guarded output, the errors, and the CLI half."""

from __future__ import annotations

import hashlib
import json
import platform

import numpy as np
import pytest
from transformers import PreTrainedTokenizerFast

import pathattn.data.corpus as corpus_module
from pathattn.cli.prepare import add_arguments as add_prepare_arguments
from pathattn.cli.prepare import run as run_prepare
from pathattn.data import (
    DataError,
    TokenDataset,
    load_tokenizer,
    prepare_dataset,
    split_key,
    token_dtype,
)
from pathattn.data.prepare import DATA_FILES
from pathattn.utils.folder_lock import LOCK_NAME

from . import parse, snippets, stdlib_slice, tiny_tokenizer, write_corpus, write_jsonl


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tok"))


def prepare(inputs, tok_dir, out, **kw):
    kw = {"val_fraction": 0.3, "workers": 1, "progress": False, **kw}
    return prepare_dataset([str(p) for p in inputs], tok_dir, out, **kw)


def documents(out, split):
    data = TokenDataset(out, split)
    return [data[d] for d in range(len(data))]


def test_files_meta_and_documents(tok_dir, tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    meta = prepare([corpus], tok_dir, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        [*DATA_FILES, LOCK_NAME])
    tok = load_tokenizer(tok_dir)
    texts = [corpus / n for n in ("a.txt", "b.md", "d.rst", "sub/c.py")]
    texts = [p.read_text() for p in texts] + snippets(8, seed=1)[4:]
    decoded = []
    for split in ("train", "val"):
        data = TokenDataset(tmp_path / "out", split)
        assert data.tokens.dtype == np.uint16 and meta["dtype"] == "uint16"
        assert (len(data), data.num_tokens) == tuple(meta["splits"][split].values())
        for doc in documents(tmp_path / "out", split):
            assert doc[0] == tok.bos_token_id and doc[-1] == tok.eos_token_id
            decoded.append(tok.decode(doc[1:-1]))
    assert sorted(decoded) == sorted(texts)  # every non-empty document once, exactly
    assert meta["skipped_empty_documents"] == 1 and meta["python"] is None
    [source] = meta["sources"]
    assert (source["kind"], source["files"], source["documents"]) == ("folder", 6, 8)
    assert meta["tokenizer"]["vocab_size"] == len(tok) and meta["tokenizer"]["eos_id"] == 1
    assert (meta["val_fraction"], meta["seed"]) == (0.3, 0)
    assert json.loads((tmp_path / "out" / "meta.json").read_text()) == meta


def test_same_bytes_for_any_number_of_workers(tok_dir, tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    inputs = [corpus, *stdlib_slice(6)]
    prepare(inputs, tok_dir, tmp_path / "one", workers=1)
    prepare(inputs, tok_dir, tmp_path / "two", workers=2)
    for name in DATA_FILES:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


def test_split_is_by_hash_of_seed_and_text(tok_dir, tmp_path):
    texts = snippets(40, seed=2)
    texts.append(texts[0])  # a duplicate lands in its twin's split
    path = write_jsonl(tmp_path / "r.jsonl", texts)
    tok = load_tokenizer(tok_dir)
    splits = {}
    for seed in (0, 1):
        prepare([path], tok_dir, tmp_path / f"s{seed}", seed=seed, val_fraction=0.25)
        val = {tok.decode(d[1:-1]) for d in documents(tmp_path / f"s{seed}", "val")}
        assert val == {t for t in texts if split_key(t, seed) < 0.25 * 2 ** 64}
        splits[seed] = val
    assert splits[0] != splits[1]
    prepare([path], tok_dir, tmp_path / "again", seed=0, val_fraction=0.25)
    assert (tmp_path / "again" / "val.bin").read_bytes() == \
        (tmp_path / "s0" / "val.bin").read_bytes()


def test_tokenizer_without_bos_gives_documents_ending_with_eos_only(tok_dir, tmp_path):
    plain = PreTrainedTokenizerFast(tokenizer_file=str(tok_dir / "tokenizer.json"),
                                    eos_token="<|eos|>")
    plain.save_pretrained(tmp_path / "eos_only")
    path = write_jsonl(tmp_path / "r.jsonl", snippets(3))
    meta = prepare([path], tmp_path / "eos_only", tmp_path / "out", val_fraction=0.0)
    assert meta["bos"] is False and meta["tokenizer"]["pad_id"] == 1  # pad falls back to eos
    for doc, text in zip(documents(tmp_path / "out", "train"), snippets(3), strict=True):
        assert doc[-1] == 1 and 0 not in doc.tolist()
        assert plain.decode(doc[:-1]) == text


def test_default_corpus_records_python_version_and_hash(tok_dir, tmp_path, monkeypatch):
    files = stdlib_slice(3)
    monkeypatch.setattr(corpus_module, "default_corpus_files",
                        lambda include_tests=False: files)
    meta = prepare_dataset(None, tok_dir, tmp_path / "out", val_fraction=0.0, workers=1,
                           progress=False)
    [source] = meta["sources"]
    root = corpus_module.Path(corpus_module.sysconfig.get_paths()["stdlib"]).resolve()
    lines = "".join(f"{f.resolve().relative_to(root).as_posix()}\0"
                    f"{hashlib.sha256(f.read_bytes()).hexdigest()}\n" for f in files)
    assert source["sha256"] == hashlib.sha256(lines.encode()).hexdigest()
    assert source["kind"] == "python-stdlib" and source["files"] == 3
    assert meta["python"] == source["python"] == platform.python_version()


def test_overwrite_replaces_own_files_only(tok_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    mine = ["notes.txt", ".notes.txt.0123abcd.tmp"]  # not ours, even of our temp pattern
    for name in [*mine, ".train.bin.0123abcd.tmp"]:  # the last: left by a killed run
        (out / name).write_text("x")
    path = write_jsonl(tmp_path / "r.jsonl", snippets(20))
    with pytest.raises(DataError, match="not empty"):
        prepare([path], tok_dir, out)
    prepare([path], tok_dir, out, overwrite=True)
    prepare([path], tok_dir, out, overwrite=True, seed=1)
    assert sorted(p.name for p in out.iterdir()) == sorted([*DATA_FILES, *mine, LOCK_NAME])


def test_failed_prepare_leaves_the_previous_dataset(tok_dir, tmp_path):
    out = tmp_path / "out"
    good = write_jsonl(tmp_path / "good.jsonl", snippets(20))
    prepare([good], tok_dir, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bad = write_jsonl(tmp_path / "bad.jsonl", snippets(20))
    with open(bad, "a") as f:
        f.write('{"body": "no text"}\n')  # fails after 20 documents were written
    with pytest.raises(DataError, match="bad.jsonl:21"):
        prepare([bad], tok_dir, out, overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no temp file either


@pytest.mark.parametrize("token_vocab,dtype", [(300, np.uint16), (65536, np.uint16),
                                               (65537, np.uint32)], ids=str)
def test_token_dtype(token_vocab, dtype):
    assert token_dtype(token_vocab) == dtype


@pytest.mark.parametrize("case,match", [
    ("missing-input", "no such file"),
    ("jsonl-without-text", "no 'text' field"),
    ("empty-corpus", "empty corpus"),
    ("only-empty-documents", "empty corpus"),
    ("val-empty", "validation split is empty"),
    ("val-fraction-1", "val_fraction"),
    ("workers-0", "workers"),
    ("seed-negative", "seed"),
    ("not-a-tokenizer", "tokenizer"),
], ids=str)
def test_errors(tok_dir, tmp_path, case, match):
    (tmp_path / "empty").mkdir()
    (tmp_path / "blank.txt").write_text("")
    write_jsonl(tmp_path / "bad.jsonl", ["fine"])
    with open(tmp_path / "bad.jsonl", "a") as f:
        f.write('{"content": "x"}\n')
    one = write_jsonl(tmp_path / "one.jsonl", snippets(1))
    inputs, kw = {
        "missing-input": ([tmp_path / "nope.txt"], {}),
        "jsonl-without-text": ([tmp_path / "bad.jsonl"], {}),
        "empty-corpus": ([tmp_path / "empty"], {}),
        "only-empty-documents": ([tmp_path / "blank.txt"], {}),
        "val-empty": ([one], {"val_fraction": 0.01}),
        "val-fraction-1": ([one], {"val_fraction": 1.0}),
        "workers-0": ([one], {"workers": 0}),
        "seed-negative": ([one], {"seed": -1}),
        "not-a-tokenizer": ([one], {"tokenizer": tmp_path / "empty"}),
    }[case]
    tok = kw.pop("tokenizer", tok_dir)
    with pytest.raises(DataError, match=match):
        prepare(inputs, tok, tmp_path / "out", **kw)


def test_dataset_refuses_incomplete_or_altered_folders(tok_dir, tmp_path):
    out = tmp_path / "out"
    prepare([write_jsonl(tmp_path / "r.jsonl", snippets(20))], tok_dir, out)
    with open(out / "train.bin", "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(DataError, match="train.bin"):
        TokenDataset(out)
    (out / "meta.json").unlink()
    with pytest.raises(DataError, match="no meta.json"):
        TokenDataset(out, "val")


def test_cli_half(tok_dir, tmp_path, capsys):
    path = write_jsonl(tmp_path / "r.jsonl", snippets(10))
    argv = ["--input", str(path), "--tokenizer", str(tok_dir), "--out", str(tmp_path / "o"),
            "--val-fraction", "0.3", "--workers", "1", "--seed", "3", "--no-progress"]
    args, parser = parse(add_prepare_arguments, argv)
    assert args.run is run_prepare and args.run(args, parser) == 0
    assert "train /" in capsys.readouterr().out
    assert json.loads((tmp_path / "o" / "meta.json").read_text())["seed"] == 3
    args, parser = parse(add_prepare_arguments, argv)
    with pytest.raises(SystemExit) as e:
        args.run(args, parser)
    assert e.value.code == 2 and "not empty" in capsys.readouterr().err
