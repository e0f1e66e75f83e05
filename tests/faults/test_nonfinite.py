"""A NaN or inf in one token's inputs reaches only that token and the later tokens of its
sequence, as in the definition (and the float64 reference): never the earlier tokens of
its block, never another sequence. Every backend, forward and gradients, and the prefill
(between sequences, every kind of bad value: `tests/ops/path/conformance/test_isolation.py`).
"""

from __future__ import annotations

import pytest
import torch

from pathattn import path_attn_prefill
from pathattn.ops import path_attn_with_keys
from pathattn.ops.path.reference import path_attn_naive
from tests.faults._backends import op  # noqa: F401  (fixture)
from tests.ops.path._helpers import NAMES, make_dout, make_inputs, rel_err, run_with_grads

T_BAD = 13  # inside the first 16-token block: the blockwise paths meet it in a block
VALUES = {"nan": float("nan"), "inf": float("inf")}


def _hurt(inputs, name, value, index):
    i = NAMES.index(name)
    x = inputs[i].clone()
    x[index] = value
    return inputs[:i] + (x,) + inputs[i + 1:]


@pytest.mark.parametrize("value", list(VALUES), ids=list(VALUES))
@pytest.mark.parametrize("name", NAMES)
def test_only_later_tokens_of_the_sequence(op, name, value):  # noqa: F811
    B, T, HQ, H, D = 2, 40, 2, 1, 16
    inputs = make_inputs(B, T, HQ, H, D, D, gates=True)
    hurt = _hurt(inputs, name, VALUES[value], (0, T_BAD))
    o = op(*hurt)
    ref = path_attn_naive(*(x.double() for x in hurt))
    # the same rows are non-finite as in the reference: row 0 from T_BAD on (only T_BAD
    # itself for q), and nothing else
    assert torch.equal(~torch.isfinite(o), ~torch.isfinite(ref))
    expect = torch.zeros(B, T, dtype=torch.bool)
    expect[0, T_BAD:] = True
    if name == "q":
        expect[0, T_BAD + 1:] = False
    assert torch.equal((~torch.isfinite(o)).any(-1).any(-1), expect)
    ok = torch.isfinite(ref)
    assert rel_err(o[ok], ref[ok]) < 1e-5
    torch.testing.assert_close(o[1], op(*inputs)[1], rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_gradients_of_earlier_tokens(op, name):  # noqa: F811
    """Differentiating the finite rows (before the NaN) gives finite gradients, equal to
    those of the same rows computed without the NaN."""
    B, T, HQ, H, D = 1, 40, 2, 2, 16
    inputs = make_inputs(B, T, HQ, H, D, D, gates=True)
    dout = make_dout(B, T, HQ, D)
    dout[:, T_BAD:] = 0
    clean = run_with_grads(op, inputs, dout)
    hurt = run_with_grads(op, _hurt(inputs, name, float("nan"), (0, T_BAD)), dout)
    for n, got, ref in zip(NAMES, hurt[1], clean[1], strict=True):
        assert torch.isfinite(got).all(), n
        assert rel_err(got, ref) < 1e-6, n


def test_packed_sequences(op):  # noqa: F811
    """A NaN w in the first packed sequence: its earlier tokens are finite, its later ones
    NaN, the second sequence is untouched."""
    T, HQ, H, D = 50, 2, 1, 16
    cu = torch.tensor([0, 20, 50])
    inputs = make_inputs(1, T, HQ, H, D, D, gates=True)
    o = op(*_hurt(inputs, "w", float("nan"), (0, 5)), cu_seqlens=cu)
    assert torch.isfinite(o[:, :5]).all() and torch.isnan(o[:, 5:20]).all()
    torch.testing.assert_close(o[:, 20:], op(*inputs, cu_seqlens=cu)[:, 20:], rtol=0, atol=0)


def test_prefill_keeps_earlier_tokens():
    """The prefill's output rows before a NaN w are finite; the cached keys that carry its
    transform (j < t) are NaN, later keys are not."""
    B, T, HQ, H, D = 1, 40, 2, 1, 16
    inputs = _hurt(make_inputs(B, T, HQ, H, D, D, gates=True), "w", float("nan"), (0, T_BAD))
    o, _ = path_attn_prefill(*inputs)
    assert torch.isfinite(o[:, :T_BAD]).all() and torch.isnan(o[:, T_BAD:]).all()
    _, keys = path_attn_with_keys(*inputs)
    assert torch.isnan(keys[:, :T_BAD + 1]).all() and torch.isfinite(keys[:, T_BAD + 1:]).all()


def test_finite_inputs_whose_sum_overflows_are_not_poisoned(op):  # noqa: F811
    """The CPU's quick check sums each input; values near the float32 maximum make that sum
    inf though every entry is finite. The op must then take the exact path, not mark rows
    as non-finite: with v scaled by 1e37 the output is the same attention, scaled."""
    inputs = make_inputs(1, 40, 2, 1, 16, 16, gates=True)
    q, k, v, w, beta, g = inputs
    v = v.abs() + 1
    big = v * 1e37  # finite in float32; its sum (of positive entries) overflows to inf
    assert torch.isfinite(big).all() and not torch.isfinite(big.sum())
    o = op(q, k, big, w, beta, g)
    assert torch.isfinite(o).all()
    torch.testing.assert_close(o / 1e37, op(q, k, v, w, beta, g), rtol=1e-4, atol=1e-6)
