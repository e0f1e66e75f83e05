"""Haystacks: the filler text that needles (`niah`) and assignments (`vt`) hide in.

A haystack is an endless stream of words, each with its trailing whitespace, so that the
first n words joined give back the text exactly and a prompt grows one word at a time
(`common.fit_length`). Two sources:

- "noise": `NOISE`, a short paragraph of plain sentences repeated (the repetition carries
  no information, so only the inserted sentences matter);
- a corpus: a list of texts (or files, `read_corpus`), taken in a seeded order and
  cycled when the haystack needs more words than the corpus
  holds; documents are separated by a blank line.

`insert` places sentences at relative depths (0 = start, 1 = end) in the first n words:
depth d goes after word round(d n), moved back to the nearest end of a sentence (a word
ending in . ! ? or followed by a newline) so that a needle never splits a sentence; when no
sentence ends before it, at the start.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Sequence
from pathlib import Path

__all__ = ["NOISE", "Haystack", "read_corpus", "insert"]

NOISE = ("The river bends slowly past the old stone mill. Clouds drift over the quiet "
         "hills. A small wooden boat rests by the shore. Birds sing in the morning light. "
         "The road winds on toward the distant town. ")

_WORD = re.compile(r"\S+\s*")
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s*$|\n")


def read_corpus(paths: str | os.PathLike | Sequence[str | os.PathLike],
                text_field: str = "text") -> list[str]:
    """The documents of text files (one document each) and .jsonl files (the `text_field`
    of each record)."""
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    docs = []
    for path in map(Path, paths):
        if path.suffix == ".jsonl":
            with path.open(encoding="utf-8") as f:
                docs += [json.loads(line)[text_field] for line in f if line.strip()]
        else:
            docs.append(path.read_text(encoding="utf-8"))
    return [d for d in docs if d.strip()]


class Haystack:
    """The words of a haystack source, produced on demand.

    Args:
        corpus: None for `NOISE`, else a list of documents (str).
        rng: draws the order of the corpus documents (unused for the noise).
    """

    def __init__(self, corpus: Sequence[str] | None = None, rng: random.Random | None = None):
        if corpus is None:
            docs = [NOISE]
        else:
            docs = [d for d in corpus if isinstance(d, str) and d.strip()]
            if not docs:
                raise ValueError("the haystack corpus holds no non-empty text")
            (rng or random.Random(0)).shuffle(docs)
        self._docs = [_WORD.findall(d if corpus is None else d.strip() + "\n\n")
                      for d in docs]
        self._next = 0
        self.words: list[str] = []

    def take(self, n: int) -> list[str]:
        """The first n words (each with its trailing whitespace)."""
        while len(self.words) < n:
            self.words += self._docs[self._next % len(self._docs)]
            self._next += 1
        return self.words[:n]


def _sentence_start(words: Sequence[str], j: int) -> int:
    """The largest i <= j such that a sentence starts at word i (i == 0 included)."""
    while j > 0 and not _SENTENCE_END.search(words[j - 1]):
        j -= 1
    return j


def insert(words: Sequence[str], sentences: Sequence[tuple[float, str]]) -> str:
    """The text of `words` with each (depth, sentence) inserted (module docstring); equal
    positions keep the order of `sentences` sorted by depth (stable)."""
    n = len(words)
    at: dict[int, list[str]] = {}
    for depth, sentence in sorted(sentences, key=lambda s: s[0]):
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"depth must be in [0, 1], got {depth}")
        at.setdefault(_sentence_start(words, round(depth * n)), []).append(sentence)
    parts: list[str] = []
    for i in range(n + 1):
        for sentence in at.get(i, ()):
            if parts and not parts[-1][-1:].isspace():
                parts.append(" ")
            parts.append(sentence + " ")
        if i < n:
            parts.append(words[i])
    return "".join(parts).rstrip()
