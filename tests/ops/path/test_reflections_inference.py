"""Inference with R reflections per token (w [B, T, H, R, D], beta [B, T, H, R]): prefill
plus steps of mixed sizes reproduce `path_attn` on the whole sequence, the cached keys carry
every later token's R reflections in order, and truncation, left padding and the
differentiable prefill work as with one reflection; R = 1 as w [B, T, H, 1, D] decodes bit
for bit like w [B, T, H, D].
"""

from __future__ import annotations

import pytest
import torch

from pathattn import path_attn, path_attn_prefill, path_attn_step
from pathattn.ops import path_attn_naive

from ._helpers import make_reflection_inputs, rel_err

F32_TOL = 1e-4
SIZES = (1, 5, 1, 1, 3, 1)  # step sizes, cycled


def _sl(inputs: tuple, a: int, b: int) -> tuple:
    return tuple(None if x is None else x[:, a:b] for x in inputs)


def _steps(inputs: tuple, state, start: int, end: int, sizes=SIZES) -> torch.Tensor:
    outs, t, i = [], start, 0
    while t < end:
        m = min(sizes[i % len(sizes)], end - t)
        outs.append(path_attn_step(*_sl(inputs, t, t + m), state=state))
        t, i = t + m, i + 1
    return torch.cat(outs, dim=1)


def _naive_keys(k, w, beta) -> torch.Tensor:
    """float64 cached keys, row form k_j^T H_{j+1} ... H_{T-1} with H_t = H_{t,1} ... H_{t,R}
    (H_t is not symmetric for R > 1: the key meets H_{t,1} first), one reflection at a
    time: k [B, T, H, D], w [B, T, H, R, D], beta [B, T, H, R]."""
    k, w, beta = (x.double() for x in (k, w, beta))
    out = k.clone()
    for t in range(1, k.shape[1]):
        for r in range(w.shape[3]):  # row form: x^T H_{t,1} first
            prev, wr = out[:, :t], w[:, t: t + 1, :, r]  # [B, t, H, D], [B, 1, H, D]
            proj = (prev * wr).sum(-1, keepdim=True) * beta[:, t: t + 1, :, r, None]
            out[:, :t] = prev - proj * wr
    return out


@pytest.mark.parametrize("R, gates, window", [
    pytest.param(2, True, None, id="R2-gates"),
    pytest.param(3, False, 1, id="R3-window1"),
    pytest.param(2, True, 3, id="R2-gates-window3"),
])
def test_prefill_then_steps_match_path_attn(R, gates, window):
    B, P, new = 2, 37, 14
    inputs = make_reflection_inputs(B, P + new, 4, 2, 16, 16, R, gates)
    ref = path_attn(*inputs)
    o, state = path_attn_prefill(*_sl(inputs, 0, P))
    if window is not None:
        state.max_pending_tokens = window
    assert rel_err(o, ref[:, :P]) < F32_TOL
    assert rel_err(_steps(inputs, state, P, P + new), ref[:, P:]) < F32_TOL
    assert rel_err(state.k, _naive_keys(inputs[1], inputs[3], inputs[4])) < 1e-5


def test_float64_matches_naive_reference():
    inputs = make_reflection_inputs(1, 30, 2, 1, 8, 8, 3, True, torch.float64)
    ref = path_attn_naive(*inputs)
    o, state = path_attn_prefill(*_sl(inputs, 0, 20))
    state.max_pending_tokens = 2
    o_new = _steps(inputs, state, 20, 30)
    assert rel_err(torch.cat([o, o_new], 1), ref) < 1e-10


@pytest.mark.parametrize("accepted", [0, 3], ids=lambda a: f"accept{a}")
def test_truncate_after_draft_then_continue(accepted):
    B, P, R = 2, 30, 2
    inputs = make_reflection_inputs(B, P + 4, 2, 1, 16, 16, R)
    _, state = path_attn_prefill(*_sl(inputs, 0, P))
    _steps(inputs, state, P, P + 4, sizes=(1,))
    draft = make_reflection_inputs(B, 5, 2, 1, 16, 16, R, seed=7)
    path_attn_step(*draft, state=state)
    state.truncate(P + 4 + accepted)
    cont = make_reflection_inputs(B, 6, 2, 1, 16, 16, R, seed=8)
    o_new = _steps(cont, state, 0, 6)
    full = tuple(torch.cat(xs, dim=1) for xs in zip(
        inputs, _sl(draft, 0, accepted), cont, strict=True))
    assert rel_err(o_new, path_attn(*full)[:, -6:]) < F32_TOL
    assert rel_err(state.k, _naive_keys(full[1], full[3], full[4])) < 1e-5


@pytest.mark.parametrize("grad", [False, True], ids=["one_pass", "differentiable"])
def test_left_padding_equals_each_prompt_alone(grad):
    lengths, new, R = (20, 9), 6, 2
    P, B = max(lengths), len(lengths)
    inputs = make_reflection_inputs(B, P + new, 2, 1, 16, 16, R)
    mask = torch.zeros(B, P, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, P - n:] = 1
    prompt = _sl(inputs, 0, P)
    if grad:
        prompt = tuple(x.clone().requires_grad_() for x in prompt)
    o, state = path_attn_prefill(*prompt, attention_mask=mask)
    o_new = _steps(inputs, state, P, P + new)
    for b, n in enumerate(lengths):
        alone = tuple(x[b: b + 1, P - n:] for x in inputs)
        ref = path_attn(*alone)
        assert rel_err(o[b: b + 1, P - n:].detach(), ref[:, :n]) < F32_TOL
        assert rel_err(o_new[b: b + 1], ref[:, n:]) < F32_TOL


def test_single_reflection_decodes_bit_for_bit():
    """w [B, T, H, 1, D] through prefill and steps (single tokens and chunks, commits) gives
    exactly the outputs and keys of w [B, T, H, D]."""
    q, k, v, w, beta, g = make_reflection_inputs(2, 30, 4, 2, 16, 16, 1)
    four = (q, k, v, w[:, :, :, 0], beta[..., 0], g)
    five = (q, k, v, w, beta, g)
    outs = []
    for inputs in (four, five):
        o, state = path_attn_prefill(*_sl(inputs, 0, 20))
        state.max_pending_tokens = 3
        outs.append((o, _steps(inputs, state, 20, 30), state.k))
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)


def test_step_with_other_reflection_count_raises():
    """The cache keeps the window tokens' reflections for `truncate`, R per token: a step
    with another R is refused before the cache changes."""
    _, state = path_attn_prefill(*make_reflection_inputs(1, 10, 2, 1, 8, 8, 2))
    with pytest.raises(ValueError, match="3 reflections per token, but this cache was built "
                                         "for 2"):
        path_attn_step(*make_reflection_inputs(1, 1, 2, 1, 8, 8, 3), state=state)
    assert len(state) == 10
    path_attn_step(*make_reflection_inputs(1, 1, 2, 1, 8, 8, 2), state=state)
    assert len(state) == 11
