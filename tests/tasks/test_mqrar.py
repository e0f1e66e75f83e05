"""MQRAR-N: the example of TASKS.md exactly, random sequences against a dict-of-lists loop
for N = 1..4, token layout, seeding."""

from __future__ import annotations

import pytest
import torch

from pathattn.tasks import IGNORE_INDEX, MQRAR, nback_targets


def test_spec_example():
    # A 1 B 2 C 3 D 4 A 5 B 6 A 7 C 8 A 9 B 0, N = 2
    keys = torch.tensor([["ABCD".index(c) for c in "ABCDABACAB"]])
    values = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9, 0]])
    got = nback_targets(keys, values, 2)[0].tolist()
    expected = [IGNORE_INDEX] * 10
    expected[6], expected[8], expected[9] = 1, 5, 2  # third A, fourth A, third B
    assert got == expected


def _loop_targets(pairs, n_back):
    history, out = {}, []
    for k, v in pairs:
        h = history.setdefault(k, [])
        out.append(h[-n_back] if len(h) >= n_back else None)
        h.append(v)
    return out


@pytest.mark.parametrize("n_back", [1, 2, 3, 4], ids=lambda n: f"N{n}")
def test_targets_match_loop(n_back):
    task = MQRAR(n_back=n_back, num_keys=8, num_values=16, length=96, batch_size=16)
    tokens, targets = next(iter(task))
    assert tokens.shape == targets.shape == (16, 96)
    scored = 0
    for x, y in zip(tokens, targets, strict=True):
        toks, tgts = task.vocab.decode(x), task.vocab.decode(y)
        assert all(t.startswith("k") for t in toks[0::2])
        assert all(t.startswith("v") for t in toks[1::2])
        assert all(t is None for t in tgts[1::2])
        expected = _loop_targets(list(zip(toks[0::2], toks[1::2], strict=True)), n_back)
        assert tgts[0::2] == expected
        scored += sum(t is not None for t in expected)
    assert scored > 0


def test_n_back_longer_than_sequence():
    task = MQRAR(n_back=4, num_keys=1, length=6, batch_size=2)
    _, targets = next(iter(task))
    assert (targets == IGNORE_INDEX).all()


def test_vocab_and_seeding():
    task = MQRAR(num_keys=32, num_values=64, length=768, batch_size=4, seed=5)
    assert len(task.vocab) == 96
    a, b = next(iter(task)), next(iter(MQRAR(length=768, batch_size=4, seed=5)))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], next(iter(MQRAR(length=768, batch_size=4, seed=6)))[0])


@pytest.mark.parametrize("kwargs", [{"length": 7}, {"n_back": 0}, {"num_keys": 0}],
                         ids=["odd-length", "n-back-0", "no-keys"])
def test_bad_config(kwargs):
    with pytest.raises(ValueError):
        MQRAR(**kwargs)
