"""torch.compile of the prefill and the decode step: no graph break (fullgraph), dynamic
prompt and step lengths, left padding and masked tokens, no recompiles in a decode loop,
and compiled == eager (output and cache, float32)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from pathattn.ops import path_attn_prefill, path_attn_step
from tests._compile import assert_no_graph_breaks, assert_same
from tests.ops.path._helpers import make_inputs

HQ, H, D = 4, 2, 8  # GQA: two query heads per key/value head


def prefill(q, k, v, w, beta, g):
    return path_attn_prefill(q, k, v, w, beta, g)


def step(q, k, v, w, beta, g, state):
    return path_attn_step(q, k, v, w, beta, g, state=state)


def prefill_masked(q, k, v, w, beta, g, attention_mask):
    return path_attn_prefill(q, k, v, w, beta, g, attention_mask=attention_mask)


def _left_padded(B: int, T: int, pads: tuple[int, ...]) -> torch.Tensor:
    """attention_mask [B, T]: row b starts with pads[b] padding tokens."""
    return (torch.arange(T)[None] >= torch.tensor(pads)[:, None]).long()


def _no_grad(T: int) -> tuple:
    return tuple(x.detach() for x in make_inputs(2, T, HQ, H, D, D, seed=T))


@torch.no_grad()
def test_prefill_and_step_have_no_graph_break():
    x = _no_grad(12)
    assert_no_graph_breaks(prefill, *x)
    _, state = prefill(*x)
    assert_no_graph_breaks(step, *_no_grad(1), state)


@pytest.mark.slow
@torch.no_grad()
def test_prefill_and_step_compiled_match_eager():
    """Compiled prefill (dynamic shapes, two prompt lengths), then compiled steps of two and
    three tokens (one graph) on its cache against the eager ones on an eager cache. The
    steps compile with dynamic shapes too (symbolic m and cache length; inductor's CPU
    lowering of SDPA with a bias fails on those in torch 2.13, so the compiled step spells
    the softmax out)."""
    torch._dynamo.reset()  # a fresh compile: earlier tests' frames do not count here
    # inductor's code for the prefill: test_prefill_with_attention_mask_compiled_matches_eager
    c_prefill = torch.compile(prefill, fullgraph=True, dynamic=True, backend="aot_eager")
    c_step = torch.compile(step, fullgraph=True, dynamic=True)
    for T in (12, 17):
        x = _no_grad(T)
        o_want, s_want = prefill(*x)
        o_got, s_got = c_prefill(*x)
        assert_same([o_got, s_got.k, s_got.v, s_got.g_cumsum],
                    [o_want, s_want.k, s_want.v, s_want.g_cumsum])
    # symbolic m, one graph (m = 1: the decode-loop test below). Both caches hold pending
    # tokens first (an eager step), as every later step finds them; and m = 3 comes first,
    # as a first step of m = 2 = B would make dynamo's duck sizing tie m to the batch
    new = _no_grad(1)
    step(*new, s_got), step(*new, s_want)
    for m in (3, 2):
        new = _no_grad(m)
        with torch._dynamo.config.patch(error_on_recompile=m == 2):
            assert_same([c_step(*new, s_got)], [step(*new, s_want)])
    assert len(s_got) == len(s_want) == 17 + 6


@pytest.mark.slow
@torch.no_grad()
def test_compiled_decode_loop_stops_recompiling():
    """A compiled decode loop (fullgraph, dynamic shapes; steps of 1 to 3 tokens) matches
    the eager loop token by token, through window commits and buffer growths. Once it has
    met one of each, it runs on without recompiling: the cache's Python state does not
    change from token to token. Recompilation is decided by dynamo's guards, before any
    backend, so the captured graphs run eagerly here (inductor's code for the step is
    checked by `test_prefill_and_step_compiled_match_eager`)."""
    torch._dynamo.reset()
    c_step = torch.compile(step, fullgraph=True, dynamic=True, backend="eager")
    x = _no_grad(12)
    _, s_want = prefill(*x)
    _, s_got = prefill(*x)
    for s in (s_want, s_got):
        s.max_pending_tokens = 5  # a commit every few tokens
    cap = s_got.capacity
    sizes = [1, 1, 2, 1, 1, 3, 1]

    def run(n_tokens: int) -> None:
        i = 0
        while n_tokens > 0:
            m = min(sizes[i % len(sizes)], n_tokens)
            new = _no_grad(m)
            assert_same([c_step(*new, s_got)], [step(*new, s_want)])
            n_tokens, i = n_tokens - m, i + 1

    run(cap)  # past the first growth of the buffers
    assert s_got.num_grows == 1
    with torch._dynamo.config.patch(error_on_recompile=True):
        run(s_got.capacity - len(s_got) + 10)  # another growth, more commits
    assert s_got.num_grows == 2
    assert_same([s_got.v, s_got.g_cumsum], [s_want.v, s_want.g_cumsum])  # keys: via o


@torch.no_grad()
def test_prefill_with_attention_mask_has_no_graph_break():
    assert_no_graph_breaks(prefill_masked, *_no_grad(12), _left_padded(2, 12, (3, 0)))


@pytest.mark.slow
@torch.no_grad()
def test_prefill_with_attention_mask_compiled_matches_eager():
    """Left padding in one row, in both, in neither: the compiled prefill (one graph,
    dynamic shapes) gives the eager output and cache, and so does a mask with a masked
    token inside a row."""
    torch._dynamo.reset()
    compiled = torch.compile(prefill_masked, fullgraph=True, dynamic=True)
    x = _no_grad(12)
    for pads in ((3, 0), (1, 5), (0, 0)):
        mask = _left_padded(2, 12, pads)
        o_want, s_want = prefill_masked(*x, mask)
        o_got, s_got = compiled(*x, mask)
        assert_same([o_got, s_got.k, s_got.v, s_got.g_cumsum, s_got.start],
                    [o_want, s_want.k, s_want.v, s_want.g_cumsum, s_want.start])
        assert not o_got[0, :pads[0]].any()  # zero at padding
    holes = _left_padded(2, 12, (3, 0))
    holes[1, 5] = 0  # a masked token inside a row: no key, no transform
    o_want, s_want = prefill_masked(*x, holes)
    o_got, s_got = compiled(*x, holes)
    assert_same([o_got, s_got.k, s_got.v, s_got.g_cumsum],
                [o_want, s_want.k, s_want.v, s_want.g_cumsum])
