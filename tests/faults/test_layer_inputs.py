"""Layer inputs at the edges, for every layer type of `tests/nn/LAYERS`: empty sequences
(T = 0) in the three paths, and x in another dtype than the weights (a ValueError naming
both dtypes, except under torch.autocast, whose casting rules apply)."""

from __future__ import annotations

import pytest
import torch

from ..nn import HIDDEN, LAYERS, assert_rel, make_layer

ALL = list(LAYERS)


def _empty(B: int = 2, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(B, 0, HIDDEN, dtype=dtype)


# ------------------------------------------------------------------------------ T = 0


@pytest.mark.parametrize("name", ALL, ids=str)
def test_forward_of_empty_sequence(name):
    layer = make_layer(name)
    y = layer(_empty())
    assert y.shape == (2, 0, HIDDEN) and y.dtype == torch.float32
    y.sum().backward()  # autograd through an empty batch works too
    y = layer(_empty(1), cu_seqlens=torch.tensor([0, 0]))  # one packed empty sequence
    assert y.shape == (1, 0, HIDDEN)


@pytest.mark.parametrize("name", ALL, ids=str)
def test_empty_prompt_then_decode_equals_forward(name):
    """prefill of T = 0 gives an empty output and an empty cache; decoding after it is
    the forward of the decoded tokens alone."""
    layer = make_layer(name)
    mask = torch.ones(2, 0, dtype=torch.long)
    y0, cache = layer.prefill(_empty(), attention_mask=mask)
    assert y0.shape == (2, 0, HIDDEN) and len(cache) == 0
    x = torch.randn(2, 4, HIDDEN)
    y = torch.cat([layer.decode(x[:, :1], cache), layer.decode(x[:, 1:], cache)], dim=1)
    assert_rel(y, layer(x))
    assert len(cache) == 4


@pytest.mark.parametrize("name", ALL, ids=str)
def test_decode_of_no_tokens_is_a_no_op(name):
    layer = make_layer(name)
    x = torch.randn(2, 7, HIDDEN)
    _, cache = layer.prefill(x[:, :5])
    y0 = layer.decode(_empty(), cache)
    assert y0.shape == (2, 0, HIDDEN) and len(cache) == 5
    assert_rel(layer.decode(x[:, 5:], cache), layer(x)[:, 5:])


# ------------------------------------------------------------------------------ dtypes

MISMATCH = {  # (x dtype, layer dtype)
    "x_bf16_layer_fp32": (torch.bfloat16, torch.float32),
    "x_fp32_layer_bf16": (torch.float32, torch.bfloat16),
    "x_fp64_layer_fp32": (torch.float64, torch.float32),
    "x_fp16_layer_fp64": (torch.float16, torch.float64),
}


def _three_paths(layer, x: torch.Tensor):
    """Callables running forward, prefill and decode on x (decode after a prompt of the
    layer's own dtype)."""
    own = x.to(layer.q_proj.weight.dtype)
    return {"forward": lambda: layer(x), "prefill": lambda: layer.prefill(x),
            "decode": lambda: layer.decode(x[:, :1], layer.prefill(own)[1])}


@pytest.mark.parametrize("case", list(MISMATCH), ids=str)
@pytest.mark.parametrize("name", ALL, ids=str)
def test_dtype_mismatch_raises_naming_both(name, case):
    x_dtype, layer_dtype = MISMATCH[case]
    layer = make_layer(name, layer_dtype)
    x = torch.randn(2, 5, HIDDEN, dtype=x_dtype)
    for path, run in _three_paths(layer, x).items():
        with pytest.raises(ValueError, match="x has dtype") as err:
            run()
        assert str(x_dtype) in str(err.value) and str(layer_dtype) in str(err.value), path


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16], ids=["x_fp32", "x_bf16"])
@pytest.mark.parametrize("name", ALL, ids=str)
def test_autocast_rules_apply(name, x_dtype):
    """A float32 layer under CPU bf16 autocast takes x of either dtype, returns bf16 and
    stays close to its float32 output, in all three paths."""
    layer = make_layer(name)
    x = torch.randn(2, 6, HIDDEN)
    ref = layer(x)
    _, ref_cache = layer.prefill(x[:, :4])
    ref_step = layer.decode(x[:, 4:], ref_cache)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x.to(x_dtype))
        y_pre, cache = layer.prefill(x[:, :4].to(x_dtype))
        y_step = layer.decode(x[:, 4:].to(x_dtype), cache)
    for got, want in ((y, ref), (y_pre, ref[:, :4]), (y_step, ref_step)):
        assert got.dtype == torch.bfloat16
        assert_rel(got.float(), want, 5e-2)
