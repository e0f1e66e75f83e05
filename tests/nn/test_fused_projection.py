"""The fused input projection of PaTH decode steps (`FusedProjection`,
`PaTHAttention.step_inputs`) against the layer's separate projections, and the life of the
fused weights (built by a cache's first decode step, kept for that cache)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from pathattn.nn.fused_projection import FusedProjection
from pathattn.nn.path_attention import gate_dtype

from . import HIDDEN, LAYERS, assert_rel, make_layer

PATH = [name for name in LAYERS if name.startswith("path")]

# (layer dtype, autocast, tolerance of q, k, v, u): the fused product sums in another order
# than the separate ones, so they agree to the rounding of their dtype
PRECISIONS = {
    "fp32": (torch.float32, False, 1e-6),
    "fp64": (torch.float64, False, 1e-13),
    "bf16": (torch.bfloat16, False, 2e-2),
    "fp32_autocast_bf16": (torch.float32, True, 2e-2),
}


def _separate(layer, x: torch.Tensor):
    """What `op_inputs` computes, before the short conv: q, k, v, u, beta, g."""
    q, k, v = layer.qkv(x)
    xg = x.to(gate_dtype(x))
    return q, k, v, layer.w_proj(x), layer.beta(xg), layer.forget_gate(xg)


@pytest.mark.parametrize("precision", list(PRECISIONS), ids=str)
@pytest.mark.parametrize("name", PATH, ids=str)
def test_step_inputs_equal_separate_projections(name, precision):
    dtype, autocast, tol = PRECISIONS[precision]
    layer = make_layer(name, dtype)
    x = torch.randn(2, 3, HIDDEN).to(dtype)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        got = layer.step_inputs(x, layer.fused_projection())
        want = _separate(layer, x)
    for part, a, b in zip(("q", "k", "v", "u", "beta", "g"), got, want, strict=True):
        if b is None:
            assert a is None, part
            continue
        assert a.dtype == b.dtype and a.shape == b.shape, part
        # beta and g: float32 (float64) math from the same numbers, as op_inputs
        assert_rel(a.float(), b.float(), tol if part in "qkvu" else 1e-6, msg=part)


def test_decode_keeps_the_projection_of_its_first_step():
    """A cache runs on the weights its first decode step saw; a new prefill sees new ones."""
    layer = make_layer("path_fox")
    x = torch.randn(1, 8, HIDDEN)
    before = copy.deepcopy(layer)
    _, cache = layer.prefill(x[:, :5])
    layer.decode(x[:, 5:6], cache)
    projection = cache.projection
    with torch.no_grad():
        layer.q_proj.weight.mul_(2.0)
        layer.beta_proj.bias.add_(1.0)
    y = layer.decode(x[:, 6:], cache)
    assert cache.projection is projection
    assert_rel(y, before(x)[:, 6:])
    _, fresh = layer.prefill(x[:, :5])
    assert_rel(layer.decode(x[:, 5:], fresh), layer(x)[:, 5:])


def test_hooked_projection_is_not_stacked():
    """A layer with its own forward (here a hook, as adapters add) runs as it is."""
    layer = make_layer("path")
    layer.v_proj.register_forward_hook(lambda module, args, out: 2.0 * out)
    x = torch.randn(1, 7, HIDDEN)
    _, cache = layer.prefill(x[:, :4])
    y = layer.decode(x[:, 4:], cache)
    assert not cache.projection.fused
    assert_rel(y, layer(x)[:, 4:])


def test_state_dict_is_unchanged_by_decoding():
    layer = make_layer("path")
    keys = list(layer.state_dict())
    _, cache = layer.prefill(torch.randn(1, 4, HIDDEN))
    layer.decode(torch.randn(1, 1, HIDDEN), cache)
    assert list(layer.state_dict()) == keys


def test_fused_projection_splits_like_the_linears():
    torch.manual_seed(0)
    linears = [nn.Linear(6, 4), nn.Linear(6, 3, bias=False), nn.Linear(6, 2)]
    fused = FusedProjection(linears)
    x = torch.randn(2, 5, 6)
    with torch.no_grad():
        for (first, last), dtype in (((0, 3), None), ((1, 3), None), ((2, 3), torch.float64)):
            got = fused(x, first, last, dtype=dtype)
            for a, lin in zip(got, linears[first:last], strict=True):
                want = lin(x) if dtype is None else copy.deepcopy(lin).to(dtype)(x.to(dtype))
                assert a.dtype == want.dtype
                assert_rel(a, want, 1e-6)
