"""Needle in a haystack, in the style of the RULER benchmark's retrieval tasks.

Needles "One of the special magic numbers for <key> is: <value>." hide at seeded depths in
a haystack (`haystack`: repeated noise sentences or a corpus); keys are adjective-noun
pairs ("amber-falcon"), values distinct 7-digit numbers. The question asks for every
number of the queried key(s); the answers are those numbers.

Variants (keys written, values per key, keys queried):

    single       1 key, 1 value, 1 query
    multikey     4 keys, 1 value each, 1 query (the other keys are distractors)
    multivalue   1 key, 4 values, 1 query (all four numbers are expected)
    multiquery   4 keys, 1 value each, 4 queries (all four numbers are expected)

`num_keys`, `num_values` and `num_queries` override the variant's counts. The needles'
depths are drawn uniformly in [0, 1], or fixed by `depths` (one per needle, e.g. a depth
sweep of the single variant).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from .common import LongContextTask, fit_length, register_task
from .haystack import Haystack, insert

__all__ = ["NIAH", "VARIANT_COUNTS", "needle"]

# variant -> (num_keys, num_values, num_queries)
VARIANT_COUNTS = {"single": (1, 1, 1), "multikey": (4, 1, 1), "multivalue": (1, 4, 1),
                  "multiquery": (4, 1, 4)}

ADJECTIVES = ("amber", "bold", "calm", "dusty", "eager", "faint", "gentle", "hollow", "icy",
              "jolly", "keen", "lively", "misty", "noble", "odd", "pale", "quiet", "rapid",
              "silent", "tidy", "upper", "vivid", "windy", "young", "zesty", "brave",
              "crisp", "dark", "early", "fuzzy")
NOUNS = ("falcon", "harbor", "lantern", "meadow", "orchard", "pebble", "quarry", "raven",
         "saddle", "thistle", "valley", "walnut", "anchor", "beacon", "canyon", "dolphin",
         "ember", "forest", "glacier", "hammer", "island", "jasmine", "kettle", "ladder",
         "marble", "needle", "otter", "pillow", "ribbon", "spindle")

INTRO = ("Special magic numbers are hidden in the text below. Remember every one of them: "
         "you will be asked about them at the end.")


def needle(key: str, value: str) -> str:
    """The needle sentence of (key, value)."""
    return f"One of the special magic numbers for {key} is: {value}."


def _join(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


@register_task
class NIAH(LongContextTask):
    """Needle in a haystack (module docstring).

    Args:
        variant: "single" (default), "multikey", "multivalue" or "multiquery".
        corpus: None for the noise haystack, else a list of documents (str).
        num_keys, num_values, num_queries: override the variant's counts.
        depths: one depth in [0, 1] per needle (num_keys x num_values), or None (random).
    """

    name = "niah"
    variants = tuple(VARIANT_COUNTS)

    def __init__(self, variant: str | None = None, corpus: Sequence[str] | None = None,
                 num_keys: int | None = None, num_values: int | None = None,
                 num_queries: int | None = None, depths: Sequence[float] | None = None):
        super().__init__(variant)
        keys, values, queries = VARIANT_COUNTS[self.variant]
        self.num_keys = keys if num_keys is None else num_keys
        self.num_values = values if num_values is None else num_values
        self.num_queries = queries if num_queries is None else num_queries
        if not 1 <= self.num_queries <= self.num_keys <= len(ADJECTIVES) * len(NOUNS) or \
                self.num_values < 1:
            raise ValueError(f"niah: need 1 <= num_queries <= num_keys and num_values >= 1, "
                             f"got keys={self.num_keys} values={self.num_values} "
                             f"queries={self.num_queries}")
        self.depths = None if depths is None else [float(d) for d in depths]
        if self.depths is not None and (len(self.depths) != self.num_keys * self.num_values
                                        or not all(0 <= d <= 1 for d in self.depths)):
            raise ValueError(f"niah: depths must be {self.num_keys * self.num_values} "
                             f"values in [0, 1], got {depths!r}")
        self.corpus = None if corpus is None else list(corpus)

    def options(self) -> dict:
        return dict(num_keys=self.num_keys, num_values=self.num_values,
                    num_queries=self.num_queries, depths=self.depths,
                    haystack="noise" if self.corpus is None else "corpus")

    def build(self, rng: random.Random, tokenizer, length: int):
        pairs = [f"{a}-{n}" for a in ADJECTIVES for n in NOUNS]
        keys = rng.sample(pairs, self.num_keys)
        numbers = rng.sample(range(1_000_000, 10_000_000), self.num_keys * self.num_values)
        values = {k: [str(v) for v in numbers[i * self.num_values:(i + 1) * self.num_values]]
                  for i, k in enumerate(keys)}
        needles = [needle(k, v) for k in keys for v in values[k]]
        depths = self.depths or [rng.random() for _ in needles]
        queried = rng.sample(keys, self.num_queries)
        answers = [v for k in queried for v in values[k]]
        haystack = Haystack(self.corpus, random.Random(rng.random()))
        several = len(answers) > 1
        question = (f"What {'are all' if several else 'is'} the special magic "
                    f"number{'s' if several else ''} for {_join(queried)} mentioned in the "
                    "text above?")
        prefix = (f"Answer: The special magic number{'s' if several else ''} for "
                  f"{_join(queried)} mentioned in the text above "
                  f"{'are' if several else 'is'}:")

        def render(n: int) -> str:
            context = insert(haystack.take(n), list(zip(depths, needles, strict=True)))
            return f"{INTRO}\n{context}\n{question}\n{prefix}"

        prompt, words, _ = fit_length(render, tokenizer, length)
        info = dict(keys=keys, queried=queried, depths=depths, haystack_words=words)
        return prompt, answers, info
