"""The Triton kernels of stick-breaking attention against the float64 reference, forward
and every gradient.

float32: relative error at most F32_TOL. bfloat16 / float16, the flash-attention way: the
kernels' error may be at most twice the error of plain PyTorch doing the computation at
that precision (`sb_attn_naive(dtype=None)`), plus 1e-5, both measured on the same rounded
inputs and cotangent. Without CUDA the kernels run on Triton's interpreter
(tests/conftest.py); block_size=16 makes T <= 70 span up to 5 tiles.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from pathattn.ops import sb_attn  # noqa: E402
from pathattn.ops.sba import sb_attn_naive, select_backend  # noqa: E402

from .._helpers import Case, errors, run_with_grads  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32_TOL = 1e-5
CU_70 = (0, 1, 2, 19, 19, 50, 51, 70)  # lengths 1, 1, 17, 0, 31, 1, 19


def _fast(q, k, v, cu_seqlens=None, attend_current=False, scale=None):
    xs = [x.to(DEVICE) for x in (q, k, v)]
    cu = None if cu_seqlens is None else cu_seqlens.to(DEVICE)
    return sb_attn(*xs, cu_seqlens=cu, attend_current=attend_current, scale=scale,
                   block_size=16, backend="triton").cpu()


def _runs(case: Case, dtype: torch.dtype):
    """(kernels, float64 reference, plain PyTorch at dtype) on the same rounded inputs."""
    inputs, dout = case.inputs(dtype), case.dout(dtype)
    kw = case.kwargs()
    fast = run_with_grads(_fast, inputs, dout, **kw)
    ref = run_with_grads(sb_attn_naive, tuple(x.double() for x in inputs), dout.double(), **kw)
    plain = run_with_grads(sb_attn_naive, inputs, dout, dtype=None, **kw)
    return fast, ref, plain


@pytest.mark.parametrize("case", [
    Case(B=2, T=37, HQ=4, H=2, D=16, Dv=16),  # GQA, odd length: a partial last tile
    Case(T=70, HQ=2, H=1, D=16, Dv=16, cu=CU_70, attend_current=True),  # packed, MQA
    Case(T=45, HQ=2, H=2, D=32, Dv=16, sharp=True),  # logits far from 0; Dv != D
    Case(T=33, HQ=3, H=1, D=16, Dv=24, scale=0.3, attend_current=True),  # padded Dv
], ids=str)
def test_float32_against_float64(case):
    fast, ref, plain = _runs(case, torch.float32)
    assert fast[0].dtype == torch.float32 and all(g.dtype == torch.float32 for g in fast[1])
    e = errors(fast, ref)
    assert all(x <= F32_TOL for x in e.values()), f"relative errors: {e}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", [
    Case(T=45, HQ=2, H=1, D=32, Dv=32),
    Case(T=70, HQ=2, H=2, D=16, Dv=16, cu=CU_70),
    Case(T=40, HQ=2, H=1, D=16, Dv=16, attend_current=True, sharp=True),
], ids=str)
def test_low_precision_like_flash_attention(case, dtype):
    fast, ref, plain = _runs(case, dtype)
    assert fast[0].dtype == dtype and all(g.dtype == dtype for g in fast[1])
    e_fast, e_plain = errors(fast, ref), errors(plain, ref)
    bad = {n: (e_fast[n], e_plain[n]) for n in e_fast
           if not e_fast[n] <= 2 * e_plain[n] + 1e-5}
    assert not bad, f"(kernels, plain) relative errors: {bad}"


def test_sharp_logits_over_many_tiles():
    """Sharp logits over 5 tiles: far keys keep almost nothing of the stick and their true
    gradients are about zero. The running sums are accumulated in their own direction,
    never as a difference of totals, so every error stays near float32 rounding (1e-6;
    the blockwise op, whose C_ij is delta_i minus a suffix sum, lands at 3e-6 for dq here
    and grows with T)."""
    case = Case(T=80, HQ=1, H=1, D=16, Dv=16, sharp=True, attend_current=True)
    fast, ref, _ = _runs(case, torch.float32)
    e = errors(fast, ref)
    assert all(x <= 1e-6 for x in e.values()), f"relative errors: {e}"


def test_equals_the_blockwise_op_and_takes_strided_views():
    """The kernels compute the blockwise op's numbers (float32), on views of a fused
    projection as on contiguous tensors."""
    q, k, v = Case(T=40, HQ=2, H=1).inputs()
    fused = torch.cat([q, k, v], dim=2)  # [B, T, HQ + 2H, D]
    views = fused[:, :, :2], fused[:, :, 2:3], fused[:, :, 3:]
    assert not views[0].is_contiguous()
    o = _fast(*views)
    assert torch.equal(o, _fast(q, k, v))
    torch.testing.assert_close(o, sb_attn(q, k, v, backend="blockwise"), rtol=1e-5, atol=1e-6)


def test_heads_in_several_launches(monkeypatch):
    """With a snapshot budget below one GQA group, the backward runs one key/value head
    (and its query heads) per launch, with the same numbers."""
    from pathattn.ops.sba.triton import config

    case = Case(T=40, HQ=4, H=2, cu=(0, 17, 40))
    inputs, dout = case.inputs(), case.dout()
    whole = run_with_grads(_fast, inputs, dout, **case.kwargs())
    monkeypatch.setattr(config, "SNAPSHOT_BYTES", 1)
    split = run_with_grads(_fast, inputs, dout, **case.kwargs())
    for got, want in zip([split[0], *split[1]], [whole[0], *whole[1]], strict=True):
        assert torch.equal(got, want)


def test_backend_choice():
    q = torch.randn(1, 4, 2, 8)
    assert select_backend("auto", q) == ("triton" if q.is_cuda else "blockwise")
    assert select_backend("triton", q) == "triton"
    with pytest.raises(ValueError, match="backend must be one of"):
        select_backend("flash", q)
    with pytest.raises(ValueError, match="backend='triton' needs"):
        sb_attn(q.double(), q[:, :, :1].double(), q[:, :, :1].double(), backend="triton")
    with pytest.raises(ValueError, match="block_size must be None or a power of two"):
        sb_attn(q, q[:, :, :1], q[:, :, :1], backend="triton", block_size=24)


def test_empty_batch():
    q, k, v = Case(B=2, T=0, HQ=2, H=1).inputs()
    assert sb_attn(q, k, v, backend="triton").shape == (2, 0, 2, 16)


def test_compiled_fullgraph_matches_eager():
    """torch.compile(fullgraph=True) traces the custom ops (fake impls, autograd) with no
    graph break; the compiled step gives the eager numbers (aot_eager: no codegen)."""
    case = Case(T=20, HQ=2, H=1, cu=(0, 7, 20))
    inputs, dout = case.inputs(), case.dout()
    cu = torch.tensor(case.cu, dtype=torch.int32)

    def loss(q, k, v):
        o = sb_attn(q, k, v, cu_seqlens=cu, block_size=16, backend="triton")
        return (o * dout).sum()

    torch._dynamo.reset()
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    grads = []
    for fn in (loss, compiled):
        xs = [x.detach().clone().requires_grad_() for x in inputs]
        value = fn(*xs)
        grads.append([value.detach(), *torch.autograd.grad(value, xs)])
    for got, want in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
