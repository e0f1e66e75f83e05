"""torch.compile of a `PaTHLM` training step (forward, loss, backward): one graph, and the
compiled loss and every parameter gradient equal the eager ones (float32)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from pathattn.models import ModelConfig, PaTHLM
from tests._compile import assert_no_graph_breaks, assert_same, loss_and_grads


def _model(attn_type: str = "path_fox") -> PaTHLM:
    return PaTHLM(ModelConfig.preset("tiny", attn_type=attn_type))


def _batch(B: int, T: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, vocab, (B, T))
    return ids, torch.randint(0, vocab, (B, T))


@pytest.mark.parametrize("attn_type", ["path_fox", "sba"])
def test_training_step_has_no_graph_break(attn_type):
    model = _model(attn_type)
    ids, labels = _batch(2, 16, model.config.vocab_size)
    assert_no_graph_breaks(lambda ids, labels: model(ids, labels)[1], ids, labels)


@pytest.mark.parametrize("attn_type", ["path_fox", "rope", "sba"])
@torch.no_grad()
def test_prefill_with_attention_mask_has_no_graph_break(attn_type):
    """Left-padded prompts: the mask's checks and the padding run inside the graph."""
    model = _model(attn_type).eval()
    ids, _ = _batch(2, 12, model.config.vocab_size)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[0, :3] = 0
    assert_no_graph_breaks(lambda ids, mask: model.prefill(ids, mask)[0], ids, mask)


@pytest.mark.parametrize("attn_type", ["path_fox", "rope"])
@torch.no_grad()
def test_decode_has_no_graph_break(attn_type):
    """A decode step of the model (projections, beta's strict cap, the short conv's step,
    the attention step) traces as one graph."""
    model = _model(attn_type).eval()
    ids, _ = _batch(2, 12, model.config.vocab_size)
    _, cache = model.prefill(ids)
    new, _ = _batch(2, 1, model.config.vocab_size)
    assert_no_graph_breaks(lambda ids: model.decode(ids, cache), new)


@pytest.mark.slow
def test_training_step_compiled_matches_eager():
    """A dense batch and a dense batch of another length (no recompile: dynamic=True
    compiles the step for every length) through inductor, and a packed batch, a graph of
    its own, through AOT autograd without inductor's code generation (inductor's code for
    packed inputs is checked on the op, tests/ops/path/test_compile.py); one layer (compile
    time grows with the layers, and every layer is the same code)."""
    model = PaTHLM(ModelConfig.preset("tiny", attn_type="path_fox", num_hidden_layers=1))
    V = model.config.vocab_size
    params = tuple(model.parameters())

    def loss(ids, labels, cu_seqlens=None):
        return model(ids, labels, cu_seqlens)[1]

    torch._dynamo.reset()  # a fresh compile: earlier tests' frames do not count here
    compiled = torch.compile(loss, fullgraph=True, dynamic=True)

    def check(fn, args):
        want = loss_and_grads(loss, args, params)
        got = loss_and_grads(fn, args, params)
        assert_same(got, want, rtol=1e-5, atol=1e-6)

    check(compiled, _batch(2, 16, V))
    with torch._dynamo.config.patch(error_on_recompile=True):
        check(compiled, _batch(2, 23, V))
    packed = torch.compile(loss, fullgraph=True, dynamic=True, backend="aot_eager")
    check(packed, (*_batch(1, 14, V), torch.tensor([0, 5, 14], dtype=torch.int32)))
