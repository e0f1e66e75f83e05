"""The Triton forward and backward under the interpreter's memory checks (`_memcheck`):
no access outside the tensors of a launch, no address shared between two programs of a
launch unless only through atomics, and no read of memory nobody wrote (every allocation
filled with NaN first: the outputs stay finite and exact). Several segments per sequence
(so every kernel and every multi-segment transition runs), with and without gates, GQA
and packing; and two reflections per token."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from pathattn.ops import path_attn_naive  # noqa: E402
from pathattn.ops.path.triton.op import path_attn_triton  # noqa: E402

from .._helpers import (  # noqa: E402
    assert_close_to_reference,
    cast,
    make_dout,
    make_inputs,
    run_with_grads,
)
from ._memcheck import interpreter_memcheck, poisoned_allocations  # noqa: E402
from .test_path_attn_triton import F32_TOL  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="checks the CPU interpreter's runs of the kernels")


@pytest.mark.parametrize("gates, B, HQ, cu, R", [
    pytest.param(True, 2, 1, None, 1, id="gates-dense"),
    pytest.param(False, 1, 2, (0, 1, 12, 112), 1, id="nogates-GQA-packed"),
    pytest.param(True, 1, 1, None, 2, id="gates-R2"),
])
def test_kernels_stay_inside_their_memory(gates, B, HQ, cu, R):
    T, H, D = 112, 1, 16
    inputs = make_inputs(B, T, HQ, H, D, D, gates)
    if R > 1:  # two reflections per token: w [B, T, H, R, D], beta [B, T, H, R]
        gen = torch.Generator().manual_seed(1)
        w = torch.nn.functional.normalize(torch.randn(B, T, H, R, D, generator=gen), dim=-1)
        inputs = (*inputs[:3], w, torch.rand(B, T, H, R, generator=gen) * 2, inputs[5])
    dout = make_dout(B, T, HQ, D)
    cu_seqlens = None if cu is None else torch.tensor(cu)
    # 16-token blocks: 7 per sequence of 112 (or of the packed 100), 3 per segment, 3 segments
    with interpreter_memcheck() as found, poisoned_allocations():
        ours = run_with_grads(path_attn_triton, inputs, dout, cu_seqlens=cu_seqlens,
                              block_size=16)
    assert found.launches >= 10, found  # every kernel of a forward + backward ran
    assert not found.out_of_bounds, found.out_of_bounds
    assert not found.races, found.races
    ref = run_with_grads(path_attn_naive, cast(inputs, torch.float64), dout, cu_seqlens=cu_seqlens)
    assert_close_to_reference(ours, ref, F32_TOL)  # finite, so nothing unwritten was read


# The checks themselves, on kernels planted with each fault.

@triton.jit
def _shifted_copy(x_ptr, y_ptr, shift, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i + shift))


@triton.jit
def _neighbour_sum(x_ptr, y_ptr, ATOMIC: tl.constexpr):
    p = tl.program_id(0)
    if ATOMIC:  # every program adds into slot 0: atomics only, no race
        tl.atomic_add(y_ptr, tl.load(x_ptr + p))
    else:  # program p writes x[p] and reads x[p + 1], which program p + 1 writes
        tl.store(x_ptr + p, tl.load(x_ptr + p + 1) + 1.0)


def test_memcheck_sees_an_access_past_a_tensor():
    x, y = torch.zeros(32), torch.zeros(32)
    with interpreter_memcheck() as found:
        _shifted_copy[(1,)](x, y, 0, BLOCK=32)
    assert not found.out_of_bounds and found.launches == 1
    with interpreter_memcheck() as found:
        _shifted_copy[(1,)](x, y, 4, BLOCK=32)
    assert [(k, kind, n) for k, kind, n, _ in found.out_of_bounds] == [
        ("_shifted_copy", "load", 4)]


def test_memcheck_sees_a_race_between_programs():
    x, y = torch.zeros(9), torch.zeros(1)
    with interpreter_memcheck() as found:
        _neighbour_sum[(4,)](x, y, ATOMIC=True)
    assert not found.races and not found.out_of_bounds
    with interpreter_memcheck() as found:
        _neighbour_sum[(4,)](x, y, ATOMIC=False)
    assert [(k, n) for k, n, _ in found.races] == [("_neighbour_sum", 3)]  # x[1], x[2], x[3]


def test_poisoned_allocations_are_not_finite():
    with poisoned_allocations():
        a, b = torch.empty(3), torch.zeros(2).new_empty(2)
        i = torch.empty_like(torch.zeros(2, dtype=torch.int32))
    assert a.isnan().all() and b.isnan().all() and (i == 1 << 14).all()
    assert torch.empty(1).dtype == torch.float32  # restored
