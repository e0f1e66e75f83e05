"""`pathattn.data.tokenizer`: the trained byte-level BPE loads with AutoTokenizer with its
special tokens and round-trips text exactly, training is deterministic, a tokenizer
without eos is refused, the options are validated, --out is guarded, and the CLI half
works. Vocab 300 on four small standard-library files."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from pathattn.cli.tokenizer import add_arguments as add_tokenizer_arguments
from pathattn.cli.tokenizer import run as run_tokenizer
from pathattn.data import SPECIAL_TOKENS, DataError, load_tokenizer, special_ids, train_tokenizer

from . import VOCAB, parse, snippets, stdlib_slice, tiny_tokenizer


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tok"))


def test_trained_tokenizer_loads_with_autotokenizer(tok_dir):
    names = {p.name for p in tok_dir.iterdir()}
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= names
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    assert len(tok) == VOCAB
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == tuple(SPECIAL_TOKENS.values())
    assert special_ids(tok) == {"bos_id": 0, "eos_id": 1, "pad_id": 2}
    for text in snippets(5) + ["héllo wörld ✓ \t\n  x", ""]:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text  # byte level: exact, no unknown token
        assert tok(text)["input_ids"] == [tok.bos_token_id, *ids]  # add_bos_token
    record = json.loads((tok_dir / "pathattn_tokenizer.json").read_text())
    assert record["vocab_size"] == VOCAB and len(record["sources"]) == len(stdlib_slice())


def test_training_is_deterministic(tok_dir, tmp_path):
    again = tiny_tokenizer(tmp_path / "again")
    assert (again / "tokenizer.json").read_bytes() == (tok_dir / "tokenizer.json").read_bytes()


def test_tokenizer_without_eos_is_refused(tok_dir, tmp_path):
    plain = PreTrainedTokenizerFast(tokenizer_file=str(tok_dir / "tokenizer.json"),
                                    bos_token="<|bos|>")
    plain.save_pretrained(tmp_path / "no_eos")
    with pytest.raises(DataError, match="no eos token"):
        load_tokenizer(tmp_path / "no_eos")
    with pytest.raises(DataError, match="not a folder"):
        load_tokenizer(tmp_path / "missing")


@pytest.mark.parametrize("option,value,match", [
    ("vocab_size", 100, "vocab_size"),
    ("vocab_size", 300.0, "vocab_size"),
    ("min_frequency", -1, "min_frequency"),
    ("text_field", "", "text_field"),
], ids=lambda v: str(v))
def test_options_are_validated(tmp_path, option, value, match):
    kw = {"vocab_size": VOCAB, option: value}
    with pytest.raises(DataError, match=match):
        train_tokenizer([str(stdlib_slice(1)[0])], out=tmp_path / "t", progress=False, **kw)


def test_out_is_guarded_and_overwrite_keeps_other_files(tmp_path):
    out = tmp_path / "tok"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match="not empty"):
        tiny_tokenizer(out)
    train_tokenizer([str(stdlib_slice(1)[0])], VOCAB, out, overwrite=True, progress=False)
    assert (out / "notes.txt").read_text() == "mine"
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    assert len(load_tokenizer(out)) == VOCAB


def test_cli_half(tmp_path, capsys):
    src = [str(f) for f in stdlib_slice(2)]
    args, parser = parse(add_tokenizer_arguments, ["--input", *src, "--vocab-size", "280",
                                                   "--out", str(tmp_path / "t"),
                                                   "--no-progress"])
    assert args.run is run_tokenizer and args.inputs == src
    assert args.run(args, parser) == 0
    assert "280-token" in capsys.readouterr().out
    args, parser = parse(add_tokenizer_arguments, ["--input", src[0], "--out",
                                                   str(tmp_path / "t"), "--no-progress"])
    with pytest.raises(SystemExit) as e:  # --out not empty
        args.run(args, parser)
    assert e.value.code == 2 and "not empty" in capsys.readouterr().err
