"""What every long-context task shares: the `Example` record, the `LongContextTask` base
class and its registry, prompt length fitting in tokens, and the score.

Lengths are counted in tokens of the prompt as the model receives it (`prompt_ids`): a BOS
(when the tokenizer has one: every training document of `pathattn prepare` starts with it,
whether or not the tokenizer's template adds it, as an export's does not) and the prompt's
tokens without special tokens. A task renders its prompt from a number of filler units
(haystack words, phone-book lines) and `fit_length` picks the largest number whose prompt
has at most `length` tokens, so a prompt falls short of the target by less than one unit
(a word or a line: a few tokens). A target shorter than the task's fixed text (the
instructions, needles and question with no filler) is a ValueError.

Score (`score`): the fraction of the expected answers that occur in the model's output,
compared case-insensitively as substrings: sum over answers a of [a.lower() in
output.lower()], divided by the number of answers. This is the "all answers" string match
of the RULER benchmark: one of two needles found scores 0.5. The output is the generated
continuation only (the prompt excluded), decoded without special tokens and not cut at a
newline; generation stops at EOS or after `max_new_tokens`, which leaves room for the
answer and little more (`answer_budget`), so a model gains nothing by listing numbers.

Examples are seeded per (task, variant, options, split, seed, length, index): example i
of a length is the same whatever the number of examples asked for, and `split="train"`
(the training documents of `write_training_docs`) never repeats an evaluation example.
"""

from __future__ import annotations

import json
import math
import os
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ...utils.io import atomic_write_jsonl, atomic_write_text

__all__ = ["prompt_ids",
           "Example", "LongContextTask", "TASKS", "register_task", "make_task", "task_names",
           "count_tokens", "fit_length", "score", "answer_budget", "write_text_atomic",
           "write_jsonl_atomic", "SPLITS"]

SPLITS = ("eval", "train")


@dataclass(frozen=True)
class Example:
    """One generated example.

    Attributes:
        task, variant: the task's registry name and variant.
        length: the target length in tokens.
        index: the example's index among those of its length.
        prompt: context + question + answer prefix; the model continues it.
        answers: the expected answer strings (all of them are asked for).
        target: the reference continuation of the prompt (" " + the answers + "."), the
            text a training document appends to the prompt.
        num_tokens: tokens of `prompt` (`count_tokens`).
        info: task details (needle depths, keys, ...), JSON-serializable.
    """

    task: str
    variant: str
    length: int
    index: int
    prompt: str
    answers: tuple[str, ...]
    target: str
    num_tokens: int
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["answers"] = list(self.answers)
        return d


def prompt_ids(tokenizer, text: str) -> list[int]:
    """The ids of `text` as the model receives it: [BOS] (when the tokenizer has one) and
    the text's tokens without special tokens (module docstring)."""
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    bos = tokenizer.bos_token_id
    return ids if bos is None else [bos] + ids


def count_tokens(tokenizer, text: str) -> int:
    """Tokens of `text` as the model receives it (`prompt_ids`)."""
    return len(prompt_ids(tokenizer, text))


def fit_length(render: Callable[[int], str], tokenizer, length: int) -> tuple[str, int, int]:
    """The longest prompt `render(n)` with at most `length` tokens.

    Args:
        render: n -> prompt with n filler units; its token count must grow with n.
        tokenizer: counts the tokens (`count_tokens`).
        length: the target in tokens.

    Returns (prompt, n, tokens). The search estimates tokens per unit, brackets the answer
    by steps of 10 % and bisects, about log2(n / 10) + 5 tokenizations of the prompt.
    ValueError when `render(0)` alone is longer than `length`.
    """
    base = count_tokens(tokenizer, render(0))
    if base > length:
        raise ValueError(f"length {length} is shorter than the task's fixed text ({base} "
                         "tokens without filler); ask for a longer length")
    probe = 32
    per_unit = max((count_tokens(tokenizer, render(probe)) - base) / probe, 1e-3)
    guess = max(int((length - base) / per_unit), 0)
    counts: dict[int, int] = {0: base}

    def tokens(n: int) -> int:
        if n not in counts:
            counts[n] = count_tokens(tokenizer, render(n))
        return counts[n]

    lo, hi = (guess, None) if tokens(guess) <= length else (None, guess)
    while lo is None:  # hi is too long: step down
        n = int(hi / 1.1)
        lo, hi = (n, hi) if tokens(n) <= length else (None, n)
    while hi is None:  # lo fits: step up
        n = max(int(lo * 1.1), lo + 1)
        lo, hi = (n, None) if tokens(n) <= length else (lo, n)
    while hi - lo > 1:  # tokens(lo) <= length < tokens(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if tokens(mid) <= length else (lo, mid)
    return render(lo), lo, tokens(lo)


def score(output: str, answers: Sequence[str]) -> float:
    """Fraction of `answers` found in `output` (case-insensitive substrings; module
    docstring). 0.0 for no answers."""
    if not answers:
        return 0.0
    text = output.lower()
    return sum(a.lower() in text for a in answers) / len(answers)


def answer_budget(tokenizer, example: Example, margin: int = 8) -> int:
    """max_new_tokens for `example`: 1.25 x the tokens of its reference continuation
    (without special tokens) + `margin`."""
    ids = tokenizer(example.target, add_special_tokens=False, verbose=False)["input_ids"]
    return math.ceil(1.25 * len(ids)) + margin


# ------------------------------------------------------------------ tasks and registry

class LongContextTask(ABC):
    """A seeded generator of examples at any length in tokens.

    Subclasses set `name` (the registry key), `variants` (the first is the default) and
    implement `build`. Options are constructor keywords; `options()` returns them for
    records. Register a subclass with `@register_task`; `make_task(name, ...)` builds one.
    """

    name: ClassVar[str]
    variants: ClassVar[tuple[str, ...]] = ("default",)

    def __init__(self, variant: str | None = None):
        variant = self.variants[0] if variant is None else variant
        if variant not in self.variants:
            raise ValueError(f"{self.name}: unknown variant {variant!r}; variants: "
                             f"{', '.join(self.variants)}")
        self.variant = variant

    def options(self) -> dict[str, Any]:
        """The task's options (JSON-serializable), part of every example's seed."""
        return {}

    @abstractmethod
    def build(self, rng: random.Random, tokenizer, length: int) -> tuple[str, list[str], dict]:
        """(prompt, answers, info) of one example drawn from `rng`, fitted to `length`."""

    def example(self, tokenizer, length: int, index: int = 0, seed: int = 0,
                split: str = "eval") -> Example:
        """Example `index` of `length` tokens (module docstring for the seeding)."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
            raise ValueError(f"length must be a positive int, got {length!r}")
        key = json.dumps([self.name, self.variant, self.options(), split, seed, length, index],
                         sort_keys=True)
        prompt, answers, info = self.build(random.Random(key), tokenizer, length)
        return Example(task=self.name, variant=self.variant, length=length, index=index,
                       prompt=prompt, answers=tuple(answers), target=self.target(answers),
                       num_tokens=count_tokens(tokenizer, prompt), info=info)

    def examples(self, tokenizer, length: int, n: int, seed: int = 0,
                 split: str = "eval") -> list[Example]:
        """Examples 0 .. n - 1 of `length` tokens."""
        return [self.example(tokenizer, length, i, seed, split) for i in range(n)]

    @staticmethod
    def target(answers: Sequence[str]) -> str:
        """The reference continuation of the answer prefix: " a1, a2 and a3."."""
        if len(answers) <= 1:
            return f" {''.join(answers)}."
        return f" {', '.join(answers[:-1])} and {answers[-1]}."


TASKS: dict[str, type[LongContextTask]] = {}


def register_task(cls: type[LongContextTask]) -> type[LongContextTask]:
    """Class decorator: add a `LongContextTask` subclass to `TASKS` under `cls.name`."""
    if not (isinstance(cls, type) and issubclass(cls, LongContextTask)):
        raise TypeError(f"register_task expects a LongContextTask subclass, got {cls!r}")
    if cls.name in TASKS and TASKS[cls.name] is not cls:
        raise ValueError(f"a long-context task named {cls.name!r} is already registered")
    TASKS[cls.name] = cls
    return cls


def task_names() -> list[str]:
    """The registered task names, sorted."""
    return sorted(TASKS)


def make_task(name: str, variant: str | None = None, **options) -> LongContextTask:
    """The registered task `name` with a variant and options (constructor keywords)."""
    if name not in TASKS:
        raise ValueError(f"unknown long-context task {name!r}; tasks: "
                         f"{', '.join(task_names())}")
    return TASKS[name](variant=variant, **options)


# ------------------------------------------------------------------ atomic files

def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write `text` (UTF-8) to `path`, creating its folder, atomically and durably
    (`pathattn.utils.io`): readers see the old file or the new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, text)


def write_jsonl_atomic(path: str | os.PathLike, records: Iterable[dict]) -> int:
    """Write one JSON object per line (UTF-8, non-ASCII kept), creating the folder,
    atomically and durably; returns the number of records."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_jsonl(path, records, ensure_ascii=False)
