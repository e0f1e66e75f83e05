"""PaTHAttention with num_reflections R > 1: the layer against its equations (float64,
`path_attn_naive` with w [B, T, H, R, D]), R = 1 keeps the parameters and state_dict of the
one-reflection layer, and the argument is validated. (Prefill, decode, padding and packing
with R = 2 run in the layer contract of `test_path_attention.py`, entry
"path_fox_gqa_reflections2" of `tests/nn/LAYERS`.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pathattn.models import ModelConfig
from pathattn.nn import PaTHAttention
from pathattn.ops import path_attn_naive

from . import HIDDEN, assert_rel


def _by_hand(layer: PaTHAttention, x: torch.Tensor) -> torch.Tensor:
    """The layer written out: every key/value head has R directions (short conv, L2 norm
    each) and R strengths; path_attn_naive applies H_{t,1} ... H_{t,R}."""
    B, T, _ = x.shape
    HQ, H, D, R = layer.num_heads, layer.num_kv_heads, layer.head_dim, layer.num_reflections
    q = F.linear(x, layer.q_proj.weight).view(B, T, HQ, D)
    k = F.linear(x, layer.k_proj.weight).view(B, T, H, D)
    v = F.linear(x, layer.v_proj.weight).view(B, T, H, D)
    u = F.linear(F.linear(x, layer.w_proj[0].weight), layer.w_proj[1].weight)  # [B, T, HRD]
    K = layer.w_conv.kernel_size
    u = F.conv1d(F.pad(u.transpose(1, 2), (K - 1, 0)), layer.w_conv.weight,
                 groups=H * R * D).transpose(1, 2)
    w = F.normalize(u.reshape(B, T, H, R, D), dim=-1)
    beta = layer.beta_max * torch.sigmoid(F.linear(x, layer.beta_proj.weight,
                                                   layer.beta_proj.bias)).view(B, T, H, R)
    g = F.logsigmoid(F.linear(x, layer.g_proj.weight, layer.g_proj.bias))
    o = path_attn_naive(q, k, v, w, beta, g)
    return F.linear(o.reshape(B, T, HQ * D), layer.o_proj.weight)


@pytest.mark.parametrize("R", [2, 3], ids=lambda r: f"R{r}")
def test_matches_equations_float64(R):
    torch.manual_seed(0)
    layer = PaTHAttention(HIDDEN, 4, num_kv_heads=2, w_rank=8, use_forget_gate=True,
                          num_reflections=R).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(2, 15, HIDDEN, dtype=torch.float64)
    assert_rel(layer(x), _by_hand(layer, x), 1e-9)


def test_gradients_match_equations_float64():
    torch.manual_seed(1)
    layer = PaTHAttention(HIDDEN, 4, num_kv_heads=2, w_rank=8, use_forget_gate=True,
                          num_reflections=2).double()
    x = torch.randn(1, 11, HIDDEN, dtype=torch.float64)
    params = list(layer.parameters())
    ours = torch.autograd.grad(layer(x).square().sum(), params)
    ref = torch.autograd.grad(_by_hand(layer, x).square().sum(), params)
    for (name, _), a, b in zip(layer.named_parameters(), ours, ref, strict=True):
        assert_rel(a, b, 1e-9, name)


def test_one_reflection_keeps_the_layer():
    """num_reflections=1: the same parameters, state_dict and outputs as the default."""
    torch.manual_seed(0)
    default = PaTHAttention(HIDDEN, 4, num_kv_heads=2, use_forget_gate=True)
    torch.manual_seed(0)
    one = PaTHAttention(HIDDEN, 4, num_kv_heads=2, use_forget_gate=True, num_reflections=1)
    sd, sd1 = default.state_dict(), one.state_dict()
    assert list(sd) == list(sd1)
    assert all(torch.equal(sd[k], sd1[k]) for k in sd)
    x = torch.randn(2, 10, HIDDEN)
    assert torch.equal(default(x), one(x))


def test_parameter_shapes():
    layer = PaTHAttention(HIDDEN, 4, num_kv_heads=2, head_dim=8, w_rank=None,
                          num_reflections=3)
    assert layer.w_proj.weight.shape == (2 * 3 * 8, HIDDEN)
    assert layer.w_conv.weight.shape[0] == 2 * 3 * 8
    assert layer.beta_proj.weight.shape == (2 * 3, HIDDEN)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None])
def test_num_reflections_validated(bad):
    with pytest.raises(ValueError, match="^num_reflections must be a positive int"):
        PaTHAttention(HIDDEN, 4, num_reflections=bad)
    with pytest.raises(ValueError, match="^num_reflections must be a positive int"):
        ModelConfig(num_reflections=bad)
