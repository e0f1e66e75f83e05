"""Theorem A.1 (`pathattn.theory.swap_model`): the sign of the output against composing
the swaps in plain Python, on random and adversarial sequences up to n = 1024 tokens, for
the real PaTH layer and for the exact-reflection variant (float32); the output against
the proof's closed form (float64)."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from pathattn.nn import PaTHAttention
from pathattn.theory import (
    SWAPS,
    compose_swaps,
    swap_model,
    swaps_identity,
    worst_case_ids,
)

from . import random_swap_ids, swap_ids

N = 1024
VARIANTS = {"layer": False, "exact_reflections": True}


def _cycle_swaps(reps: int) -> list[tuple[int, int]]:
    """The 5-cycle (1 2 3 4 5) as 4 swaps, `reps` times: the identity every 20 swaps."""
    return [(1, 2), (2, 3), (3, 4), (4, 5)] * reps


def _there_and_back(m: int, seed: int) -> list[tuple[int, int]]:
    """m random swaps then the same swaps in reverse order: the identity only at the end
    (and wherever the walk happens to pass through it)."""
    rng = random.Random(seed)
    walk = [rng.choice(SWAPS) for _ in range(m)]
    return walk + walk[::-1]


ADVERSARIAL = {
    "same_swap_1023": lambda: worst_case_ids(N),
    "adjacent_pair_1023": lambda: swap_ids([(2, 3)] * (N - 1)),
    "both_orders_alternating": lambda: swap_ids([(4, 1), (1, 4)] * ((N - 1) // 2) + [(4, 1)]),
    "three_cycle": lambda: swap_ids([(1, 2), (2, 3)] * ((N - 1) // 2) + [(1, 2)]),
    "five_cycle": lambda: swap_ids(_cycle_swaps(255) + [(1, 2)] * 3),
    "there_and_back": lambda: swap_ids(_there_and_back((N - 1) // 2, seed=1) + [(5, 1)]),
}


def _check_exact(model, ids):
    with torch.no_grad():
        out = model(ids)
    want = swaps_identity(ids)
    assert out.shape == ids.shape
    wrong = ((out > 0) != want) | (out == 0)
    assert not wrong.any(), f"wrong sign at {wrong.nonzero()[:5].tolist()}"


def test_swaps_vocabulary():
    assert len(SWAPS) == 20 and len(set(SWAPS)) == 20
    assert list(SWAPS) == sorted(SWAPS) and SWAPS[0] == (1, 2) and SWAPS[-1] == (5, 4)
    assert all(x != y and {x, y} <= set(range(1, 6)) for x, y in SWAPS)


def test_ground_truth():
    assert compose_swaps(swap_ids([(1, 2)])[0].tolist()) == [2, 1, 3, 4, 5]
    assert compose_swaps(swap_ids([(1, 2), (2, 3)])[0].tolist()) == [2, 3, 1, 4, 5]
    assert swaps_identity(swap_ids([(1, 2), (2, 1), (3, 5)])).tolist() == [
        [True, False, True, False]]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("T", [1, 2, 17, 300, N])
def test_random_sequences(variant, T):
    model = swap_model(N, VARIANTS[variant])
    _check_exact(model, random_swap_ids(3, T, seed=T))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", ADVERSARIAL)
def test_adversarial_sequences(variant, case):
    ids = ADVERSARIAL[case]()
    assert ids.shape == (1, N)
    assert swaps_identity(ids).sum() >= 2  # each case passes through the identity
    _check_exact(swap_model(N, VARIANTS[variant]), ids)


def test_every_short_sequence():
    """All 1 + 20 + 400 sequences of at most 2 swaps, and every 3-swap sequence on {1,2,3}."""
    model = swap_model(4)
    for m in (1, 2):
        seqs = [[0, *p] for p in itertools.product(range(1, 21), repeat=m)]
        _check_exact(model, torch.tensor(seqs))
    small = [1 + i for i, (x, y) in enumerate(SWAPS) if max(x, y) <= 3]
    _check_exact(model, torch.tensor([[0, *p] for p in itertools.product(small, repeat=3)]))
    _check_exact(model, torch.tensor([[0]]))


def test_closed_form_float64():
    """Output at t = e^{s_0} / (e^{s_0} + t) - 1 / (t + 1) with s_0 = s (sum_i i pi(i) -
    54.5), plus 1 at t = 0 (the `#` one-hot on the residual stream)."""
    n = 8
    model = swap_model(n).double()
    ids = random_swap_ids(16, n, seed=3)
    with torch.no_grad():
        out = model(ids)
    for b, seq in enumerate(ids.tolist()):
        for t in range(n):
            pi = compose_swaps(seq[: t + 1])
            s0 = model.scale * (sum(i * p for i, p in zip(range(1, 6), pi, strict=True)) - 54.5)
            want = 1.0 if t == 0 else 1 / (1 + t * math.exp(-s0)) - 1 / (t + 1)
            assert out[b, t].item() == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_rearrangement_sum():
    """The op's sum_i i pi(i): 55 exactly for the identity, at most 54 otherwise."""
    model = swap_model(64, exact_reflections=True)
    ids = random_swap_ids(32, 64, seed=4)
    got = model.rearrangement_sum(ids)
    want = torch.tensor([sum(i * p for i, p in zip(range(1, 6), compose_swaps(s), strict=True))
                         for s in ids.tolist()], dtype=got.dtype)
    assert torch.equal(got, want)


def test_built_from_pathattention():
    model = swap_model(16)
    assert isinstance(model.attn, PaTHAttention)
    assert model.attn.num_heads == 2 and model.scale == 16
    conv = model.attn.w_conv.weight  # [C, 1, 3]: identity on the current token
    assert torch.equal(conv[:, 0, -1], torch.ones(conv.shape[0]))
    assert not conv[:, 0, :-1].any()


@pytest.mark.parametrize("bad", [
    torch.tensor([[1, 2]]),  # no '#'
    torch.tensor([[0, 0]]),  # '#' twice
    torch.tensor([[0, 21]]),  # not a token
    torch.zeros(1, 17, dtype=torch.long),  # longer than n
    torch.zeros(1, 2),  # float ids
], ids=["no_start", "start_twice", "out_of_vocab", "too_long", "float"])
def test_rejects_bad_ids(bad):
    with pytest.raises(ValueError):
        swap_model(16)(bad)
