"""Several reflections per token (w [B, T, H, R, D], beta [B, T, H, R]) on every backend:
a backend that declares `Backend.reflections` matches the float64 naive reference, forward
and every gradient (float32 within F32_TOL, float64 by gradcheck); one that does not raises
a ValueError naming the backend and R, and "auto" passes over it.
"""

from __future__ import annotations

import pytest
import torch

from pathattn.ops.path.backends import get_backend, select_backend

from .._helpers import make_reflection_inputs
from ._cases import CU_70, Case, check_fp32

CASES = [
    pytest.param(Case(T=40, reflections=2), id="R2-GQA-gates"),
    pytest.param(Case(T=40, reflections=3, gates=False), id="R3-nogates"),
    pytest.param(Case(B=2, T=24, HQ=4, H=2, D=16, reflections=2), id="R2-B2-GQA2-D16"),
    pytest.param(Case(T=70, HQ=4, H=2, cu=CU_70, reflections=2), id="R2-packed"),
    pytest.param(Case(T=33, reflections=2, special="beta0or2", gates=False), id="R2-beta0or2"),
    pytest.param(Case(T=33, reflections=3, special="w_big"), id="R3-w_big"),
]


def _takes_reflections(backend) -> bool:
    return get_backend(backend.name).reflections


@pytest.mark.parametrize("case", CASES)
def test_fp32_reflections(backend, case):
    if not _takes_reflections(backend):
        pytest.skip(f"backend {backend.name!r} takes one reflection per token")
    check_fp32(backend, case, backend.block_size)


def test_fp32_reflections_block_sizes(backend, block_size):
    if not _takes_reflections(backend):
        pytest.skip(f"backend {backend.name!r} takes one reflection per token")
    check_fp32(backend, Case(T=50, reflections=2), block_size)


def test_gradcheck_float64_reflections(backend):
    """Finite differences w.r.t. all six inputs, R = 2, gates, GQA, packed sequences."""
    if not _takes_reflections(backend) or not backend.takes(torch.float64):
        pytest.skip(f"backend {backend.name!r} takes no float64 or one reflection per token")
    inputs = tuple(x.requires_grad_() for x in make_reflection_inputs(
        1, 11, 4, 2, 4, 3, 2, dtype=torch.float64))
    C = min(c for c in backend.limits.block_sizes if c >= 2)
    cu = torch.tensor([0, 1, 8, 8, 11])

    def fn(*xs):
        return backend.op(*xs, cu_seqlens=cu, block_size=C)

    assert torch.autograd.gradcheck(fn, inputs, fast_mode=True)


def test_refuses_reflections_or_runs_them(backend):
    """R = 2 runs on a backend that declares it and is refused by name elsewhere; R = 1 given
    as w [B, T, H, 1, D] runs everywhere."""
    dtype = torch.float32 if backend.takes(torch.float32) else backend.dtypes[0]
    multi = make_reflection_inputs(1, 8, 2, 1, 16, 16, 2, dtype=dtype)
    if _takes_reflections(backend):
        assert backend.op(*multi).shape == (1, 8, 2, 16)
    else:
        with pytest.raises(ValueError, match=f"^backend={backend.name!r}: .*R=2"):
            backend.op(*multi)
        q = multi[0].to(backend.device)
        assert select_backend("auto", q, reflections=2).reflections
    single = make_reflection_inputs(1, 8, 2, 1, 16, 16, 1, dtype=dtype)
    assert backend.op(*single).shape == (1, 8, 2, 16)
