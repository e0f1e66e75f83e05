"""The baselines against their equations written out in float64 (RoPE: complex rotations;
FoX: explicit logits with gate differences). The forward / prefill / decode contract of
every layer type is tested in `test_path_attention.py`."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pathattn.nn import FoXAttention, RoPEAttention, RotaryEmbedding

from . import HIDDEN, assert_rel


def _heads(layer, x):
    B, T, _ = x.shape
    D = layer.head_dim
    q = F.linear(x, layer.q_proj.weight).view(B, T, -1, D)  # [B, T, HQ, D]
    k = F.linear(x, layer.k_proj.weight).view(B, T, -1, D)  # [B, T, H, D]
    v = F.linear(x, layer.v_proj.weight).view(B, T, -1, D)  # [B, T, H, D]
    groups = layer.num_heads // layer.num_kv_heads
    return q, k.repeat_interleave(groups, 2), v.repeat_interleave(groups, 2)


def _softmax_attention(q, k, v, extra=None):
    """Causal softmax(scale q k^T + extra) v over [B, T, HQ, D]; extra [B, HQ, T, T]."""
    T, D = q.shape[1], q.shape[-1]
    logits = torch.einsum("bihd,bjhd->bhij", q, k) * D**-0.5
    if extra is not None:
        logits = logits + extra
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    p = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1)
    return torch.einsum("bhij,bjhd->bihd", p, v)


def _rotate(x, base=10000.0):
    """RoPE as complex multiplication: pairs (d, d + D/2) by angle t * base^(-2d/D)."""
    T, D = x.shape[1], x.shape[-1]
    freq = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)  # [D/2]
    rot = torch.polar(torch.ones(T, D // 2, dtype=torch.float64),
                      torch.arange(T, dtype=torch.float64)[:, None] * freq)  # [T, D/2]
    z = torch.complex(x[..., : D // 2], x[..., D // 2:]) * rot[None, :, None, :]
    return torch.cat([z.real, z.imag], dim=-1)


@pytest.mark.parametrize("kv", [4, 2, 1], ids=lambda h: f"kv{h}")
def test_rope_matches_equations_float64(kv):
    layer = RoPEAttention(HIDDEN, 4, num_kv_heads=kv).double()
    x = torch.randn(2, 17, HIDDEN, dtype=torch.float64)
    q, k, v = _heads(layer, x)
    o = _softmax_attention(_rotate(q), _rotate(k), v)
    want = F.linear(o.reshape(2, 17, -1), layer.o_proj.weight)
    assert_rel(layer(x), want, 1e-10)


@pytest.mark.parametrize("kv", [4, 2], ids=lambda h: f"kv{h}")
def test_fox_matches_equations_float64(kv):
    layer = FoXAttention(HIDDEN, 4, num_kv_heads=kv).double()
    x = torch.randn(2, 17, HIDDEN, dtype=torch.float64)
    q, k, v = _heads(layer, x)
    g = F.logsigmoid(F.linear(x, layer.g_proj.weight, layer.g_proj.bias))  # [B, T, HQ]
    G = g.cumsum(1).transpose(1, 2)  # [B, HQ, T]
    o = _softmax_attention(q, k, v, G[:, :, :, None] - G[:, :, None, :])  # G_i - G_j
    want = F.linear(o.reshape(2, 17, -1), layer.o_proj.weight)
    assert_rel(layer(x), want, 1e-10)


def test_rope_relative_positions():
    rope = RotaryEmbedding(8)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def dot(i, j):
        return (rope(q, torch.tensor([i])) * rope(k, torch.tensor([j]))).sum()

    assert_rel(dot(7, 3), dot(4, 0), 1e-5)


def test_rope_cache_truncate_any_length():
    layer = RoPEAttention(HIDDEN, 4)
    x = torch.randn(2, 12, HIDDEN)
    _, cache = layer.prefill(x[:, :8])
    cache.truncate(5)
    assert_rel(layer.decode(x[:, 8:11], cache), layer(torch.cat([x[:, :5], x[:, 8:11]], 1))[:, 5:])
    with pytest.raises(ValueError, match="new_len"):
        cache.truncate(99)


def test_rope_odd_head_dim():
    with pytest.raises(ValueError, match="head_dim"):
        RoPEAttention(HIDDEN, 4, head_dim=7)


@pytest.mark.parametrize("cls", [RoPEAttention, FoXAttention], ids=lambda c: c.__name__)
def test_constructor_errors(cls):
    with pytest.raises(ValueError, match="hidden_size"):
        cls(30, 4)
    with pytest.raises(ValueError, match="num_kv_heads"):
        cls(32, 4, num_kv_heads=3)
