"""torch.compile of the attention layers' training path (PaTH, PaTH-FoX and the RoPE / FoX
/ stick-breaking baselines): no graph break with packed sequences (cu_seqlens), and
compiled == eager for the output and every parameter gradient (float32), dynamic lengths
included."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from pathattn.nn import FoXAttention, PaTHAttention, RoPEAttention, SBAttention
from tests._compile import assert_no_graph_breaks, assert_same, loss_and_grads

HIDDEN = 32

LAYERS = {
    "path": lambda: PaTHAttention(HIDDEN, 4, 2, w_rank=8),
    "path_fox": lambda: PaTHAttention(HIDDEN, 4, 2, w_rank=8, use_forget_gate=True),
    "rope": lambda: RoPEAttention(HIDDEN, 4, 2),
    "fox": lambda: FoXAttention(HIDDEN, 4, 2),
    "sba": lambda: SBAttention(HIDDEN, 4, 2),
}


def _packed(lengths) -> tuple[torch.Tensor, torch.Tensor]:
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return torch.randn(1, sum(lengths), HIDDEN), cu


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_has_no_graph_break(name):
    layer = LAYERS[name]()
    x, cu = _packed((6, 9))
    assert_no_graph_breaks(lambda x, cu: layer(x, cu).square().mean(), x, cu)


# the captured forward and backward graphs are checked (AOT autograd: the custom ops' fake
# implementations and autograd formulas, functionalization, dynamic shapes), without
# inductor's code generation, which costs about 50 s per layer on a small CPU; inductor's
# code around pathattn's custom op is checked on the op (tests/ops/path/test_compile.py),
# on a PaTH-FoX model's training step (tests/models/test_compile.py) and on the prefill
# and decode step (tests/ops/path/test_compile_inference.py)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_compiled_matches_eager(name):
    """One compile per layer (dynamic shapes), two packings of different lengths."""
    layer = LAYERS[name]()
    params = tuple(layer.parameters())

    def loss(x, cu):
        return layer(x, cu).square().mean()

    torch._dynamo.reset()  # a fresh compile: earlier tests' frames do not count here
    compiled = torch.compile(loss, fullgraph=True, dynamic=True, backend="aot_eager")
    for x, cu in (_packed((6, 9)), _packed((3, 1, 12))):
        want = loss_and_grads(loss, (x, cu), params)
        got = loss_and_grads(compiled, (x, cu), params)
        assert_same(got, want, rtol=1e-5, atol=1e-6)
