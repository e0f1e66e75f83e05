"""torch.compile of the op: no graph break (fullgraph), dynamic sequence lengths,
cu_seqlens, and compiled == eager (output and every gradient, float32). The compiled
function is built once per module and shared by the tests. Prefill and decode step:
`test_compile_inference.py`."""

from __future__ import annotations

import functools

import pytest
import torch
import torch._dynamo

from pathattn.ops import path_attn
from tests._compile import assert_no_graph_breaks, assert_same, fresh, loss_and_grads
from tests.ops.path._helpers import make_dout, make_inputs

pytestmark = pytest.mark.slow  # inductor compilations, about a minute in all

B, HQ, H, D = 1, 4, 2, 8  # GQA: two query heads per key/value head


def _inputs(T: int, gates: bool = True, B: int = B) -> tuple:
    return tuple(None if x is None else x.requires_grad_()
                 for x in make_inputs(B, T, HQ, H, D, D, gates=gates))


def op_loss(q, k, v, w, beta, g, dout, cu_seqlens=None):
    """A scalar whose gradients are the op's backward for the cotangent dout."""
    return (path_attn(q, k, v, w, beta, g, cu_seqlens=cu_seqlens) * dout).sum()


@functools.cache
def compiled_op_loss():
    return torch.compile(op_loss, fullgraph=True, dynamic=True)


CASES = {  # id -> (batch, lengths of the packed sequences or None for a dense batch)
    "dense": (2, None),
    "packed": (1, (5, 12, 1)),
}


def _case(name: str, T: int | None = None, gates: bool = True):
    batch, lengths = CASES[name]
    cu = None
    if lengths is not None:
        T = sum(lengths)
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    inputs = _inputs(T, gates, batch)
    return (*inputs, make_dout(batch, T, HQ, D)), cu


@pytest.mark.parametrize("case", list(CASES))
def test_op_has_no_graph_break(case):
    args, cu = _case(case, T=19)
    assert_no_graph_breaks(op_loss, *args, cu)


@pytest.mark.parametrize("case,gates", [("dense", True), ("packed", False)],
                         ids=["dense-gates", "packed-no_gates"])
def test_op_compiled_matches_eager(case, gates):
    """Each of the op's optional inputs (gates, cu_seqlens) present in one case and absent in
    the other: every case is a graph of its own."""
    args, cu = _case(case, T=19, gates=gates)
    want = loss_and_grads(op_loss, (*args, cu))
    got = loss_and_grads(compiled_op_loss(), (*fresh(args), cu))
    assert_same(got, want)


def test_op_dynamic_lengths_do_not_recompile():
    """After one length, other lengths (and other packings) reuse the compiled code."""
    fn = compiled_op_loss()
    args, _ = _case("dense", T=23)
    loss_and_grads(fn, args)  # compiled for dynamic T (or already compiled)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for T in (7, 33):
            args, _ = _case("dense", T=T)
            assert_same(loss_and_grads(fn, fresh(args)), loss_and_grads(op_loss, args))


def test_compiled_cu_seqlens_values_are_checked():
    args, _ = _case("packed")
    bad = torch.tensor([0, 12, 5, 18], dtype=torch.int32)  # decreasing
    with pytest.raises((RuntimeError, ValueError), match="non-decreasing"):
        compiled_op_loss()(*fresh(args), bad)
