"""Training documents of the long-context tasks, to mix into pretraining data.

`write_training_docs` writes JSON Lines, one document per example: {"text": prompt +
reference continuation, "task", "variant", "length", "index"}. The text is what the model
should learn to produce: the context, the question, the answer prefix and the answers
(" 1234567."). The examples are drawn with split="train", so with any seed they differ
from the evaluation examples (`LongContextTask.example`). `pathattn prepare --input
FILE.jsonl` tokenizes the "text" field like any other corpus.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from .common import LongContextTask, make_task, write_jsonl_atomic

__all__ = ["training_records", "write_training_docs"]


def training_records(task: LongContextTask | str, tokenizer, lengths: Sequence[int], n: int,
                     seed: int = 0) -> list[dict]:
    """The records of `write_training_docs`, n per length."""
    task = make_task(task) if isinstance(task, str) else task
    records = []
    for length in lengths:
        for ex in task.examples(tokenizer, length, n, seed, split="train"):
            records.append(dict(text=ex.prompt + ex.target, task=ex.task, variant=ex.variant,
                                length=ex.length, index=ex.index))
    return records


def write_training_docs(task: LongContextTask | str, tokenizer, lengths: Sequence[int],
                        n: int, path: str | os.PathLike, seed: int = 0) -> int:
    """Write n training documents per length of `task` (an instance, or a registered name
    with its default variant) to the .jsonl `path`, atomically; returns the number
    written. Lengths count the prompt's tokens, the answer comes on top."""
    return write_jsonl_atomic(path, training_records(task, tokenizer, lengths, n, seed))
