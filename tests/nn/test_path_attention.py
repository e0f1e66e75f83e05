"""PaTHAttention against the paper's equations (float64, `path_attn_naive`), and the layer
contract shared by every layer type of `tests/nn/LAYERS` (PaTH variants and baselines):
prefill + decode == forward, left padding, packing, reorder, truncate."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pathattn.nn import LayerCache, PaTHAttention
from pathattn.ops import path_attn_naive

from . import HIDDEN, LAYERS, assert_rel, make_layer

# ------------------------------------------------------------------- acceptance (float64)

ACCEPT = {
    "path": dict(num_heads=4),
    "path_fox": dict(num_heads=4, use_forget_gate=True),
    "gqa_qknorm_fullrank_bias": dict(num_heads=4, num_kv_heads=2, w_rank=None, qk_norm=True,
                                     bias=True, beta_max=1.5),
    "fox_mqa_conv4_rank8": dict(num_heads=4, num_kv_heads=1, w_rank=8, conv_size=4,
                                use_forget_gate=True, qk_norm=True),
}


def _by_hand(layer: PaTHAttention, x: torch.Tensor) -> torch.Tensor:
    """The layer's output written out from its weights (section 2.2), path_attn_naive."""
    B, T, _ = x.shape
    HQ, H, D = layer.num_heads, layer.num_kv_heads, layer.head_dim
    q = F.linear(x, layer.q_proj.weight, layer.q_proj.bias).view(B, T, HQ, D)
    k = F.linear(x, layer.k_proj.weight, layer.k_proj.bias).view(B, T, H, D)
    v = F.linear(x, layer.v_proj.weight, layer.v_proj.bias).view(B, T, H, D)
    if layer.q_norm is not None:
        def rms(y, weight):
            return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6) * weight
        q, k = rms(q, layer.q_norm.weight), rms(k, layer.k_norm.weight)
    # w = L2normalize(ShortConv(low-rank projection of x)), per key/value head
    if isinstance(layer.w_proj, torch.nn.Linear):
        u = F.linear(x, layer.w_proj.weight)  # [B, T, H*D]
    else:
        u = F.linear(F.linear(x, layer.w_proj[0].weight), layer.w_proj[1].weight)
    K = layer.w_conv.kernel_size
    u = F.conv1d(F.pad(u.transpose(1, 2), (K - 1, 0)), layer.w_conv.weight,
                 groups=H * D).transpose(1, 2)  # causal depthwise conv, [B, T, H*D]
    w = F.normalize(u.reshape(B, T, H, D), dim=-1)
    beta = layer.beta_max * torch.sigmoid(F.linear(x, layer.beta_proj.weight,
                                                   layer.beta_proj.bias))  # [B, T, H]
    g = None
    if layer.g_proj is not None:
        g = F.logsigmoid(F.linear(x, layer.g_proj.weight, layer.g_proj.bias))  # [B, T, HQ]
    o = path_attn_naive(q, k, v, w, beta, g)  # [B, T, HQ, D] float64
    return F.linear(o.reshape(B, T, HQ * D), layer.o_proj.weight, layer.o_proj.bias)


@pytest.mark.parametrize("cfg", list(ACCEPT), ids=str)
def test_matches_equations_float64(cfg):
    torch.manual_seed(0)
    layer = PaTHAttention(HIDDEN, **ACCEPT[cfg]).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))  # norm weights away from 1, gates varied
    x = torch.randn(2, 19, HIDDEN, dtype=torch.float64)
    assert_rel(layer(x), _by_hand(layer, x), 1e-9)


# ----------------------------------------------------------- contract: every layer type

ALL = list(LAYERS)
PROMPT, STEPS = 9, (1, 3, 1, 3)  # 9 prompt tokens, then decode steps of 1 and 3 tokens


def _decode_all(layer, cache, x_new: torch.Tensor, steps=STEPS) -> torch.Tensor:
    outs, t = [], 0
    for m in steps:
        outs.append(layer.decode(x_new[:, t:t + m], cache))
        t += m
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("name", ALL, ids=str)
def test_prefill_decode_equals_forward(name):
    layer = make_layer(name)
    x = torch.randn(2, PROMPT + sum(STEPS), HIDDEN)
    y_full = layer(x)
    y_pre, cache = layer.prefill(x[:, :PROMPT])
    assert_rel(y_pre, y_full[:, :PROMPT])
    assert_rel(_decode_all(layer, cache, x[:, PROMPT:]), y_full[:, PROMPT:])
    assert len(cache) == x.shape[1]


@pytest.mark.parametrize("name", ALL, ids=str)
def test_left_padding_equals_each_prompt_alone(name):
    layer = make_layer(name)
    lengths, T = [9, 4, 1], 9
    prompts = [torch.randn(1, n, HIDDEN) for n in lengths]
    new = torch.randn(3, sum(STEPS), HIDDEN)
    x = torch.zeros(3, T, HIDDEN)
    mask = torch.zeros(3, T, dtype=torch.long)
    for b, (n, p) in enumerate(zip(lengths, prompts, strict=True)):
        x[b, T - n:], mask[b, T - n:] = p[0], 1
    x[mask == 0] = 5.0  # garbage at padding must not leak
    y_pre, cache = layer.prefill(x, attention_mask=mask)
    y_new = _decode_all(layer, cache, new)
    for b, (n, p) in enumerate(zip(lengths, prompts, strict=True)):
        y_alone, cache_alone = layer.prefill(p)
        assert_rel(y_pre[b, T - n:], y_alone[0])
        assert_rel(y_new[b], _decode_all(layer, cache_alone, new[b:b + 1])[0])


@pytest.mark.parametrize("name", ALL, ids=str)
def test_packed_equals_separate(name):
    layer = make_layer(name)
    lengths = [5, 11, 1, 7]
    xs = [torch.randn(1, n, HIDDEN) for n in lengths]
    dys = [torch.randn(1, n, HIDDEN) for n in lengths]
    cu = torch.tensor([0] + lengths).cumsum(0)
    params = [p for p in layer.parameters()]

    y_packed = layer(torch.cat(xs, dim=1), cu_seqlens=cu)
    g_packed = torch.autograd.grad((y_packed * torch.cat(dys, dim=1)).sum(), params)
    ys = [layer(x) for x in xs]
    g_sep = torch.autograd.grad(sum((y * dy).sum() for y, dy in zip(ys, dys, strict=True)),
                                params)
    assert_rel(y_packed, torch.cat(ys, dim=1))
    for (pname, _), a, b in zip(layer.named_parameters(), g_packed, g_sep, strict=True):
        assert_rel(a, b, msg=pname)


@pytest.mark.parametrize("index", [[2, 0, 0], [1], [0, 1, 2]], ids=lambda i: f"index{i}")
@pytest.mark.parametrize("name", ["path_fox", "path_fox_mqa_qknorm_fullrank", "rope", "fox"],
                         ids=str)
def test_reorder(name, index):
    layer = make_layer(name)
    x, step = torch.randn(3, PROMPT, HIDDEN), torch.randn(3, 2, HIDDEN)
    new = torch.randn(len(index), 4, HIDDEN)
    idx = torch.tensor(index)
    _, cache = layer.prefill(x)
    layer.decode(step, cache)  # rows diverge before the reorder
    cache.reorder(idx)
    got = _decode_all(layer, cache, new, (1, 3))
    _, ref = layer.prefill(x[idx])  # the selected rows' histories, never reordered
    layer.decode(step[idx], ref)
    assert_rel(got, _decode_all(layer, ref, new, (1, 3)))


@pytest.mark.parametrize("name", ["path", "path_fox_mqa_qknorm_fullrank", "rope", "fox"],
                         ids=str)
def test_truncate_after_draft(name):
    layer = make_layer(name)
    x = torch.randn(2, PROMPT + 4, HIDDEN)
    _, cache = layer.prefill(x[:, :PROMPT])
    layer.decode(x[:, PROMPT:PROMPT + 1], cache)
    layer.decode(torch.randn(2, 3, HIDDEN), cache)  # draft of 3, all rejected
    cache.truncate(PROMPT + 1)
    y = layer.decode(x[:, PROMPT + 1:], cache)
    assert_rel(y, layer(x)[:, PROMPT + 1:])


# ------------------------------------------------------------------ PaTH specifics


def test_truncate_range():
    layer = make_layer("path")
    _, cache = layer.prefill(torch.randn(1, 5, HIDDEN))
    assert isinstance(cache, LayerCache)
    layer.decode(torch.randn(1, 3, HIDDEN), cache)
    with pytest.raises(ValueError, match="new_len"):
        cache.truncate(4)
    cache.truncate(6)
    assert len(cache) == 6 and cache.conv_state.shape == (1, 2, HIDDEN)


@pytest.mark.parametrize("beta_max,dtype", [(2.0, torch.float32), (1.5, torch.float32),
                                            (1.9, torch.bfloat16)],
                         ids=["2_fp32", "1.5_fp32", "1.9_bf16"])
def test_beta_in_range(beta_max, dtype):
    layer = PaTHAttention(HIDDEN, 4, beta_max=beta_max).to(dtype)
    beta = layer.beta(torch.randn(2, 64, HIDDEN, dtype=dtype))
    assert beta.shape == (2, 64, 4) and beta.dtype == torch.float32
    assert bool((beta > 0).all()) and bool((beta < beta_max).all())
    with torch.no_grad():  # saturated gates: still strictly below the cap (float32 math)
        layer.beta_proj.bias.fill_(1e4)
    beta = layer.beta(torch.randn(2, 8, HIDDEN, dtype=dtype))
    assert bool((beta < beta_max).all())


def test_forget_gates_start_near_one():
    layer = PaTHAttention(HIDDEN, 4, use_forget_gate=True)
    b = layer.g_proj.bias
    assert bool((b >= 1).all()) and bool((b <= 5).all())


BAD = {
    "hidden_not_divisible": (dict(hidden_size=30, num_heads=4), "hidden_size"),
    "heads_not_multiple_of_kv": (dict(hidden_size=32, num_heads=4, num_kv_heads=3),
                                 "num_kv_heads"),
    "beta_max_above_2": (dict(hidden_size=32, num_heads=4, beta_max=2.5), "beta_max"),
    "beta_max_zero": (dict(hidden_size=32, num_heads=4, beta_max=0.0), "beta_max"),
    "w_rank_negative": (dict(hidden_size=32, num_heads=4, w_rank=-1), "w_rank"),
    "conv_size_zero": (dict(hidden_size=32, num_heads=4, conv_size=0), "conv_size"),
    "num_heads_zero": (dict(hidden_size=32, num_heads=0), "num_heads"),
}


@pytest.mark.parametrize("case", list(BAD), ids=str)
def test_constructor_errors(case):
    kwargs, match = BAD[case]
    with pytest.raises(ValueError, match=match):
        PaTHAttention(**kwargs)


@pytest.mark.parametrize("name", ALL, ids=str)
def test_input_errors(name):
    layer = make_layer(name)
    with pytest.raises(ValueError, match="x must have 3 dimensions"):
        layer(torch.randn(5, HIDDEN))
    with pytest.raises(ValueError, match="hidden_size"):
        layer(torch.randn(1, 5, HIDDEN + 1))
    with pytest.raises(ValueError, match="cu_seqlens"):
        layer(torch.randn(2, 5, HIDDEN), cu_seqlens=torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="cu_seqlens"):
        layer(torch.randn(1, 5, HIDDEN), cu_seqlens=torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="x must have 3 dimensions"):
        layer.prefill(torch.randn(5, HIDDEN))
    with pytest.raises(ValueError, match="attention_mask"):
        layer.prefill(torch.randn(2, 3, HIDDEN), attention_mask=torch.tensor([[1, 1, 1],
                                                                              [1, 1, 2]]))
    _, cache = layer.prefill(torch.randn(1, 5, HIDDEN))
    with pytest.raises(ValueError, match="hidden_size"):
        layer.decode(torch.randn(1, 1, HIDDEN - 1), cache)
