"""GPU-size checks of the Triton kernels (skipped without CUDA): bfloat16 at T = 8192 within
the same-precision error bound, float32 at T = 2048, and O(T) peak memory."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from pathattn import path_attn  # noqa: E402
from pathattn.ops import path_attn_naive  # noqa: E402

from .._helpers import assert_close_to_reference, cast, errors, make_dout, make_inputs  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _run(fn, inputs, dout, **kwargs):
    xs = tuple(None if x is None else x.cuda().requires_grad_() for x in inputs)
    o = fn(*xs, **kwargs)
    grads = torch.autograd.grad(o, xs, dout.cuda().to(o.dtype))
    return o.detach().double(), [gr.double() for gr in grads]


def test_bf16_T8192_within_same_precision_bound():
    """err(triton, bf16) <= 2 err(plain PyTorch naive, bf16) + 1e-5, output and all six
    gradients, both against the float64 blockwise op on the same rounded inputs.
    One head keeps the naive reference's autograd graph (about 30 GB) on the device."""
    B, T, HQ, H, D = 1, 8192, 1, 1, 64
    inputs = make_inputs(B, T, HQ, H, D, D, gates=True, dtype=torch.bfloat16)
    dout = make_dout(B, T, HQ, D).bfloat16()
    ours = _run(path_attn, inputs, dout, backend="triton")
    ref = _run(path_attn, cast(inputs, torch.float64), dout, backend="torch")
    plain = _run(path_attn_naive, inputs, dout, dtype=None)
    torch.cuda.empty_cache()
    e_ours, e_plain = errors(ours, ref), errors(plain, ref)
    bad = {n: (e_ours[n], e_plain[n]) for n in e_ours if not e_ours[n] <= 2 * e_plain[n] + 1e-5}
    assert not bad, f"(ours, plain) relative errors: {bad}"


@pytest.mark.parametrize("gates", [True, False], ids=["gates", "nogates"])
def test_fp32_T2048(gates):
    B, T, HQ, H, D = 2, 2048, 4, 2, 64
    inputs = make_inputs(B, T, HQ, H, D, D, gates=gates)
    dout = make_dout(B, T, HQ, D)
    ours = _run(path_attn, inputs, dout, backend="triton")
    ref = _run(path_attn, cast(inputs, torch.float64), dout, backend="torch")
    assert_close_to_reference(ours, ref, 1e-4)


def test_peak_memory_linear_in_T():
    """Forward + backward peak memory (beyond the inputs) grows linearly in T: doubling T
    at most doubles it (plus slack), far from the 4x of a T x T buffer."""
    def peak(T):
        inputs = [x.cuda().requires_grad_()
                  for x in make_inputs(1, T, 8, 8, 64, 64, gates=True, dtype=torch.bfloat16)]
        dout = torch.randn(1, T, 8, 64, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        path_attn(*inputs, backend="triton").backward(dout)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    peak(1024)  # warm-up (compilation)
    small, large = peak(8192), peak(16384)
    assert large <= 2.2 * small, (small, large)
