"""The blockwise op's two routes on the CPU (`pathattn.ops.path.function`): the fused kernels
reading the token tensors in place (no padded block) against the same kernels on gathered
blocks: forward, every gradient, and the prefill's keys."""

from __future__ import annotations

import pytest
import torch

from pathattn.ops.path import function
from pathattn.ops.path.api import path_attn, path_attn_with_keys
from pathattn.ops.path.cpu import load_kernels

from ._helpers import (
    NAMES,
    make_dout,
    make_inputs,
    make_reflection_inputs,
    run_with_grads,
    strided_view,
)

pytestmark = pytest.mark.skipif(not load_kernels(), reason="CPU kernel could not be built")

CASES = [  # B, T, HQ, H, R, gates, cu_seqlens, strided
    (2, 128, 4, 2, 1, True, None, False),
    (1, 192, 2, 2, 2, False, (0, 64, 192), False),
    (1, 256, 3, 1, 1, True, None, True),
]


def _inputs(B, T, HQ, H, R, gates, strided):
    if R == 1:
        x = make_inputs(B, T, HQ, H, 16, 24, gates, torch.float64)
    else:
        x = make_reflection_inputs(B, T, HQ, H, 16, 24, R, gates, torch.float64)
    if strided:  # q, k, v as slices of a fused projection
        x = tuple(strided_view(t) if i < 3 else t for i, t in enumerate(x))
    return x


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_token_route_matches_block_route(case, monkeypatch):
    B, T, HQ, H, R, gates, cu, strided = case
    x = _inputs(B, T, HQ, H, R, gates, strided)
    cu = None if cu is None else torch.tensor(cu)
    kw = dict(cu_seqlens=cu, block_size=64, backend="cpu")
    calls = []
    for name in ("_forward_tokens", "_backward_tokens"):
        route = getattr(function, name)
        monkeypatch.setattr(function, name,
                            lambda *a, n=name, f=route: calls.append(n) or f(*a))
    dout = make_dout(B, T, HQ, 24).double()
    o, grads = run_with_grads(path_attn, x, dout, **kw)
    o_keys, keys = path_attn_with_keys(*x, **kw)
    assert calls == ["_forward_tokens", "_backward_tokens", "_forward_tokens"]
    monkeypatch.setattr(function, "_token_starts", lambda *a: None)
    o_ref, grads_ref = run_with_grads(path_attn, x, dout, **kw)
    o_keys_ref, keys_ref = path_attn_with_keys(*x, **kw)
    assert len(calls) == 3  # the block route
    pairs = [("o", o, o_ref), ("o_keys", o_keys, o_ref), ("keys", keys, keys_ref)]
    pairs += [("d" + n, a, b) for n, a, b in zip(NAMES, grads, grads_ref, strict=True)
              if b is not None]
    for name, a, b in pairs:
        assert a.shape == b.shape, name
        assert float((a - b).abs().max() / b.abs().max()) < 1e-13, name


def test_padded_blocks_take_the_block_route(monkeypatch):
    x = make_inputs(1, 100, 2, 2, 16, 16, True, torch.float64)
    for name in ("_forward_tokens", "_backward_tokens"):
        monkeypatch.setattr(function, name, lambda *a: pytest.fail("token route"))
    x = tuple(t.requires_grad_() for t in x)
    path_attn(*x, block_size=32, backend="cpu").sum().backward()
