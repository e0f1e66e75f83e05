"""Every backend against the float64 naive reference, forward and every gradient (q, k, v, w,
beta, g): float32 within F32_TOL (`_cases`), float64 within 1e-10 and by gradcheck where the
backend takes float64. Sequence lengths around the block size (15, 16, 17 with 16-token
blocks), head dims including a non-power of two, GQA / MQA, gates on and off, every block
size the backend accepts, and inputs at the edges of the layer's ranges.
"""

from __future__ import annotations

import pytest
import torch

from .._helpers import NAMES, assert_close_to_reference, make_inputs, run_with_grads
from ._cases import CU_70, Case, check_fp32, reference

# every sequence length with every head dim; half of them without gates (gates make far
# keys negligible: without them every Householder product matters); Dv = 32 differs from
# D except at D = 32; D = 48 is not a power of two
HEAD_DIMS = [pytest.param(16, True, id="D16-gates"), pytest.param(32, False, id="D32-nogates"),
             pytest.param(48, True, id="D48-gates"), pytest.param(64, False, id="D64-nogates")]


@pytest.mark.parametrize("D, gates", HEAD_DIMS)
@pytest.mark.parametrize("T", [1, 15, 16, 17, 65], ids=lambda t: f"T{t}")
def test_fp32_seq_len_x_head_dim(backend, T, D, gates):
    """GQA (2 query heads on 1 key/value head), the suite's block size (16)."""
    check_fp32(backend, Case(T=T, D=D, gates=gates), backend.block_size)


@pytest.mark.parametrize("gates", [True, False], ids=["gates", "nogates"])
@pytest.mark.parametrize("HQ, H", [pytest.param(2, 2, id="MHA"), pytest.param(4, 2, id="GQA2"),
                                   pytest.param(4, 1, id="MQA")])
def test_fp32_heads_and_gates(backend, HQ, H, gates):
    """B = 2 rows of 24 tokens (a full block and a partial one)."""
    check_fp32(backend, Case(B=2, T=24, HQ=HQ, H=H, gates=gates), backend.block_size)


def test_fp32_block_sizes(backend, block_size):
    """Every block size of the backend's `Limits` and its default (None), on 100 tokens
    without gates."""
    check_fp32(backend, Case(T=100, gates=False), block_size)


def test_fp32_largest_head_dim(backend):
    """D = the backend's largest head dim (256 when it has none), Dv = 32."""
    D = backend.limits.max_head_dim or 256
    check_fp32(backend, Case(T=20, HQ=1, D=D, Dv=32), backend.block_size)


SPECIAL = [Case(**kw) for kw in (
    {"scale": 0.3}, {"scale": 1.0, "gates": False},
    {"special": "beta0"}, {"special": "beta2"}, {"special": "beta0or2", "gates": False},
    {"special": "w_free", "gates": False}, {"special": "w_big"},
    {"special": "w_big", "gates": False}, {"special": "sharp"},
    {"special": "sharp", "gates": False}, {"special": "gate_ramp"}, {"special": "gate_wall"},
)]


@pytest.mark.parametrize("case", SPECIAL, ids=str)
def test_fp32_special_inputs(backend, case):
    check_fp32(backend, case, backend.block_size)


def test_fp32_large_gates_stay_finite(backend):
    """g = -50 on 20 consecutive tokens: keys behind the cliff get weight exp(-1000) = 0;
    nothing may turn into NaN or inf."""
    o, grads = check_fp32(backend, Case(special="gate_cliff"), backend.block_size)
    for name, x in zip(("o",) + NAMES, [o, *grads], strict=True):
        assert torch.isfinite(x).all(), name


def test_fp32_strides_and_mixed_dtypes(backend):
    """q, k, v, w as transposed [B, H, T, D] tensors (strided views), beta and g in float64
    (their gradients come back in float64), packed sequences with int32 cu_seqlens."""
    case = Case(T=70, HQ=4, H=2, cu=CU_70)
    q, k, v, w, beta, g = case.inputs()
    strided = tuple(x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v, w))
    assert not any(x.is_contiguous() for x in strided)
    inputs = (*strided, beta.double(), g.double())
    o, grads = check_fp32(backend, case, backend.block_size, inputs=inputs,
                          cu_seqlens=torch.tensor(CU_70, dtype=torch.int32))
    assert [x.dtype for x in grads] == [x.dtype for x in inputs]


@pytest.mark.parametrize("B, T", [(2, 0), (0, 5)], ids=["T0", "B0"])
def test_empty_inputs(backend, B, T):
    """No tokens: an empty output, and gradients of the inputs' shapes."""
    inputs = make_inputs(B, T, 2, 1, 16, 8)
    o, grads = run_with_grads(backend.op, inputs, torch.zeros(B, T, 2, 8))
    assert o.shape == (B, T, 2, 8) and o.dtype == torch.float32
    assert [gr.shape for gr in grads] == [x.shape for x in inputs]


def _needs_float64(backend):
    if not backend.takes(torch.float64):
        pytest.skip(f"backend {backend.name!r} does not take float64")


def test_float64_matches_reference(backend):
    """float64 inputs compute in float64: equal to the naive reference within 1e-10, also
    where probabilities fall below the blockwise exp cutoff (exp(-64))."""
    _needs_float64(backend)
    case = Case(special="gate_ramp")
    ours = run_with_grads(backend.op, case.inputs(torch.float64), case.dout(),
                          block_size=backend.block_size)
    assert ours[0].dtype == torch.float64
    assert_close_to_reference(ours, reference(case), 1e-10)


@pytest.mark.parametrize("B, cu", [pytest.param(2, None, id="dense"),
                                   pytest.param(1, (0, 1, 8, 8, 11), id="packed")])
def test_gradcheck_float64(backend, B, cu):
    """Finite differences w.r.t. all six inputs, with gates and GQA; T = 11 spans several
    blocks of the backend's smallest block size of at least 2 (lengths 1, 7, 0, 3 packed).
    Fast mode (one random direction per input): the float64 test above already compares
    every gradient entry with the reference's."""
    _needs_float64(backend)
    T, HQ, H, D, Dv = 11, 4, 2, 4, 3
    C = min(c for c in backend.limits.block_sizes if c >= 2)
    inputs = tuple(x.requires_grad_() for x in make_inputs(B, T, HQ, H, D, Dv,
                                                           dtype=torch.float64))
    cu_seqlens = None if cu is None else torch.tensor(cu)

    def fn(*xs):
        return backend.op(*xs, cu_seqlens=cu_seqlens, block_size=C)

    assert torch.autograd.gradcheck(fn, inputs, fast_mode=True)


def test_refused_inputs(backend):
    """Dtypes, block sizes and head dims the backend does not take raise a ValueError that
    names the backend (dtypes) or the argument; accepted ones run."""
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        inputs = make_inputs(1, 8, 2, 1, 16, 16, dtype=dtype)
        if backend.takes(dtype):
            assert backend.op(*inputs).dtype == dtype
        else:
            with pytest.raises(ValueError, match=f"^backend={backend.name!r}: "):
                backend.op(*inputs)
    inputs = make_inputs(1, 8, 2, 1, 16, 16)
    for C in (0, 24, 2048):
        if backend.limits.accepts_block_size(C):
            backend.op(*inputs, block_size=C)
        else:
            with pytest.raises(ValueError, match="block_size"):
                backend.op(*inputs, block_size=C)
    if backend.limits.max_head_dim is not None:
        D = backend.limits.max_head_dim + 16
        with pytest.raises(ValueError, match="head dim"):
            backend.op(*make_inputs(1, 8, 2, 1, D, 16))

