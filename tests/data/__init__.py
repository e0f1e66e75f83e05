"""Tests of `pathattn.data`, and their helpers: small corpora written to tmp folders and
tiny tokenizers (vocab 300) trained on a few standard-library files, so that everything
runs offline in well under a second per test (the spawn-worker test takes a few)."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from pathattn.data import default_corpus_files, train_tokenizer

VOCAB = 300


def stdlib_slice(n: int = 4) -> list[Path]:
    """n small default-corpus files (2 to 20 kB), the first ones in the corpus order."""
    files = [f for f in default_corpus_files() if 2_000 <= f.stat().st_size <= 20_000]
    assert len(files) >= n
    return files[:n]


def tiny_tokenizer(out: Path, vocab_size: int = VOCAB) -> Path:
    return train_tokenizer([str(f) for f in stdlib_slice()], vocab_size, out, progress=False)


def snippets(n: int, seed: int = 0, max_chars: int = 600) -> list[str]:
    """n distinct pieces of standard-library code of 1 to max_chars characters."""
    text = "".join(f.read_text() for f in stdlib_slice())
    rng = random.Random(seed)
    out = []
    for i in range(n):
        start = rng.randrange(len(text) - max_chars)
        out.append(f"# {i}\n" + text[start:start + rng.randrange(1, max_chars)])
    return out


def write_jsonl(path: Path, texts: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: t, "id": i}) + "\n" for i, t in enumerate(texts)))
    return path


def write_corpus(folder: Path) -> Path:
    """A folder of every supported kind: text files (one empty, one nested), a JSON Lines
    file, a hidden file and a file of another extension (both skipped)."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = snippets(8, seed=1)
    (folder / "a.txt").write_text(texts[0])
    (folder / "b.md").write_text(texts[1])
    (folder / "sub").mkdir(exist_ok=True)
    (folder / "sub" / "c.py").write_text(texts[2])
    (folder / "d.rst").write_text(texts[3])
    (folder / "empty.txt").write_text("")
    (folder / ".hidden.txt").write_text("skipped")
    (folder / "data.json").write_text("{}")
    write_jsonl(folder / "records.jsonl", texts[4:])
    return folder


def parse(add_arguments, argv: list[str]) -> tuple[argparse.Namespace, argparse.ArgumentParser]:
    """Parse `argv` with a parser that has one subcommand "cmd" built by `add_arguments`,
    the way pathattn.cli registers its commands."""
    parser = argparse.ArgumentParser(prog="pathattn")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("cmd")
    add_arguments(p)
    return parser.parse_args(["cmd", *argv]), p
