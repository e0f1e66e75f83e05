"""`sb_attn` (blockwise, log space, recomputing backward) against the float64 reference
`sb_attn_naive`: output and every gradient.

float32: relative error ||ours - ref|| / ||ref|| below 1e-4 (a correct float32 computation
lands near 1e-6; a wrong mask or an off-by-one block boundary shows up as 1e-2 or worse).
bfloat16 / float16: the flash-attention rule of the PaTH op's suite, the error of ours at
most twice that of plain PyTorch doing the reference computation at that precision, plus
1e-5, both measured on the same rounded inputs.
"""

from __future__ import annotations

import pytest
import torch

from pathattn.ops import sb_attn
from pathattn.ops.sba import sb_attn_naive

from ._helpers import Case, errors, run_with_grads

F32_TOL = 1e-4

CASES = [
    Case(),
    Case(attend_current=True),
    Case(B=2, T=37, HQ=4, H=2, D=8, Dv=12, block_size=5),  # GQA, ragged last block
    Case(T=20, HQ=3, H=1, block_size=1, attend_current=True),  # MQA, one-token blocks
    Case(T=50, block_size=None),  # the default block size
    Case(T=70, cu=(0, 1, 2, 19, 19, 50, 51, 70), block_size=8),  # lengths 1, 1, 17, 0, ...
    Case(T=70, cu=(0, 1, 2, 19, 19, 50, 51, 70), block_size=8, attend_current=True),
    Case(T=45, sharp=True, block_size=16),
    Case(T=30, scale=0.05, attend_current=True),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_float32_matches_float64_reference(case):
    inputs, dout = case.inputs(), case.dout()
    ours = run_with_grads(sb_attn, inputs, dout, block_size=case.block_size, **case.kwargs())
    ref = run_with_grads(sb_attn_naive, tuple(x.double() for x in inputs), dout,
                         **case.kwargs())
    assert ours[0].dtype == torch.float32
    errs = errors(ours, ref)
    assert all(e < F32_TOL for e in errs.values()), errs


@pytest.mark.parametrize("attend_current", [False, True], ids=["strict", "current"])
@pytest.mark.parametrize("cu", [None, (0, 2, 3, 7)], ids=["dense", "packed"])
def test_gradcheck_float64(attend_current, cu):
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 7, 2, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.randn(1, 7, 1, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    v = torch.randn(1, 7, 1, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    cu_t = None if cu is None else torch.tensor(cu)

    def fn(q, k, v):
        return sb_attn(q, k, v, cu_seqlens=cu_t, attend_current=attend_current, block_size=3)

    # packed: random projections (fast_mode), the gather-based layout is slower per call
    assert torch.autograd.gradcheck(fn, (q, k, v), fast_mode=cu is not None)


@pytest.mark.parametrize("attend_current", [False, True], ids=["strict", "current"])
def test_packed_equals_separate(attend_current):
    case = Case(T=45, HQ=4, H=2, cu=(0, 9, 9, 30, 45), attend_current=attend_current,
                block_size=8)
    inputs, dout = case.inputs(), case.dout()
    packed = run_with_grads(sb_attn, inputs, dout, block_size=8, **case.kwargs())
    for s, e in [(0, 9), (9, 30), (30, 45)]:
        alone = run_with_grads(sb_attn, tuple(x[:, s:e] for x in inputs), dout[:, s:e],
                               attend_current=attend_current, block_size=8)
        torch.testing.assert_close(packed[0][:, s:e], alone[0], rtol=1e-5, atol=1e-6)
        for got, ref in zip(packed[1], alone[1], strict=True):
            torch.testing.assert_close(got[:, s:e], ref, rtol=1e-5, atol=1e-6)


def test_gqa_equals_repeated_heads():
    case = Case(T=30, HQ=4, H=2)
    q, k, v = case.inputs()
    rep = (k.repeat_interleave(2, dim=2), v.repeat_interleave(2, dim=2))
    torch.testing.assert_close(sb_attn(q, k, v), sb_attn(q, *rep), rtol=1e-6, atol=1e-6)


def test_block_size_changes_nothing_but_rounding():
    q, k, v = Case(T=61, HQ=2, H=2).inputs()
    outs = [sb_attn(q, k, v, block_size=c) for c in (1, 7, 16, 64, 128)]
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", [Case(T=65, HQ=4, H=2), Case(T=50, cu=(0, 1, 20, 50)),
                                  Case(T=40, attend_current=True)], ids=str)
def test_low_precision_like_flash_attention(case, dtype):
    inputs, dout = case.inputs(dtype), case.dout(dtype)
    kwargs = case.kwargs()
    ours = run_with_grads(sb_attn, inputs, dout, block_size=case.block_size, **kwargs)
    plain = run_with_grads(sb_attn_naive, inputs, dout, dtype=None, **kwargs)
    ref = run_with_grads(sb_attn_naive, tuple(x.double() for x in inputs), dout, **kwargs)
    assert ours[0].dtype == dtype and all(g.dtype == dtype for g in ours[1])
    e_ours, e_plain = errors(ours, ref), errors(plain, ref)
    bad = {n: (e_ours[n], e_plain[n]) for n in e_ours if not e_ours[n] <= 2 * e_plain[n] + 1e-5}
    assert not bad, f"(ours, plain) relative errors: {bad}"


def test_first_row_is_zero_and_row_weights_sum_to_at_most_one():
    q, k, _ = Case(T=20).inputs()
    ones = torch.ones(1, 20, 1, 1)  # v = 1: o_i is the sum of row i's weights
    strict = sb_attn(q, k, ones)
    assert torch.equal(strict[:, 0], torch.zeros_like(strict[:, 0]))
    assert bool((strict >= 0).all() and (strict <= 1).all())
    current = sb_attn(q, k, ones, attend_current=True)
    torch.testing.assert_close(current[:, 0], torch.sigmoid(
        (q[:, 0] * k[:, 0]).sum(-1, keepdim=True) * 16**-0.5))


def test_empty_inputs_keep_the_graph():
    q = torch.zeros(2, 0, 2, 8, requires_grad=True)
    k, v = torch.zeros(2, 0, 1, 8), torch.zeros(2, 0, 1, 4)
    o = sb_attn(q, k, v)
    assert o.shape == (2, 0, 2, 4)
    o.sum().backward()
    assert q.grad.shape == q.shape


def test_autocast_region_changes_nothing():
    case = Case(T=30)
    inputs, dout = case.inputs(), case.dout()
    plain = run_with_grads(sb_attn, inputs, dout)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = run_with_grads(sb_attn, inputs, dout)
    assert mixed[0].dtype == torch.float32
    torch.testing.assert_close(mixed[0], plain[0], rtol=0, atol=0)
    for got, ref in zip(mixed[1], plain[1], strict=True):
        torch.testing.assert_close(got, ref, rtol=0, atol=0)


@pytest.mark.parametrize("case", [Case(B=2, T=23, HQ=4, H=2, D=8, block_size=5),
                                  Case(T=70, cu=(0, 1, 2, 19, 19, 50, 51, 70), block_size=8,
                                       attend_current=True)], ids=str)
def test_scan_steps_cut_into_chunks(case, monkeypatch):
    """A step whose tiles exceed TILE_ELEMENTS runs in chunks of query blocks (here one or
    two blocks per chunk), with the same result."""
    from pathattn.ops.sba import blockwise

    inputs, dout = case.inputs(), case.dout()
    whole = run_with_grads(sb_attn, inputs, dout, block_size=case.block_size, **case.kwargs())
    per_block = case.HQ * case.block_size**2
    for budget in (1, 2 * per_block):
        monkeypatch.setattr(blockwise, "TILE_ELEMENTS", budget)
        chunked = run_with_grads(sb_attn, inputs, dout, block_size=case.block_size,
                                 **case.kwargs())
        errs = errors(chunked, whole)
        assert all(e < 1e-6 for e in errs.values()), (budget, errs)
