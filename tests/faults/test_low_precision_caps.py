"""PaTH's per-token inputs in low precision: what the layer hands to the op in forward,
prefill and decode, for bf16 and fp16 layers and a float32 layer under CPU bf16 autocast,
with pre-activations that saturate the sigmoid.

* beta < beta_max strictly, for beta_max in {1.99, 1.999, 2.0} (in bf16, 1.999 *
  sigmoid(.) used to round to exactly 2.0, the singular transform the cap avoids);
* |w| <= 1 after w is rounded to the activation dtype;
* the forget gates are float32 logsigmoids, accurate to float32.

The op's arguments are recorded by wrapping the op functions the layer module calls (they
run unchanged)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import pathattn.nn.path_attention as path_attention
from pathattn.nn import PaTHAttention

from ..nn import HIDDEN, assert_rel

BETA_MAX = [1.99, 1.999, 2.0]
PRECISIONS = {  # id -> (layer dtype, autocast)
    "bf16": (torch.bfloat16, False),
    "fp16": (torch.float16, False),
    "bf16_autocast": (torch.float32, True),
}
OPS = ("path_attn", "path_attn_prefill", "path_attn_step")


@pytest.fixture
def op_calls(monkeypatch):
    """Records (op name, q, k, v, w, beta, g) of every op call of the PaTH layer."""
    calls = []
    for name in OPS:
        op = getattr(path_attention, name)

        def record(q, k, v, w, beta, g=None, *args, _op=op, _name=name, **kwargs):
            calls.append((_name, q, k, v, w, beta, g))
            return _op(q, k, v, w, beta, g, *args, **kwargs)

        monkeypatch.setattr(path_attention, name, record)
    return calls


def _saturating_layer(beta_max: float, dtype: torch.dtype, forget_gate: bool = False):
    """A PaTH layer whose beta pre-activations reach +1e4 (head 0), +40 (head 1, float32
    sigmoid == 1 exactly), +17 and -1e4, and whose forget-gate pre-activations span
    [-30, 30]."""
    torch.manual_seed(0)
    layer = PaTHAttention(HIDDEN, 4, use_forget_gate=forget_gate, beta_max=beta_max)
    with torch.no_grad():
        layer.beta_proj.weight.mul_(0.01)
        layer.beta_proj.bias.copy_(torch.tensor([1e4, 40.0, 17.0, -1e4]))
        if forget_gate:
            layer.g_proj.weight.mul_(5.0)
            layer.g_proj.bias.copy_(torch.tensor([-30.0, -2.0, 5.0, 30.0]))
    return layer.to(dtype)


def _run_all_paths(layer, x: torch.Tensor, autocast: bool) -> None:
    """forward, prefill (with left padding) and two decode steps."""
    mask = torch.ones(x.shape[0], 12, dtype=torch.long)
    mask[1, :5] = 0
    ctx = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
    with ctx:
        layer(x)
        _, cache = layer.prefill(x[:, :12], attention_mask=mask)
        layer.decode(x[:, 12:13], cache)
        layer.decode(x[:, 13:], cache)


@pytest.mark.parametrize("precision", list(PRECISIONS), ids=str)
@pytest.mark.parametrize("beta_max", BETA_MAX, ids=lambda b: f"beta_max{b}")
def test_beta_strictly_below_cap_in_every_path(op_calls, beta_max, precision):
    dtype, autocast = PRECISIONS[precision]
    layer = _saturating_layer(beta_max, dtype)
    x = (8 * torch.randn(2, 16, HIDDEN)).to(dtype)
    _run_all_paths(layer, x, autocast)
    assert sorted({c[0] for c in op_calls}) == sorted(OPS)
    for op, *_, beta, _ in op_calls:
        assert beta.dtype == torch.float32, op
        assert bool((beta >= 0).all()), op
        assert bool((beta < beta_max).all()), f"{op}: max beta {beta.max().item()!r}"
        assert bool((beta.double() < beta_max).all()), op  # below the real number too
    # saturated heads sit on the largest float32 below the cap: the cap is tight
    top = torch.nextafter(torch.tensor(beta_max), torch.tensor(0.0))
    assert op_calls[0][5][..., 0].max() == top


@pytest.mark.parametrize("precision", list(PRECISIONS), ids=str)
@pytest.mark.parametrize("beta_max", BETA_MAX, ids=lambda b: f"beta_max{b}")
def test_public_beta_strictly_below_cap(beta_max, precision):
    dtype, autocast = PRECISIONS[precision]
    layer = _saturating_layer(beta_max, dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        beta = layer.beta((100 * torch.randn(3, 50, HIDDEN)).to(dtype))
    assert beta.dtype == torch.float32
    assert bool((beta < beta_max).all()) and bool((beta.double() < beta_max).all())


@pytest.mark.parametrize("precision", list(PRECISIONS), ids=str)
def test_w_is_at_most_unit_length_in_the_op_dtype(op_calls, precision):
    dtype, autocast = PRECISIONS[precision]
    layer = _saturating_layer(1.999, dtype)
    _run_all_paths(layer, torch.randn(2, 16, HIDDEN).to(dtype), autocast)
    for op, q, _, _, w, _, _ in op_calls:
        assert w.dtype == q.dtype == (torch.bfloat16 if autocast else dtype), op
        norm = w.double().norm(dim=-1)
        assert bool((norm <= 1).all()), f"{op}: max |w| - 1 = {(norm.max() - 1).item():.2e}"
        real = norm[norm > 0]  # w = 0 at left padding (the conv's inputs are zeroed)
        assert real.numel() and bool((real > 1 - 2e-2).all()), op  # unit up to rounding


@pytest.mark.parametrize("precision", list(PRECISIONS), ids=str)
def test_forget_gates_are_float32_logsigmoids(op_calls, precision):
    """g is computed from float32 copies of x and the gate's weights: it equals the
    float64 logsigmoid of the same numbers to float32 accuracy (a bf16 gate of -0.007 is
    off by ~1e-5 per token, an error that the gate sums G_i accumulate)."""
    dtype, autocast = PRECISIONS[precision]
    layer = _saturating_layer(1.99, dtype, forget_gate=True)
    x = torch.randn(2, 16, HIDDEN).to(dtype)
    _run_all_paths(layer, x, autocast)
    z = F.linear(x.double(), layer.g_proj.weight.double(), layer.g_proj.bias.double())
    want = F.logsigmoid(z)  # [B, T, HQ]
    for op, *_, g in op_calls:
        assert g.dtype == torch.float32 and bool((g <= 0).all()), op
    g = op_calls[0][6]  # the forward's gates, all tokens
    assert bool(((g.double() - want).abs() <= 1e-5 * want.abs() + 1e-6).all())


@pytest.mark.parametrize("precision", list(PRECISIONS), ids=str)
def test_gradients_flow_through_capped_beta_and_rounded_w(precision):
    dtype, autocast = PRECISIONS[precision]
    torch.manual_seed(0)
    layer = PaTHAttention(HIDDEN, 4, beta_max=1.999).to(dtype)
    x = torch.randn(2, 10, HIDDEN).to(dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = layer(x)
    y.float().square().sum().backward()
    for name in ("beta_proj.weight", "w_proj.0.weight", "w_conv.weight"):
        grad = layer.get_parameter(name).grad
        assert grad is not None and bool(torch.isfinite(grad).all()), name
        assert float(grad.abs().max()) > 0, name


def test_autocast_on_the_pytorch_path(monkeypatch):
    """Without the C++ kernels the op's PyTorch path ran inside autocast, whose bf16
    casts it cannot take (triangular solves); the layer now runs the op outside it."""
    monkeypatch.setenv("PATHATTN_CPU_KERNEL", "0")
    torch.manual_seed(0)
    layer = PaTHAttention(HIDDEN, 4, use_forget_gate=True, beta_max=1.99)
    x = torch.randn(2, 12, HIDDEN)
    ref = layer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    assert_rel(y.float(), ref, 5e-2)
