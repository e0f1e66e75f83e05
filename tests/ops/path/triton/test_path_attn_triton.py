"""Triton-only behaviour of `path_attn_triton`: the backward's segment length `seg` (a knob
of this backend: its state recomputation has a separate path for the query block's own
segment and earlier ones), its own argument checks, and the interpreter it needs on CPU
tensors. Its exactness through `path_attn(backend="triton")` (forward and every gradient,
packing, low precision, errors) is the conformance suite, `tests/ops/path/conformance`.

Without CUDA the kernels run on Triton's interpreter (see conftest.py), so the sizes are
small; block_size=16 makes T <= 100 span up to 7 blocks.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from pathattn import path_attn  # noqa: E402
from pathattn.ops import path_attn_naive  # noqa: E402
from pathattn.ops.path.triton.op import path_attn_triton  # noqa: E402

from .._helpers import (  # noqa: E402
    assert_close_to_reference,
    cast,
    errors,
    make_dout,
    make_inputs,
    run_with_grads,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32_TOL = 1e-4  # as the conformance suite (tests/ops/path/conformance/_cases.py)
CU_70 = (0, 1, 2, 19, 19, 50, 51, 70)  # lengths 1, 1, 17, 0, 31, 1, 19


def _on_device(fn):
    """fn on DEVICE for CPU inputs, output back on the CPU (differentiable)."""
    def run(*inputs, cu_seqlens=None, **kwargs):
        xs = tuple(None if x is None else x.to(DEVICE) for x in inputs)
        cu = None if cu_seqlens is None else cu_seqlens.to(DEVICE)
        return fn(*xs, cu_seqlens=cu, **kwargs).cpu()
    return run


@pytest.mark.parametrize("B, T, HQ, H, gates, cu, seg", [
    pytest.param(1, 100, 2, 1, True, None, 1, id="T100-seg1"),
    pytest.param(1, 100, 2, 1, False, None, 2, id="T100-nogates-seg2"),
    pytest.param(2, 50, 2, 2, True, None, 2, id="B2-T50-MHA-seg2"),
    pytest.param(1, 70, 2, 1, False, CU_70, 1, id="T70-packed-nogates-seg1"),
])
def test_fp32_backward_segments(B, T, HQ, H, gates, cu, seg):
    """Several key blocks per query block, the backward's state recomputed in segments of
    `seg` blocks: forward and every gradient against the float64 reference."""
    D = 32
    inputs = make_inputs(B, T, HQ, H, D, D, gates)
    dout = make_dout(B, T, HQ, D)
    cu_seqlens = None if cu is None else torch.tensor(cu)
    ours = run_with_grads(_on_device(path_attn_triton), inputs, dout, cu_seqlens=cu_seqlens,
                          block_size=16, seg=seg)
    ref = run_with_grads(path_attn_naive, cast(inputs, torch.float64), dout, cu_seqlens=cu_seqlens)
    assert_close_to_reference(ours, ref, F32_TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gates_with_64_token_blocks(dtype):
    """64-token blocks take the keys' gate column sums inside the query's own segment from
    a matrix product (shorter blocks reduce dS directly): 4 blocks in segments of 2, so
    two query blocks meet an earlier block of their own segment. float32 against the
    float64 reference; bfloat16 within twice plain PyTorch's bfloat16 error (the
    conformance suite's rule)."""
    B, T, HQ, H, D = 1, 200, 2, 1, 32
    inputs = make_inputs(B, T, HQ, H, D, D, True)
    dout = make_dout(B, T, HQ, D)
    ref = run_with_grads(path_attn_naive, cast(inputs, torch.float64), dout)
    low = tuple(x.to(dtype) for x in inputs)
    ours = run_with_grads(_on_device(path_attn_triton), low, dout.to(dtype), block_size=64,
                          seg=2)
    if dtype == torch.float32:
        assert_close_to_reference(ours, ref, F32_TOL)
        return
    plain = run_with_grads(path_attn_naive, low, dout.to(dtype), dtype=None)
    e_ours, e_plain = errors(ours, ref), errors(plain, ref)
    assert all(e_ours[n] <= 2 * e_plain[n] + 1e-5 for n in e_ours), (e_ours, e_plain)


@pytest.mark.parametrize("D", [32, 24], ids=lambda d: f"D{d}")
@pytest.mark.parametrize("gates", [True, False], ids=["gates", "nogates"])
def test_segment_products_read_in_row_slices(monkeypatch, gates, D):
    """Past D = 64 the kernels read a segment product (M, Pi) a slice at a time, with the
    matching column slices of the state, keys, gradient or previous product read back from
    memory (`segments.times_e_sliced`, `cross_back_sliced`, `crossings.times_et_sliced`);
    here at D = 32 and 24 (padded to 32) with 8-row slices, every segment crossed: forward
    and every gradient against the float64 reference."""
    from pathattn.ops.path.triton.config import LaunchConfig

    for name in ("e_rows", "m_rows", "kv_rows"):
        monkeypatch.setattr(LaunchConfig, name, lambda self, BD: min(BD, 8))
    inputs = make_inputs(1, 80, 2, 1, D, D, gates)
    dout = make_dout(1, 80, 2, D)
    ours = run_with_grads(_on_device(path_attn_triton), inputs, dout, block_size=16, seg=1)
    ref = run_with_grads(path_attn_naive, cast(inputs, torch.float64), dout)
    assert_close_to_reference(ours, ref, F32_TOL)


def test_segment_slices_at_head_dim_96():
    """The slices as the launcher sets them past D = 64: D = 96 (padded to 128, 32-row
    slices, the last one a quarter masked), GQA, 16-token blocks in segments of one block,
    so that every segment is crossed and the Pi chains are three products long: forward and
    every gradient against the float64 reference."""
    inputs = make_inputs(1, 64, 2, 1, 96, 32, True)
    dout = make_dout(1, 64, 2, 32)
    ours = run_with_grads(_on_device(path_attn_triton), inputs, dout, block_size=16, seg=1)
    ref = run_with_grads(path_attn_naive, cast(inputs, torch.float64), dout)
    assert_close_to_reference(ours, ref, F32_TOL)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_first_gate_of_each_sequence_has_no_gradient(dtype):
    """The gate of a sequence's first token adds the same constant to every logit of the
    sequence, so its gradient is zero. The backward gets it as the sum over the sequence of
    row sums minus column sums of dS, which cancel up to float32 rounding at any input
    dtype; dropping the row sums (zero only when delta = dO . o is exact) left 0.6% of
    ||dg|| there in bfloat16, from the output's rounding."""
    cu = torch.tensor([0, 1, 20, 50])
    inputs = make_inputs(1, 50, 2, 1, 32, 32, True, dtype)
    _, grads = run_with_grads(_on_device(path_attn_triton), inputs,
                              make_dout(1, 50, 2, 32).to(dtype), cu_seqlens=cu,
                              block_size=16)
    dg = grads[5].float()  # [1, T, HQ]
    assert dg[0, cu[:-1]].abs().max() <= 1e-5 * dg.norm()


def test_empty_and_errors():
    q, k, v, w, beta, g = (x.to(DEVICE) for x in make_inputs(2, 0, 2, 1, 32, 32, True))
    assert path_attn_triton(q, k, v, w, beta, g).shape == (2, 0, 2, 32)
    q, k, v, w, beta, g = (x.to(DEVICE) for x in make_inputs(1, 8, 2, 1, 32, 32, True))
    with pytest.raises(ValueError, match="block_size"):
        path_attn_triton(q, k, v, w, beta, g, block_size=24)
    with pytest.raises(ValueError, match="float64"):
        path_attn_triton(*(x.double() for x in (q, k, v, w, beta, g)))


@pytest.mark.skipif(DEVICE == "cuda", reason="CPU-only behaviour")
def test_cpu_tensors_need_the_interpreter(monkeypatch):
    inputs = make_inputs(1, 8, 2, 1, 16, 16, True)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="backend='triton'.*TRITON_INTERPRET"):
        path_attn(*inputs, backend="triton")
