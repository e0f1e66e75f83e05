"""torch.compile of stick-breaking attention: the op is one opaque node per pass
(`pathattn::sb_fwd` / `sb_bwd`), so a compiled call has no graph break, with or without
cu_seqlens, and gives the eager output and gradients (float32)."""

from __future__ import annotations

import functools

import pytest
import torch

from pathattn.ops import sb_attn
from pathattn.ops.sba import sb_attn_prefill, sb_attn_step
from tests._compile import assert_no_graph_breaks, assert_same, fresh, loss_and_grads

CU = torch.tensor([0, 5, 17, 19], dtype=torch.int32)


def op_loss(q, k, v, dout, cu_seqlens=None):
    return (sb_attn(q, k, v, cu_seqlens=cu_seqlens) * dout).sum()


@functools.cache
def compiled_op_loss():
    return torch.compile(op_loss, fullgraph=True, dynamic=True)


def _args(B: int, T: int, seed: int = 0) -> tuple:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, 4, 8, generator=g).requires_grad_()  # GQA: 4 query heads, 2 kv
    k, v = (torch.randn(B, T, 2, 8, generator=g).requires_grad_() for _ in range(2))
    return q, k, v, torch.randn(B, T, 4, 8, generator=g)


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_op_has_no_graph_break(packed):
    args = _args(1, 19)
    assert_no_graph_breaks(op_loss, *args, CU if packed else None)


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_op_compiled_matches_eager(packed):
    args = _args(1 if packed else 2, 19)
    cu = CU if packed else None
    want = loss_and_grads(op_loss, (*args, cu))
    got = loss_and_grads(compiled_op_loss(), (*fresh(args), cu))
    # the op's numbers are the same; inductor sums the loss (1216 products) in another
    # order, which moves it by ~2e-6 relative in float32
    assert_same(got, want, rtol=1e-5)


@torch.no_grad()
def test_prefill_and_step_have_no_graph_break():
    """Left-padded prompts, then a step on their cache: the mask's and the cache's checks
    run inside the graph."""
    q, k, v, _ = (x.detach() for x in _args(2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[0, :3] = 0
    assert_no_graph_breaks(lambda q, k, v, m: sb_attn_prefill(q, k, v, attention_mask=m)[0],
                           q, k, v, mask)
    _, cache = sb_attn_prefill(q, k, v, attention_mask=mask)
    new = [x[:, :1].clone() for x in (q, k, v)]
    assert_no_graph_breaks(lambda q, k, v: sb_attn_step(q, k, v, cache), *new)
