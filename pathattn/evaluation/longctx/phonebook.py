"""PhoneBook lookup: a list of "Name Surname: 555-xxxx" lines, one name queried.

Names are made of syllables (`FIRST_SYLLABLES`, `LAST_SYLLABLES`: a first name of two
syllables, a surname of two or three), capitalized and unique within a book; numbers are
"555-" and four random digits (two people may share a number, the queried name is
unique). The book has as many lines as the length allows; the queried line sits at a
seeded random depth. The answer is its number.
"""

from __future__ import annotations

import random

from .common import LongContextTask, fit_length, register_task

__all__ = ["PhoneBook", "FIRST_SYLLABLES", "LAST_SYLLABLES"]

FIRST_SYLLABLES = ("ka", "lo", "mi", "ra", "ten", "sa", "vi", "no", "bel", "da", "ri", "zo",
                   "an", "el", "mar", "ju", "te", "ol", "pa", "si", "ha", "ne", "fi", "go")
LAST_SYLLABLES = ("bran", "dor", "wick", "ham", "ley", "ton", "mer", "cas", "vel", "tor",
                  "lin", "gar", "ro", "sen", "bur", "ford", "ma", "dal", "quin", "ker",
                  "nes", "hol", "pry", "stan")

INTRO = "Below is a phone book. Each line gives a person's name and phone number."


class _Book:
    """The lines of a phone book, drawn on demand from `rng`."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.names: list[str] = []
        self.numbers: list[str] = []
        self._seen: set[str] = set()

    def _name(self) -> str:
        while True:
            first = "".join(self.rng.choice(FIRST_SYLLABLES) for _ in range(2))
            last = "".join(self.rng.choice(LAST_SYLLABLES)
                           for _ in range(self.rng.choice((2, 3))))
            name = f"{first.capitalize()} {last.capitalize()}"
            if name not in self._seen:
                self._seen.add(name)
                return name

    def lines(self, n: int) -> list[str]:
        while len(self.names) < n:
            self.names.append(self._name())
            self.numbers.append(f"555-{self.rng.randrange(10_000):04d}")
        return [f"{a}: {b}" for a, b in zip(self.names[:n], self.numbers[:n], strict=True)]


@register_task
class PhoneBook(LongContextTask):
    """PhoneBook lookup (module docstring). Args: variant, only "default"."""

    name = "phonebook"

    def build(self, rng: random.Random, tokenizer, length: int):
        depth = rng.random()
        book = _Book(random.Random(rng.random()))

        def query(n: int) -> int:  # the queried line of a book of n >= 1 lines
            return min(int(depth * n), n - 1)

        def render(n: int) -> str:
            lines = book.lines(max(n, 1))  # the queried line is always there
            name = book.names[query(len(lines))]
            return (f"{INTRO}\n" + "\n".join(lines) + f"\nWhat is the phone number of "
                    f"{name}?\nAnswer: The phone number of {name} is")

        prompt, n, _ = fit_length(render, tokenizer, length)
        q = query(max(n, 1))
        info = dict(name=book.names[q], line=q, lines=max(n, 1), depth=depth)
        return prompt, [book.numbers[q]], info
