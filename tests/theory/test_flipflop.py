"""Theorem A.2 (`pathattn.theory.flipflop_model`): the argmax at every read against the last
written bit in plain Python, on the task's own sequences and adversarial ones up to
n = 1024 tokens (float32)."""

from __future__ import annotations

import pytest
import torch

from pathattn.nn import PaTHAttention
from pathattn.tasks import FlipFlop
from pathattn.tasks.flipflop import BIT0, I, R, W
from pathattn.theory import flipflop_model, last_written_bit

N = 1024
B0, B1 = BIT0, BIT0 + 1


def _pairs(instr: list[int], bits: list[int]) -> torch.Tensor:
    """ids [1, 2 * len(instr)] interleaving instructions and bit ids."""
    return torch.tensor([[u for pair in zip(instr, bits, strict=True) for u in pair]])


def _check_reads(model, ids):
    with torch.no_grad():
        logits = model(ids)
    assert logits.shape == ids.shape + (5,)
    want = last_written_bit(ids)
    reads = (ids == R) & (want >= 0)
    assert reads.any()
    got = logits.argmax(-1)[reads] - BIT0
    assert torch.equal(got, want[reads]), f"{(got != want[reads]).sum()} wrong reads"


def _long_ignore_run():
    """A write of 1 at position 1, 510 ignores with bits 0, a read at the end."""
    P = N // 2
    return _pairs([W] + [I] * (P - 2) + [R], [B1] + [B0] * (P - 1))


def _flip_every_pair():
    """Writes alternating 0 / 1, each read right after: every read sees a fresh write."""
    P = N // 2
    instr = [W if p % 2 == 0 else R for p in range(P)]
    bits = [B0 + (p // 2) % 2 for p in range(P)]
    return _pairs(instr, bits)


def _reads_with_opposite_bits():
    """One write of 0, then reads and ignores whose bits are all 1 (not writes)."""
    P = N // 2
    return _pairs([W] + [R, I] * ((P - 1) // 2) + [R], [B0] + [B1] * (P - 1))


def _many_writes_then_reads():
    """511 writes, the last one 0 after 510 of 1, then one read at the end."""
    P = N // 2
    return _pairs([W] * (P - 1) + [R], [B1] * (P - 2) + [B0, B1])


ADVERSARIAL = {"long_ignore_run": _long_ignore_run, "flip_every_pair": _flip_every_pair,
               "reads_with_opposite_bits": _reads_with_opposite_bits,
               "many_writes_then_reads": _many_writes_then_reads}


@pytest.fixture(scope="module")
def model():
    return flipflop_model(N)


def test_ground_truth():
    ids = torch.tensor([[W, B1, I, B0, R, B1, W, B0, R, B0]])
    assert last_written_bit(ids).tolist() == [[-1, 1, 1, 1, 1, 1, 1, 0, 0, 0]]


@pytest.mark.parametrize("split", ["val", "val_sparse", "val_dense"])
def test_task_sequences(model, split):
    ids, _ = next(iter(FlipFlop(split=split, batch_size=2, num_pairs=N // 2, seed=7)))
    reads = ids == R
    stored = ids.roll(-1, dims=1)[reads] - BIT0  # the task's own answer at each read
    assert torch.equal(last_written_bit(ids)[reads], stored)
    _check_reads(model, ids)


@pytest.mark.parametrize("case", ADVERSARIAL)
def test_adversarial_sequences(model, case):
    ids = ADVERSARIAL[case]()
    assert ids.shape == (1, N)
    _check_reads(model, ids)


@pytest.mark.parametrize("n", [3, 4, 7, 16])
def test_short_lengths(n):
    """Every read of random flip-flop sequences of n tokens that start with a write."""
    g = torch.Generator().manual_seed(n)
    ids = torch.empty(256, n, dtype=torch.long)
    ids[:, 0::2] = torch.randint(0, 3, ids[:, 0::2].shape, generator=g)
    ids[:, 1::2] = BIT0 + torch.randint(0, 2, ids[:, 1::2].shape, generator=g)
    ids[:, 0], ids[:, 2] = W, R
    _check_reads(flipflop_model(n), ids)


def test_non_read_predictions(model):
    """After w / i the model predicts a bit, after a bit an instruction (paper's LM head)."""
    ids, _ = next(iter(FlipFlop(split="val", batch_size=1, num_pairs=64, seed=1)))
    with torch.no_grad():
        pred = model(ids).argmax(-1)
    assert (pred[(ids == W) | (ids == I)] >= BIT0).all()
    assert (pred[ids >= BIT0] < BIT0).all()


def test_built_from_pathattention(model):
    for layer in (model.layer1, model.layer2):
        assert isinstance(layer, PaTHAttention)
        beta = layer.beta(torch.zeros(1, 3, 16))
        assert torch.equal(beta, torch.ones_like(beta))


@pytest.mark.parametrize("bad", [
    torch.tensor([[0, 5]]),  # not a token
    torch.tensor([[0, 3, 3, 1]]),  # two bits in a row
    torch.tensor([[0, 0, 3]]),  # two instructions in a row
    torch.tensor([[3, 0]]),  # a bit first
    torch.tensor([[0, 3] * 5]),  # longer than n
    torch.zeros(1, 2),  # float ids
], ids=["out_of_vocab", "bit_bit", "instr_instr", "bit_first", "too_long", "float"])
def test_rejects_bad_ids(bad):
    with pytest.raises(ValueError):
        flipflop_model(8)(bad)
