"""Sequences are isolated on every backend: a NaN, an inf or a huge finite value in one batch
row or one packed sequence leaves every other sequence's output and gradients bit for bit
as they are without it.

NaN and inf are set aside before the backend runs (`pathattn.ops.path.nonfinite`); huge finite
values (k = 1e30 overflows the logits, g = -1e16 dwarfs every other gate) reach the backend
itself.
"""

from __future__ import annotations

import pytest
import torch

from .._helpers import NAMES, make_dout, make_inputs, run_with_grads

BAD = {  # id -> (input, value)
    "g-minus_inf": ("g", float("-inf")), "g-minus_1e16": ("g", -1e16), "g-nan": ("g", float("nan")),
    "k-1e30": ("k", 1e30), "w-nan": ("w", float("nan")), "v-inf": ("v", float("inf")),
}


# backend, bad -> why its isolation is not yet exact (strict: an exact result fails the
# test, so the entry goes when the defect does)
KNOWN_DEFECTS: dict[tuple[str, str], str] = {}


def _expect_known_defect(request, backend, bad: str) -> None:
    why = KNOWN_DEFECTS.get((backend.name, bad))
    if why is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=why))


def _hurt(inputs: tuple, bad: str, index) -> tuple:
    """inputs with inputs[name][index] = value for BAD[bad] = (name, value)."""
    name, value = BAD[bad]
    i = NAMES.index(name)
    x = inputs[i].clone()
    x[index] = value
    return inputs[:i] + (x,) + inputs[i + 1:]


def _assert_equal(hurt, clean, keep) -> None:
    """Output and every gradient equal at index `keep` (exactly)."""
    torch.testing.assert_close(hurt[0][keep], clean[0][keep], rtol=0, atol=0)
    for name, got, ref in zip(NAMES, hurt[1], clean[1], strict=True):
        torch.testing.assert_close(got[keep], ref[keep], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("bad", list(BAD))
def test_batch_rows_isolated(request, backend, bad):
    """A bad value in batch row 0 (token 7, query head 0 or key head 0) changes nothing in
    row 1; only row 1 is differentiated (row 0 may be NaN)."""
    _expect_known_defect(request, backend, bad)
    B, T, HQ, H, D = 2, 24, 2, 1, 16
    inputs = make_inputs(B, T, HQ, H, D, D, gates=True)
    dout = make_dout(B, T, HQ, D)
    dout[0] = 0
    clean = run_with_grads(backend.op, inputs, dout, block_size=backend.block_size)
    hurt = run_with_grads(backend.op, _hurt(inputs, bad, (0, 7, 0)), dout,
                          block_size=backend.block_size)
    _assert_equal(hurt, clean, 1)


@pytest.mark.parametrize("bad", list(BAD))
def test_packed_sequences_isolated(request, backend, bad):
    """The same between packed sequences: [0, 23) holds the bad value (token 5), [23, 30)
    and [30, 61) (several blocks) must not notice."""
    _expect_known_defect(request, backend, bad)
    T, HQ, H, D = 61, 2, 2, 16
    cu = torch.tensor([0, 23, 30, 61])
    inputs = make_inputs(1, T, HQ, H, D, D, gates=True)
    dout = make_dout(1, T, HQ, D)
    dout[:, :23] = 0
    kwargs = {"cu_seqlens": cu, "block_size": backend.block_size}
    clean = run_with_grads(backend.op, inputs, dout, **kwargs)
    hurt = run_with_grads(backend.op, _hurt(inputs, bad, (0, 5, 0)), dout, **kwargs)
    _assert_equal(hurt, clean, (slice(None), slice(23, None)))
