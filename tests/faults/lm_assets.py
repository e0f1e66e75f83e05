"""Tiny assets of the language-model fault tests: two tokenizers of one size (300 ids, the
same special ids) trained on other text, so that only their identity tells them apart, a
prepared folder of each, and one finished 2-step `pathattn pretrain` run on the first."""

from __future__ import annotations

import contextlib
import io
import shutil
from dataclasses import dataclass
from pathlib import Path

from pathattn.cli import main
from tests.data import snippets, stdlib_slice

VOCAB = 300
# the options of every tiny pretraining run here (seconds on 2 cores)
TINY_RUN = ["--preset", "cpu-tiny", "--steps", "2", "--seq-len", "32", "--batch-size", "2",
            "--warmup-steps", "1", "--eval-every", "2", "--eval-batches", "1",
            "--final-eval-batches", "1", "--log-every", "1", "--checkpoint-every", "1",
            "--no-progress"]


@dataclass
class LMAssets:
    root: Path
    corpus: Path  # a folder of text files
    tok_a: Path
    tok_b: Path  # the same size and special ids as tok_a, other merges
    data_a: Path  # prepared with tok_a (val_fraction 0.3)
    data_b: Path  # prepared with tok_b
    run_a: Path  # a finished 2-step run on data_a, exported to run_a/hf
    load_line: str  # the load hint `pathattn pretrain` printed for run_a/hf


def write_text_corpus(folder: Path, n: int = 12, seed: int = 0) -> Path:
    """`n` snippets of standard-library code as text files in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(snippets(n, seed=seed)):
        (folder / f"doc{i:02d}.txt").write_text(text)
    return folder


def tokenizer_and_data(root: Path, source: Path, name: str, corpus: Path,
                       val_fraction: str = "0.3") -> tuple[Path, Path]:
    """A VOCAB-id tokenizer trained on `source` (root/tok_<name>) and `corpus` prepared
    with it (root/data_<name>)."""
    tok, data = root / f"tok_{name}", root / f"data_{name}"
    assert main(["tokenizer", "--input", str(source), "--vocab-size", str(VOCAB),
                 "--out", str(tok), "--no-progress"]) == 0
    prepare(corpus, tok, data, val_fraction)
    return tok, data


def prepare(corpus: Path, tok: Path, data: Path, val_fraction: str = "0.3") -> Path:
    assert main(["prepare", "--input", str(corpus), "--tokenizer", str(tok), "--out",
                 str(data), "--val-fraction", val_fraction, "--workers", "1",
                 "--no-progress"]) == 0
    return data


def make_assets(root: Path) -> LMAssets:
    corpus = write_text_corpus(root / "corpus")
    first, second = stdlib_slice(2)
    tok_a, data_a = tokenizer_and_data(root, first, "a", corpus)
    tok_b, data_b = tokenizer_and_data(root, second, "b", corpus)
    run_a = root / "run_a"
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(["pretrain", "--data", str(data_a), *TINY_RUN, "--out", str(run_a)]) == 0
    printed = out.getvalue()
    load_line = printed.split("(load it in a process that imported pathattn: ")[1]
    return LMAssets(root, corpus, tok_a, tok_b, data_a, data_b, run_a,
                    load_line.split(")\n")[0])


def copy_prepared(assets: LMAssets, out: Path, val_fraction: str = "0.3"
                  ) -> tuple[Path, Path]:
    """A tokenizer folder of its own (a copy of tok_a) and the corpus prepared with it,
    under `out`: for tests that change or delete the tokenizer afterwards."""
    own = out / "tok"
    shutil.copytree(assets.tok_a, own)
    return own, prepare(assets.corpus, own, out / "data", val_fraction)
