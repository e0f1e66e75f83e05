"""Flip-flop: the answers at `r` against a plain loop, instruction / bit frequencies of
every split against the spec within 5 binomial standard deviations, seeding."""

from __future__ import annotations

import math

import pytest
import torch

from pathattn.tasks import IGNORE_INDEX, SPLITS, FlipFlop, read_errors, read_indices, read_mask

SPLIT_NAMES = list(SPLITS)
P_IGNORE = {"train": 0.8, "val": 0.8, "val_sparse": 0.98, "val_dense": 0.1}  # from TASKS.md


def _batch(split, batch_size=8, seed=0, num_pairs=256):
    return next(iter(FlipFlop(split=split, batch_size=batch_size, seed=seed,
                              num_pairs=num_pairs)))


def _within_5_sigma(count, n, p):
    assert abs(count - n * p) <= 5 * math.sqrt(n * p * (1 - p)), (count, n, p)


@pytest.mark.parametrize("split", SPLIT_NAMES)
def test_structure_and_reads_match_loop(split):
    tokens, targets = _batch(split)
    assert tokens.shape == targets.shape == (8, 512)
    for seq in tokens.tolist():
        s = [FlipFlop.vocab.itos[i] for i in seq]
        assert s[0] == "w" and s[-2] == "r"
        assert set(s[0::2]) <= {"w", "r", "i"} and set(s[1::2]) <= {"0", "1"}
        stored = None
        for instr, bit in zip(s[0::2], s[1::2], strict=True):
            if instr == "w":
                stored = bit
            elif instr == "r":
                assert bit == stored


@pytest.mark.parametrize("split", SPLIT_NAMES)
def test_next_token_targets(split):
    tokens, targets = _batch(split)
    assert torch.equal(targets[:, :-1], tokens[:, 1:])
    assert (targets[:, -1] == IGNORE_INDEX).all()


@pytest.mark.parametrize("split", SPLIT_NAMES)
def test_frequencies_match_spec(split):
    tokens, _ = _batch(split, batch_size=256)
    instr = [FlipFlop.vocab.itos[i] for i in tokens[:, 2:-2:2].flatten().tolist()]  # free
    n, p_i = len(instr), P_IGNORE[split]
    assert SPLITS[split][0] == p_i
    for name, p in (("i", p_i), ("w", (1 - p_i) / 2), ("r", (1 - p_i) / 2)):
        _within_5_sigma(instr.count(name), n, p)
    # bits after w and i are uniform
    free_bits = tokens[:, 1::2][tokens[:, 0::2] != FlipFlop.vocab.stoi["r"]]
    _within_5_sigma(int((free_bits == FlipFlop.vocab.stoi["1"]).sum()), free_bits.numel(), 0.5)


def test_read_helpers():
    tokens, targets = _batch("val_dense", batch_size=4, num_pairs=16)
    idx = read_indices(tokens)
    expected = [(b, t) for b in range(4) for t in range(32)
                if FlipFlop.vocab.itos[tokens[b, t]] == "r"]
    assert [tuple(x) for x in idx.tolist()] == expected
    assert all(FlipFlop.vocab.itos[targets[b, t]] in "01" for b, t in expected)
    perfect = targets.clone()
    assert read_errors(perfect, tokens) == (0.0, 0.0)
    wrong = perfect.clone()
    b, t = expected[0]
    wrong[b, t] = FlipFlop.vocab.stoi["1" if FlipFlop.vocab.itos[targets[b, t]] == "0" else "0"]
    wrong[~read_mask(tokens)] = 0  # errors off the read positions do not count
    assert read_errors(wrong, tokens) == pytest.approx((1 / len(expected), 1 / 4))


def test_seeding_reproducible_and_splits_distinct():
    a, b = _batch("train", seed=3), _batch("train", seed=3)
    assert torch.equal(a[0], b[0])
    assert not torch.equal(a[0], _batch("train", seed=4)[0])
    batches = [_batch(s, seed=3)[0] for s in SPLIT_NAMES]
    for i in range(len(batches)):
        for j in range(i):
            assert not torch.equal(batches[i], batches[j]), (SPLIT_NAMES[i], SPLIT_NAMES[j])
    stream = iter(FlipFlop(split="val", batch_size=8, seed=3))
    assert not torch.equal(next(stream)[0], next(stream)[0])


def test_bad_split():
    with pytest.raises(ValueError, match="split"):
        FlipFlop(split="test")
