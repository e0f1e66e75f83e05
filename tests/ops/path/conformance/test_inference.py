"""Inference on every backend: `path_attn_prefill(backend=)` of a prompt, then
`path_attn_step(backend=)` over the rest, reproduce the backend's `path_attn` on the whole
sequence and the float64 reference (float32 tolerance of `_cases`); with left padding each
row equals its real tokens alone. `path_attn_with_keys(backend=)` gives the reference's
transformed keys, or, for a backend without them, a ValueError naming it.
"""

from __future__ import annotations

import pytest
import torch

from pathattn import path_attn_prefill, path_attn_step
from pathattn.ops import path_attn_naive, path_attn_with_keys
from pathattn.ops.path.backends import get_backend

from .._helpers import make_inputs, rel_err
from ..test_inference import naive_keys
from ._cases import F32_TOL

B, T, P, HQ, H, D = 2, 30, 17, 4, 2, 16  # P: prompt length; steps cover [P, T)
STEPS = (1, 3, 1, 5)  # step sizes, cycled: single tokens and chunks


def _to(device, inputs: tuple, a: int = 0, b: int | None = None) -> tuple:
    """Positions [a, b) of every input, on `device` (None stays None)."""
    return tuple(None if x is None else x[:, a:b].to(device) for x in inputs)


def _prefill_and_steps(backend, inputs: tuple, mask=None) -> torch.Tensor:
    """Outputs [B, T, HQ, Dv] of the prefill of [0, P) and steps over [P, T), on the CPU."""
    dev = backend.device
    mask = None if mask is None else mask.to(dev)
    o, state = path_attn_prefill(*_to(dev, inputs, 0, P), attention_mask=mask,
                                 backend=backend.name)
    outs, t, i = [o], P, 0
    while t < T:
        m = min(STEPS[i % len(STEPS)], T - t)
        outs.append(path_attn_step(*_to(dev, inputs, t, t + m), state=state,
                                   backend=backend.name))
        t, i = t + m, i + 1
    return torch.cat(outs, dim=1).cpu()


@pytest.mark.parametrize("gates", [True, False], ids=["gates", "nogates"])
def test_prefill_then_steps_equal_path_attn(backend, gates):
    inputs = make_inputs(B, T, HQ, H, D, D, gates)
    o = _prefill_and_steps(backend, inputs)
    assert rel_err(o, backend.op(*inputs)) < F32_TOL
    assert rel_err(o, path_attn_naive(*(None if x is None else x.double() for x in inputs))) \
        < F32_TOL


def test_left_padded_prefill_equals_each_row_alone(backend):
    """Row 1 has 4 padding tokens on the left: its real tokens give the output of its
    sequence run alone; row 0 is unchanged."""
    inputs = make_inputs(B, T, HQ, H, D, D, gates=True)
    mask = torch.ones(B, P, dtype=torch.long)
    mask[1, :4] = 0
    o = _prefill_and_steps(backend, inputs, mask)
    for row, start in ((0, 0), (1, 4)):
        alone = tuple(x[row: row + 1, start:].double() for x in inputs)
        assert rel_err(o[row: row + 1, start:], path_attn_naive(*alone)) < F32_TOL, row
    assert (o[1, :4] == 0).all()


def test_path_attn_with_keys(backend):
    """(o, keys): o as path_attn, keys[j] = H_{T-1} ... H_{j+1} k_j of the reference."""
    inputs = make_inputs(1, T, HQ, H, D, D, gates=True)
    cu = torch.tensor([0, 11, T])
    on_dev = _to(backend.device, inputs)
    cu_dev = cu.to(backend.device)
    if get_backend(backend.name).with_keys is None:
        with pytest.raises(ValueError, match=f"^backend={backend.name!r}: "):
            path_attn_with_keys(*on_dev, cu_seqlens=cu_dev, backend=backend.name)
        return
    o, keys = path_attn_with_keys(*on_dev, cu_seqlens=cu_dev, backend=backend.name)
    o_ref = path_attn_naive(*(x.double() for x in inputs), cu_seqlens=cu)
    assert rel_err(o.cpu(), o_ref) < F32_TOL
    q, k, v, w, beta, g = inputs
    for a, b in ((0, 11), (11, T)):  # each sequence's keys, transformed within it
        ref = naive_keys(k[:, a:b], w[:, a:b], beta[:, a:b])
        assert rel_err(keys[:, a:b].cpu(), ref) < F32_TOL, (a, b)
