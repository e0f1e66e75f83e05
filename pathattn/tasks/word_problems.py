"""Word problems on the groups A5 and S5 (Merrill et al. 2024, "The Illusion of State"),
the paper's section "Synthetic Tasks"; our choices where it leaves details open are stated here.

Group elements are permutations of the points 1..5, written in one-line notation: the
string "23145" is the map 1->2, 2->3, 3->1, 4->4, 5->5, i.e. the cycle (1 2 3). The
vocabulary is every element of the group in lexicographic order (identity "12345" first).

Composition order (our choice): a word x_1 x_2 ... x_t acts on the points left to right,
x_1 first, so its value is the prefix product P_t = x_t o ... o x_1 as functions,
P_t(i) = x_t(P_{t-1}(i)); e.g. (1 2 3) then (1 2 4) = "43215". The target at position t is
P_t (a token-tagging task for a causal model); the last target is the identity iff the
whole word is.

Alphabets: "elements" draws every element uniformly (60 for A5, 120 for S5).
"generators" draws uniformly from generators and their inverses: for A5 g1 = (1 2 3),
g2 = (1 2 4), g3 = (1 2 5) and inverses (6 tokens, as in the PaTH text); for S5 (our choice)
the transposition (1 2), self-inverse, and the 5-cycle (1 2 3 4 5) and its inverse
(3 tokens).
"transpositions" (S5 only) draws the 10 transpositions (x y), each a swap of two points:
the swap-token language of the paper's one-layer construction for S5 (Theorem A.1), whose
20 ordered pairs name these 10 elements twice.

Registered as tasks "a5" and "s5" (`SPECS`): options length and alphabet; one evaluation
split `val`, the training task on seed stream 1 instead of 0 (independent of the training
stream, fixed for a given seed); per split token and sequence accuracy, and a depth counts
as solving by its sequence accuracy.

Training and evaluation streams prepend a BOS token (our choice), id len(vocab), whose
target is not scored; the model's vocabulary counts it. Without it a model whose attention
values carry no position (RoPE, PaTH, FoX: position enters only the logits) cannot tell the
word "g" from "g g": identical tokens give identical attention outputs in every layer, so
position 2 of such a word is always wrong. With the generators alphabet of A5 that caps
sequence accuracy near 5/6 (measured: 83-84 % for PaTH and RoPE alike at k = 6, 2 and 3
layers). The BOS token receives a share of attention that shrinks with position, which
breaks the tie. `pathattn data` writes the words without it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from .export import Vocab, make_generator
from .registry import TaskOption, TaskSpec

N_POINTS = 5
GROUPS = ("a5", "s5")
ALPHABETS = ("elements", "generators", "transpositions")


def _parity(p: Sequence[int]) -> int:
    """0 for an even permutation, 1 for odd (counted by inversions)."""
    return sum(p[i] > p[j] for i in range(len(p)) for j in range(i + 1, len(p))) % 2


def one_line(p: Sequence[int]) -> str:
    """0-indexed image tuple (p[i] = image of point i) -> one-line string, e.g. "23145"."""
    return "".join(str(x + 1) for x in p)


def from_cycles(*cycles: Sequence[int]) -> tuple[int, ...]:
    """Cycle notation on points 1..5 -> 0-indexed image tuple; from_cycles((1, 2, 3))."""
    p = list(range(N_POINTS))
    for c in cycles:
        for a, b in zip(c, tuple(c[1:]) + tuple(c[:1]), strict=True):
            p[a - 1] = b - 1
    return tuple(p)


def inverse(p: Sequence[int]) -> tuple[int, ...]:
    inv = [0] * len(p)
    for i, x in enumerate(p):
        inv[x] = i
    return tuple(inv)


GENERATORS = {
    "a5": [from_cycles((1, 2, 3)), from_cycles((1, 2, 4)), from_cycles((1, 2, 5))],
    "s5": [from_cycles((1, 2)), from_cycles((1, 2, 3, 4, 5))],
}


def group_elements(group: str) -> list[tuple[int, ...]]:
    """All elements of A5 (even permutations) or S5, lexicographic, as image tuples."""
    perms = itertools.permutations(range(N_POINTS))
    return [p for p in perms if group == "s5" or _parity(p) == 0]


def transpositions() -> list[tuple[int, ...]]:
    """The 10 transpositions (x y), x < y, of S5 as image tuples, lexicographic in (x, y)."""
    return [from_cycles((x, y)) for x, y in itertools.combinations(range(1, N_POINTS + 1), 2)]


def alphabet_elements(group: str, alphabet: str) -> list[tuple[int, ...]]:
    """The elements tokens are drawn from: the whole group, generators and inverses, or
    (S5) the transpositions."""
    if alphabet == "elements":
        return group_elements(group)
    if alphabet == "transpositions":
        return transpositions()
    gens = []
    for g in GENERATORS[group]:
        for h in (g, inverse(g)):
            if h not in gens:
                gens.append(h)
    return gens


@dataclass
class WordProblemConfig:
    group: str = "a5"
    alphabet: str = "elements"
    length: int = 32  # T, tokens per sequence (our default; the task sweeps it)
    batch_size: int = 64
    seed: int = 0

    def __post_init__(self):
        if self.group not in GROUPS:
            raise ValueError(f"group must be one of {GROUPS}, got {self.group!r}")
        if self.alphabet not in ALPHABETS:
            raise ValueError(f"alphabet must be one of {ALPHABETS}, got {self.alphabet!r}")
        if self.alphabet == "transpositions" and self.group != "s5":
            raise ValueError(f"alphabet 'transpositions' needs group 's5' (transpositions are "
                             f"odd, not in A5), got group {self.group!r}")
        if self.length < 1:
            raise ValueError("length must be >= 1")


class WordProblem:
    """Endless, seeded stream of (tokens, targets) batches, each LongTensor [B, T] of ids
    into `vocab` (all group elements); targets[:, t] is the prefix product P_t (every
    position scored). Every `iter()` restarts the stream from the seed."""

    def __init__(self, cfg: WordProblemConfig | None = None, **kwargs):
        self.cfg = cfg if cfg is not None else WordProblemConfig(**kwargs)
        elements = group_elements(self.cfg.group)
        self.vocab = Vocab([one_line(p) for p in elements])
        index = {p: i for i, p in enumerate(elements)}
        # table[a, b] = id of "a then b" = b o a, i.e. (b o a)(i) = b[a[i]]
        self.table = torch.tensor(
            [[index[tuple(b[i] for i in a)] for b in elements] for a in elements])  # [G, G]
        self.alphabet = torch.tensor(  # [A] ids of the drawable tokens
            [index[p] for p in alphabet_elements(self.cfg.group, self.cfg.alphabet)])
        self.identity = index[tuple(range(N_POINTS))]

    def prefix_products(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] -> LongTensor [B, T], the ids of P_1 .. P_T."""
        out = torch.empty_like(tokens)
        acc = torch.full_like(tokens[:, 0], self.identity)  # [B]
        for t in range(tokens.shape[1]):
            acc = self.table[acc, tokens[:, t]]
            out[:, t] = acc
        return out

    @property
    def name(self) -> str:
        """The task's registry name, its group ("a5" or "s5")."""
        return self.cfg.group

    def sample(self, generator: torch.Generator) -> torch.Tensor:
        """One batch of words: LongTensor [B, T] of ids drawn uniformly from the alphabet."""
        B, T = self.cfg.batch_size, self.cfg.length
        return self.alphabet[torch.randint(len(self.alphabet), (B, T), generator=generator)]

    def batch(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch (words, prefix products) drawn from `generator`, LongTensor [B, T]."""
        tokens = self.sample(generator)
        return tokens, self.prefix_products(tokens)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        g = make_generator(self.cfg.seed)
        while True:
            yield self.batch(g)


def _group_config(group: str):
    """The config function of the group's spec (the split changes nothing but the stream)."""
    def config(split: str, **kwargs) -> WordProblemConfig:
        return WordProblemConfig(group=group, **kwargs)
    return config


OPTIONS = (
    TaskOption("length", int, WordProblemConfig.length, "tokens per sequence"),
    TaskOption("alphabet", str, WordProblemConfig.alphabet,
               "tokens drawn from all group elements, from generators and inverses, or "
               "(s5) from the 10 transpositions",
               choices=ALPHABETS),
)
SPECS = tuple(TaskSpec(name=group, config=_group_config(group), task=WordProblem,
                       options=OPTIONS, bos=True)
              for group in GROUPS)
