"""Variable tracking, in the style of the RULER benchmark's multi-hop tracing task.

A chain is a number followed by `num_hops` copies:

    VAR QXPTR = 48213.   VAR LMBZA = VAR QXPTR.   VAR HHOEW = VAR LMBZA.   ...

so all its `num_hops + 1` variables hold the number. `num_chains` chains (distinct
5-digit numbers, distinct 5-letter variable names) are interleaved at random, each keeping
its own order, and hidden at sorted random depths of a haystack (`haystack`). The question
gives the number of one chain; the answers are that chain's variables, in the order they
are assigned (every variable holding the number, which the other chains never reach).
"""

from __future__ import annotations

import random
import string
from collections.abc import Sequence

from .common import LongContextTask, fit_length, register_task
from .haystack import Haystack, insert

__all__ = ["VariableTracking", "assignment"]

INTRO = ("Memorize the variable assignments hidden in the text below: you will be asked "
         "about them at the end.")


def assignment(var: str, source: str) -> str:
    """The statement assigning `source` (a number or another variable's name) to `var`."""
    value = source if source.isdigit() else f"VAR {source}"
    return f"VAR {var} = {value}."


@register_task
class VariableTracking(LongContextTask):
    """Variable tracking (module docstring).

    Args:
        variant: only "default".
        num_chains: chains of assignments (one is queried, the others distract).
        num_hops: copies per chain (a chain has num_hops + 1 variables).
        corpus: None for the noise haystack, else a list of documents (str).
    """

    name = "vt"

    def __init__(self, variant: str | None = None, num_chains: int = 1, num_hops: int = 4,
                 corpus: Sequence[str] | None = None):
        super().__init__(variant)
        if num_chains < 1 or num_hops < 0:
            raise ValueError(f"vt: need num_chains >= 1 and num_hops >= 0, got "
                             f"{num_chains}, {num_hops}")
        self.num_chains, self.num_hops = num_chains, num_hops
        self.corpus = None if corpus is None else list(corpus)

    def options(self) -> dict:
        return dict(num_chains=self.num_chains, num_hops=self.num_hops,
                    haystack="noise" if self.corpus is None else "corpus")

    def build(self, rng: random.Random, tokenizer, length: int):
        size = self.num_chains * (self.num_hops + 1)
        names: list[str] = []
        while len(names) < size:
            name = "".join(rng.choice(string.ascii_uppercase) for _ in range(5))
            if name not in names:
                names.append(name)
        numbers = [str(v) for v in rng.sample(range(10_000, 100_000), self.num_chains)]
        chains = [names[c * (self.num_hops + 1):(c + 1) * (self.num_hops + 1)]
                  for c in range(self.num_chains)]
        statements = [[assignment(chain[0], numbers[c])] +
                      [assignment(chain[h], chain[h - 1]) for h in range(1, len(chain))]
                      for c, chain in enumerate(chains)]
        order = [c for c in range(self.num_chains) for _ in range(self.num_hops + 1)]
        rng.shuffle(order)  # chain of each slot; each chain's statements stay in order
        taken = [0] * self.num_chains
        sentences = []
        for c in order:
            sentences.append(statements[c][taken[c]])
            taken[c] += 1
        depths = sorted(rng.random() for _ in sentences)
        queried = rng.randrange(self.num_chains)
        haystack = Haystack(self.corpus, random.Random(rng.random()))
        question = (f"Question: Which variables are assigned the value {numbers[queried]}, "
                    "directly or through other variables, in the text above?")
        prefix = f"Answer: The variables that hold the value {numbers[queried]} are:"

        def render(n: int) -> str:
            context = insert(haystack.take(n), list(zip(depths, sentences, strict=True)))
            return f"{INTRO}\n{context}\n{question}\n{prefix}"

        prompt, words, _ = fit_length(render, tokenizer, length)
        info = dict(value=numbers[queried], chains=chains, values=numbers, depths=depths,
                    haystack_words=words)
        return prompt, list(chains[queried]), info
