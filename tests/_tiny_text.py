"""A tiny local text corpus, its 300-token tokenizer and the prepared folder, for tests that
need real `pathattn tokenizer` / `pathattn prepare` outputs (built in about a second)."""

from __future__ import annotations

import random
from pathlib import Path

WORDS = "the a river stone mill cloud hill boat shore bird light road town green blue".split()


def tiny_prepared(root: Path) -> tuple[Path, Path]:
    """(tokenizer folder, prepared folder) under root: sixteen short documents (about 7 in
    the validation split), a 300-token byte-level BPE."""
    from pathattn.cli import main

    (root / "corpus").mkdir()
    rng = random.Random(0)
    for i in range(16):
        words = [rng.choice(WORDS) for _ in range(rng.randrange(20, 60))]
        (root / "corpus" / f"doc{i}.txt").write_text(" ".join(words) + ".\n")
    assert main(["tokenizer", "--input", str(root / "corpus"), "--vocab-size", "300",
                 "--out", str(root / "tok"), "--no-progress"]) == 0
    assert main(["prepare", "--input", str(root / "corpus"), "--tokenizer", str(root / "tok"),
                 "--out", str(root / "data"), "--val-fraction", "0.4", "--workers", "1"]) == 0
    return root / "tok", root / "data"
