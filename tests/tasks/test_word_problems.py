"""Word problems on A5 / S5: prefix products against 5x5 permutation matrices built from
the token strings, the composition order by hand, the alphabets, seeding."""

from __future__ import annotations

import pytest
import torch

from pathattn.tasks import WordProblem

CASES = [("a5", "elements"), ("a5", "generators"), ("s5", "elements"), ("s5", "generators"),
         ("s5", "transpositions")]
IDS = [f"{g}-{a}" for g, a in CASES]


def _matrix(s: str) -> torch.Tensor:
    """One-line string -> permutation matrix M with M e_i = e_{p(i)} (int64 [5, 5])."""
    m = torch.zeros(5, 5, dtype=torch.long)
    for i, c in enumerate(s):
        m[int(c) - 1, i] = 1
    return m


def _string(m: torch.Tensor) -> str:
    return "".join(str(int(m[:, i].argmax()) + 1) for i in range(5))


@pytest.mark.parametrize("group,alphabet", CASES, ids=IDS)
def test_prefix_products_match_matrices(group, alphabet):
    task = WordProblem(group=group, alphabet=alphabet, length=20, batch_size=16)
    tokens, targets = next(iter(task))
    assert tokens.shape == targets.shape == (16, 20)
    for x, y in zip(tokens, targets, strict=True):
        acc = torch.eye(5, dtype=torch.long)
        for a, b in zip(task.vocab.decode(x), task.vocab.decode(y), strict=True):
            acc = _matrix(a) @ acc  # a is applied after everything so far
            assert _string(acc) == b


def test_composition_order_by_hand():
    task = WordProblem(group="a5", length=2)
    g1, g2 = "23145", "24315"  # (1 2 3), (1 2 4)
    tokens = task.vocab.encode([g1, g2])[None]
    assert task.vocab.decode(task.prefix_products(tokens)[0]) == [g1, "43215"]


@pytest.mark.parametrize("group,alphabet", CASES, ids=IDS)
def test_alphabet(group, alphabet):
    task = WordProblem(group=group, alphabet=alphabet)
    size = {"a5": 60, "s5": 120}[group]
    assert len(task.vocab) == size and task.vocab.itos[0] == "12345"
    assert all(sorted(s) == list("12345") for s in task.vocab.itos)
    drawable = sorted(task.vocab.decode(task.alphabet))
    if alphabet == "elements":
        assert drawable == sorted(task.vocab.itos)
        return
    if alphabet == "transpositions":  # every swap of two points, each once
        expected = [s for s in task.vocab.itos
                    if sum(c != str(i + 1) for i, c in enumerate(s)) == 2]
        assert len(expected) == 10
    else:
        expected = {"a5": ["23145", "31245", "24315", "41325", "25341", "51342"],  # g, g^-1
                    "s5": ["21345", "23451", "51234"]}[group]
    assert drawable == sorted(expected)
    # the generators generate the whole group (closure under right multiplication)
    seen, frontier = {"12345"}, ["12345"]
    while frontier:
        s = frontier.pop()
        for g in drawable:
            t = _string(_matrix(g) @ _matrix(s))
            if t not in seen:
                seen.add(t)
                frontier.append(t)
    assert len(seen) == size


@pytest.mark.parametrize("group,alphabet", CASES, ids=IDS)
def test_uniform_draws(group, alphabet):
    task = WordProblem(group=group, alphabet=alphabet, length=100, batch_size=100)
    tokens, _ = next(iter(task))
    counts = torch.bincount(tokens.flatten(), minlength=len(task.vocab))[task.alphabet]
    n, p = tokens.numel(), 1 / len(task.alphabet)
    assert counts.sum() == n
    assert ((counts - n * p).abs() <= 5 * (n * p * (1 - p)) ** 0.5).all()


def test_seeding():
    def first(seed):
        return next(iter(WordProblem(group="s5", batch_size=4, seed=seed)))[0]

    assert torch.equal(first(1), first(1))
    assert not torch.equal(first(1), first(2))


def test_transpositions_need_s5():
    with pytest.raises(ValueError, match="alphabet 'transpositions' needs group 's5'"):
        WordProblem(group="a5", alphabet="transpositions")
