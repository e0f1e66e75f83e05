"""The Triton kernels of FoX against the float64 reference, forward and every gradient.

float32: relative error at most F32_TOL. bfloat16, the flash-attention way: the kernels'
error may be at most twice the error of plain PyTorch doing the computation at that
precision (`fox_attn_naive(dtype=None)`: bfloat16 products, float32 gates), plus 1e-5,
both measured on the same rounded inputs and cotangent. Without CUDA the kernels run on
Triton's interpreter (tests/conftest.py); block_size=16 makes T <= 80 span up to 5 tiles.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from pathattn.ops import path_attn  # noqa: E402
from pathattn.ops.fox import fox_attn, fox_attn_naive  # noqa: E402

from ..._numerics import rel_err  # noqa: E402
from .._helpers import errors, make_inputs, run_with_grads  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32_TOL = 1e-5
CU_70 = (0, 1, 2, 19, 19, 50, 51, 70)  # lengths 1, 1, 17, 0, 31, 1, 19


def _fast(q, k, v, g, cu_seqlens=None):
    xs = [x.to(DEVICE) for x in (q, k, v, g)]
    cu = None if cu_seqlens is None else cu_seqlens.to(DEVICE)
    return fox_attn(*xs, cu_seqlens=cu, block_size=16, backend="triton").cpu()


def _case(B, T, HQ, H, D, dtype, cu, big_gates):
    q, k, v, g = make_inputs(B, T, HQ, H, D, dtype)
    if big_gates:  # forget almost everything every 7 tokens
        g[:, 5::7] = -3e4
    dout = torch.randn(B, T, HQ, D).to(dtype)
    cu = None if cu is None else torch.tensor(cu)
    fast = run_with_grads(_fast, (q, k, v, g), dout, cu_seqlens=cu)
    ref = run_with_grads(fox_attn_naive, (q, k, v, g), dout.double(), cu_seqlens=cu)
    plain = run_with_grads(fox_attn_naive, (q, k, v, g), dout, cu_seqlens=cu, dtype=None)
    return fast, ref, plain


@pytest.mark.parametrize("B, T, HQ, H, D, cu, big_gates", [
    pytest.param(2, 37, 4, 2, 16, None, False, id="gqa-T37"),
    pytest.param(1, 70, 2, 1, 16, CU_70, False, id="packed"),
    pytest.param(1, 45, 2, 2, 32, None, True, id="large-gates"),
])
def test_float32_against_float64(B, T, HQ, H, D, cu, big_gates):
    fast, ref, plain = _case(B, T, HQ, H, D, torch.float32, cu, big_gates)
    assert all(x.dtype == torch.float32 for x in fast)
    bad = {n: e for n, e in errors(fast, ref).items() if not e <= F32_TOL}
    assert not bad, f"relative errors: {bad}"
    if big_gates:  # the check can fail: G_i - G_j from float32 cumulative sums cannot pass
        assert max(errors(plain, ref).values()) > 100 * F32_TOL


@pytest.mark.parametrize("B, T, HQ, H, D, cu", [
    pytest.param(1, 45, 2, 1, 32, None, id="gqa-T45"),
    pytest.param(1, 70, 2, 2, 16, CU_70, id="packed"),
])
def test_bfloat16_like_flash_attention(B, T, HQ, H, D, cu):
    fast, ref, plain = _case(B, T, HQ, H, D, torch.bfloat16, cu, False)
    assert fast[0].dtype == torch.bfloat16 and fast[-1].dtype == torch.float32  # g's dtype
    e_fast, e_plain = errors(fast, ref), errors(plain, ref)
    bad = {n: (e_fast[n], e_plain[n]) for n in e_fast
           if not e_fast[n] <= 2 * e_plain[n] + 1e-5}
    assert not bad, f"(kernels, plain) relative errors: {bad}"


def test_equals_the_path_op_and_takes_strided_views():
    """The kernels compute `path_attn` with w = 0, beta = 0 (the definition), on views of a
    fused projection as on contiguous tensors."""
    q, k, v, g = make_inputs(1, 40, 2, 1, 16)
    fused = torch.cat([q, k, v], dim=2)  # [B, T, HQ + 2H, D]
    views = fused[:, :, :2], fused[:, :, 2:3], fused[:, :, 3:]
    assert not views[0].is_contiguous()
    o = _fast(*views, g)
    assert torch.equal(o, _fast(q, k, v, g))
    path = path_attn(q, k, v, torch.zeros_like(k), torch.zeros(1, 40, 1), g)
    assert rel_err(o, path) <= F32_TOL


def test_empty_batch():
    q, k, v, g = make_inputs(2, 0, 2, 1, 16)
    assert fox_attn(q, k, v, g, backend="triton").shape == (2, 0, 2, 16)
