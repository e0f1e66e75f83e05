"""ShortConv (`pathattn.nn.short_conv`): its three paths (F.conv1d, the sum of shifted
inputs used for packed sequences and under torch.compile, and prefill + steps) agree, in
values and in dtype (autocast included)."""

from __future__ import annotations

import pytest
import torch

from pathattn.nn import ShortConv

from . import assert_rel


def test_short_conv_packed_matches_conv1d_per_sequence():
    conv = ShortConv(6, 3, bias=True)
    lengths = [1, 4, 2, 6]
    xs = [torch.randn(1, n, 6) for n in lengths]
    cu = torch.tensor([0] + lengths).cumsum(0)
    assert_rel(conv(torch.cat(xs, 1), cu), torch.cat([conv(x) for x in xs], 1), 1e-6)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)],
                         ids=["fp32", "bf16"])
@pytest.mark.parametrize("bias,activation", [(False, None), (True, "silu")],
                         ids=["plain", "bias_silu"])
def test_short_conv_steps_match_forward(bias, activation, dtype, tol):
    """Steps of 1 and 3 tokens after a prefill (a multiply-and-sum per window) equal the
    training path's F.conv1d on the whole sequence."""
    torch.manual_seed(0)
    conv = ShortConv(6, 4, bias=bias, activation=activation).to(dtype)
    x = torch.randn(2, 9, 6).to(dtype)
    with torch.no_grad():
        want = conv(x)
        y, state = conv.prefill(x[:, :5])
        ys, t = [y], 5
        for m in (1, 3):
            y, hist = conv.step(x[:, t:t + m], state)
            ys.append(y)
            state, t = hist[:, hist.shape[1] - 3:], t + m
    assert_rel(torch.cat(ys, 1).float(), want.float(), tol)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-13), (torch.bfloat16, 1e-2)],
                         ids=["fp64", "bf16"])
@pytest.mark.parametrize("K,bias", [(1, False), (3, True), (4, False)], ids=str)
def test_short_conv_shifted_sum_matches_conv1d(K, bias, dtype, tol):
    """The compiled path's sum of shifted inputs equals F.conv1d, forward and gradients
    (T shorter than, equal to and longer than the kernel)."""
    torch.manual_seed(0)
    conv = ShortConv(6, K, bias=bias).to(dtype)
    for T in (1, K, 11):
        x = torch.randn(2, T, 6).to(dtype).requires_grad_()
        got, want = conv._shifted_sum(x), conv(x)
        assert got.dtype == want.dtype == dtype
        assert_rel(got.float(), want.float(), tol)
        g = torch.randn_like(want)
        grads = [torch.autograd.grad(y, (x, *conv.parameters()), g) for y in (got, want)]
        for a, b in zip(*grads, strict=True):
            assert_rel(a.float(), b.float(), tol)


def test_short_conv_paths_round_alike_under_autocast():
    """Under bfloat16 autocast F.conv1d runs in bfloat16; the packed and compiled paths (the
    sum of shifted inputs) return the same dtype and values, not float32."""
    torch.manual_seed(0)
    conv = ShortConv(6, 3, bias=True)
    lengths = [4, 7]
    x = torch.randn(1, sum(lengths), 6)
    cu = torch.tensor([0] + lengths).cumsum(0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = torch.cat([conv(x[:, :4]), conv(x[:, 4:])], 1)
        packed, shifted = conv(x, cu), conv._shifted_sum(x)
    assert want.dtype == packed.dtype == shifted.dtype == torch.bfloat16
    assert_rel(packed.float(), want.float(), 1e-2)
    assert_rel(shifted[:, :4].float(), want[:, :4].float(), 1e-2)


def test_short_conv_packed_bf16_sums_in_float32():
    """Packed bfloat16 inputs are summed in float32 as F.conv1d does: no worse than the
    per-sequence conv1d against a float64 reference."""
    torch.manual_seed(0)
    conv = ShortConv(16, 4, bias=True)
    lengths = [5, 9, 2]
    x = torch.randn(1, sum(lengths), 16)
    cu = torch.tensor([0] + lengths).cumsum(0)
    parts = lambda m, t: torch.cat([m(p) for p in t.split(lengths, 1)], 1)  # noqa: E731
    ref = parts(conv.double(), x.double())
    conv_bf = conv.to(torch.bfloat16)
    xb = x.to(torch.bfloat16)
    err = lambda y: (y.double() - ref).abs().max().item()  # noqa: E731
    assert err(conv_bf(xb, cu)) <= 1.01 * err(parts(conv_bf, xb)) + 1e-6
