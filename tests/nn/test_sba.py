"""`SBAttention` against the stick-breaking equations written out in float64 (explicit
products over [T, T, T]). The forward / prefill / decode contract of every layer type is
tested in `test_path_attention.py` (the "sba" entries of `LAYERS`)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pathattn.nn import SBAttention

from . import HIDDEN, assert_rel


def _stick_breaking(q, k, v, attend_current: bool):
    """o [B, T, HQ, D] from q, k, v [B, T, HQ, D] by the definition, float64."""
    T, D = q.shape[1], q.shape[-1]
    beta = torch.sigmoid(torch.einsum("bihd,bjhd->bhij", q, k) * D**-0.5)  # [B, HQ, T, T]
    i = torch.arange(T)
    allowed = i[None] <= i[:, None] if attend_current else i[None] < i[:, None]  # [T, T]
    between = (i[None, None] > i[None, :, None]) & allowed[:, None]  # [i, j, k]
    factors = torch.where(between, 1 - beta[..., None, :], torch.ones(()))  # [B, HQ, i, j, k]
    A = beta * factors.prod(-1) * allowed
    return torch.einsum("bhij,bjhd->bihd", A, v)


@pytest.mark.parametrize("attend_current", [False, True], ids=["strict", "current"])
@pytest.mark.parametrize("kv", [4, 2], ids=lambda h: f"kv{h}")
def test_matches_equations_float64(kv, attend_current):
    layer = SBAttention(HIDDEN, 4, num_kv_heads=kv, attend_current=attend_current).double()
    x = torch.randn(2, 13, HIDDEN, dtype=torch.float64)
    B, T, D = 2, 13, layer.head_dim
    groups = 4 // kv
    q = F.linear(x, layer.q_proj.weight).view(B, T, 4, D)
    k = F.linear(x, layer.k_proj.weight).view(B, T, kv, D).repeat_interleave(groups, 2)
    v = F.linear(x, layer.v_proj.weight).view(B, T, kv, D).repeat_interleave(groups, 2)
    o = _stick_breaking(q, k, v, attend_current)
    want = F.linear(o.reshape(B, T, -1), layer.o_proj.weight)
    assert_rel(layer(x), want, 1e-10)


def test_first_token_sees_nothing_without_attend_current():
    layer = SBAttention(HIDDEN, 4, o_bias=True)
    x = torch.randn(1, 5, HIDDEN)
    y = layer(x)
    torch.testing.assert_close(y[0, 0], layer.o_proj.bias)


def test_constructor_and_cache_errors():
    with pytest.raises(ValueError, match="hidden_size"):
        SBAttention(30, 4)
    with pytest.raises(ValueError, match="num_kv_heads"):
        SBAttention(32, 4, num_kv_heads=3)
    with pytest.raises(ValueError, match="attend_current"):
        SBAttention(32, 4, attend_current="yes")
    layer = SBAttention(HIDDEN, 4)
    with pytest.raises(ValueError, match="SBACache"):
        layer.decode(torch.randn(1, 1, HIDDEN), cache=None)
