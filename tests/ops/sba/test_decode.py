"""Stick-breaking inference: prefill + steps of m tokens from an `SBACache` equal the rows of
`sb_attn` on the whole sequence; left padding equals each prompt alone; the cache reorders
and truncates."""

from __future__ import annotations

import pytest
import torch

from pathattn.ops import sb_attn
from pathattn.ops.sba import SBACache, sb_attn_last_rows, sb_attn_prefill, sb_attn_step

from ._helpers import Case

TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attend_current", [False, True], ids=["strict", "current"])
@pytest.mark.parametrize("steps", [(1, 1, 1), (3, 5), (0, 2)], ids=lambda s: "m" + "_".join(
    map(str, s)))
def test_steps_equal_full_forward(steps, attend_current):
    T0 = 20
    case = Case(B=2, T=T0 + sum(steps), HQ=4, H=2, D=8, Dv=8, attend_current=attend_current)
    q, k, v = case.inputs()
    full = sb_attn(q, k, v, attend_current=attend_current)
    o, cache = sb_attn_prefill(q[:, :T0], k[:, :T0], v[:, :T0], attend_current=attend_current)
    torch.testing.assert_close(o, full[:, :T0], **TOL)
    t = T0
    for m in steps:
        got = sb_attn_step(q[:, t:t + m], k[:, t:t + m], v[:, t:t + m], cache,
                           attend_current=attend_current, block_size=7)
        assert got.shape == (2, m, 4, 8) and len(cache) == t + m
        torch.testing.assert_close(got, full[:, t:t + m], **TOL)
        t += m


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=["f64", "bf16"])
def test_last_rows_equal_full_forward(dtype):
    q, k, v = Case(T=45, HQ=2, H=1).inputs(dtype)
    full = sb_attn(q, k, v)
    got = sb_attn_last_rows(q[:, -6:], k, v, block_size=16)
    assert got.dtype == dtype
    tol = TOL if dtype == torch.float64 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(got, full[:, -6:], **tol)


@pytest.mark.parametrize("attend_current", [False, True], ids=["strict", "current"])
def test_left_padding_equals_each_prompt_alone(attend_current):
    lengths, T, steps = (3, 9, 6), 9, 4
    case = Case(B=3, T=T + steps, HQ=2, H=2, D=8, attend_current=attend_current)
    q, k, v = case.inputs()
    mask = torch.arange(T)[None] >= T - torch.tensor(lengths)[:, None]  # [B, T] left padding
    o, cache = sb_attn_prefill(q[:, :T], k[:, :T], v[:, :T], attention_mask=mask.long(),
                               attend_current=attend_current)
    decoded = sb_attn_step(q[:, T:], k[:, T:], v[:, T:], cache, attend_current=attend_current)
    for b, n in enumerate(lengths):
        sl = slice(T - n, T + steps)  # the row's real tokens, prompt and decoded
        alone = sb_attn(q[b:b + 1, sl], k[b:b + 1, sl], v[b:b + 1, sl],
                        attend_current=attend_current)[0]
        torch.testing.assert_close(o[b, T - n:], alone[:n], **TOL)
        assert torch.equal(o[b, :T - n], torch.zeros_like(o[b, :T - n]))
        torch.testing.assert_close(decoded[b], alone[n:], **TOL)


def test_cache_truncate_and_reorder():
    q, k, v = Case(B=2, T=16).inputs()
    full = sb_attn(q, k, v)
    _, cache = sb_attn_prefill(q[:, :10], k[:, :10], v[:, :10])
    sb_attn_step(q[:, 10:13], k[:, 10:13], v[:, 10:13], cache)
    cache.truncate(8)  # any length, prompt included
    got = sb_attn_step(q[:, 8:], k[:, 8:], v[:, 8:], cache)
    torch.testing.assert_close(got, full[:, 8:], **TOL)
    cache.reorder(torch.tensor([1, 1]))
    assert torch.equal(cache.k[0], cache.k[1]) and len(cache) == 16
    with pytest.raises(ValueError, match="new_len"):
        cache.truncate(17)
    with pytest.raises(ValueError, match="index"):
        cache.reorder(torch.tensor([2]))


def test_step_errors():
    q, k, v = Case(B=2, T=6, HQ=2, H=1).inputs()
    _, cache = sb_attn_prefill(q[:, :4], k[:, :4], v[:, :4])
    with pytest.raises(ValueError, match="cache must be the SBACache"):
        sb_attn_step(q[:, 4:], k[:, 4:], v[:, 4:], cache=(k, v))
    with pytest.raises(ValueError, match="k: expected"):
        sb_attn_step(q[:1, 4:], k[:1, 4:], v[:1, 4:], cache)
    with pytest.raises(ValueError, match="start"):
        sb_attn_last_rows(q[:, 4:], k, v, start=torch.tensor([0, 9]))
    with pytest.raises(ValueError, match="new queries"):
        sb_attn_last_rows(q, k[:, :3], v[:, :3])
    assert sb_attn_step(q[:, :0], k[:, :0], v[:, :0], cache).shape == (2, 0, 2, 16)
    assert len(cache) == 4
    assert isinstance(cache, SBACache)
