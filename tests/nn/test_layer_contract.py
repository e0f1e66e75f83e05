"""The inference contract of every registered attention layer: masked tokens (zeros
anywhere in the prefill's and the steps' masks) equal their removal, a cache prefilled with
history goes back to any length, and the attention probabilities of prompt and steps are
one exact definition. Layers run in float64."""

from __future__ import annotations

import pytest
import torch

from pathattn.models import ATTN_TYPES, ModelConfig, get_attention_type

B, P, N = 2, 7, 13  # batch, prompt length, total length


def make_layer(attn_type: str):
    torch.manual_seed(0)
    config = ModelConfig.preset("tiny", attn_type=attn_type, initializer_range=0.3)
    return get_attention_type(attn_type).build(config).double().eval()


def inputs(seed: int = 1):
    x = torch.randn(B, N, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[0, [0, 3, 8, 9]] = False  # left padding, a hole in the prompt, two in the steps
    mask[1, [5, 6, 12]] = False
    return x, mask


def run_steps(layer, x, mask, cache, start: int, sizes=(1, 3)) -> torch.Tensor:
    """Decode positions [start, N) in steps of the given sizes, in turn: [B, N - start, hidden]."""
    out, t, i = [], start, 0
    while t < N:
        m = min(sizes[i % len(sizes)], N - t)
        out.append(layer.decode(x[:, t:t + m], cache, mask[:, t:t + m]))
        t, i = t + m, i + 1
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("attn_type", ATTN_TYPES)
@torch.no_grad()
def test_masked_tokens_equal_their_removal(attn_type):
    layer = make_layer(attn_type)
    x, mask = inputs()
    y, cache = layer.prefill(x[:, :P], mask[:, :P])
    y = torch.cat([y, run_steps(layer, x, mask, cache, P)], dim=1)
    assert torch.equal(cache.key_mask if hasattr(cache, "key_mask") else mask, mask)
    for b in range(B):
        alone = layer(x[b: b + 1, mask[b]])[0]
        torch.testing.assert_close(y[b, mask[b]], alone, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("attn_type", ATTN_TYPES)
@torch.no_grad()
def test_history_truncates_to_any_length(attn_type):
    """Prefill with history, decode, truncate into the prompt or a step, decode again: the
    same as decoding once (masked tokens included)."""
    layer = make_layer(attn_type)
    x, mask = inputs(2)
    _, cache = layer.prefill(x[:, :P], mask[:, :P])
    expected = run_steps(layer, x, mask, cache, P)
    for keep in (4, 10):  # into the prompt (after a hole), into a step (after two)
        _, cache = layer.prefill(x[:, :P], mask[:, :P], history=True)
        run_steps(layer, x, mask, cache, P, sizes=(2,))
        assert cache.min_len == 0
        cache.truncate(keep)
        assert len(cache) == keep
        got = run_steps(layer, x, mask, cache, keep, sizes=(3,))
        real = mask[:, max(keep, P):, None]  # positions [max(keep, P), N)
        torch.testing.assert_close(got[:, max(P - keep, 0):] * real,
                                   expected[:, max(keep - P, 0):] * real, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("attn_type", ATTN_TYPES)
@torch.no_grad()
def test_step_probabilities_equal_the_prompts(attn_type):
    """After a step with a masked token, its probabilities [B, HQ, m, n] are the last rows
    of the prompt probabilities over the whole sequence; masked queries have zero rows."""
    layer = make_layer(attn_type)
    x, mask = inputs(3)
    _, cache = layer.prefill(x[:, :10], mask[:, :10], history=True)
    layer.decode(x[:, 10:], cache, mask[:, 10:])
    step = layer.step_attention_weights(x[:, 10:], cache, mask[:, 10:])
    full = layer.attention_weights(x, mask)
    assert step.shape == (B, 4, 3, N) and full.shape == (B, 4, N, N)
    torch.testing.assert_close(step, full[:, :, 10:], rtol=1e-10, atol=1e-13)
    assert torch.all(full[1, :, 12] == 0) and torch.all(full[:, :, :, ~mask[1]][1] == 0)
