"""The reference `sb_attn_naive` against the definition written out scalar by scalar, and
its basic properties."""

from __future__ import annotations

import math

import pytest
import torch

from pathattn.ops.sba import sb_attn_naive

from ._helpers import Case


def scalar_definition(q, k, v, i: int, h: int, attend_current: bool, scale: float):
    """o_i of head h (one sequence, HQ == H), products taken one factor at a time."""
    sig = lambda a, b: 1 / (1 + math.exp(-scale * float(q[a, h] @ k[b, h])))  # noqa: E731
    last = i if attend_current else i - 1
    out = torch.zeros(v.shape[-1], dtype=torch.float64)
    for j in range(last + 1):
        weight = sig(i, j)
        for kk in range(j + 1, last + 1):
            weight *= 1 - sig(i, kk)
        out += weight * v[j, h].double()
    return out


@pytest.mark.parametrize("attend_current", [False, True], ids=["strict", "current"])
def test_matches_scalar_definition(attend_current):
    q, k, v = Case(T=6, HQ=2, H=2, D=4, Dv=3).inputs(torch.float64)
    o = sb_attn_naive(q, k, v, attend_current=attend_current, scale=0.7)
    for i in range(6):
        for h in range(2):
            want = scalar_definition(q[0], k[0], v[0], i, h, attend_current, 0.7)
            torch.testing.assert_close(o[0, i, h], want)


def test_packed_sequences_are_independent():
    q, k, v = Case(T=9, HQ=2, H=1).inputs(torch.float64)
    o = sb_attn_naive(q, k, v, cu_seqlens=torch.tensor([0, 4, 4, 9]))
    torch.testing.assert_close(o[:, :4], sb_attn_naive(q[:, :4], k[:, :4], v[:, :4]))
    torch.testing.assert_close(o[:, 4:], sb_attn_naive(q[:, 4:], k[:, 4:], v[:, 4:]))


def test_plain_precision_keeps_the_dtype():
    q, k, v = Case(T=5).inputs(torch.bfloat16)
    assert sb_attn_naive(q, k, v, dtype=None).dtype == torch.bfloat16
    assert sb_attn_naive(q, k, v).dtype == torch.float64
