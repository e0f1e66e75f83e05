"""A decode step reads no tensor value on the host on the GPU's path: every attention type,
`PaTHLM.decode` and `generate_greedy`, with and without masked prompt tokens, run under
`device_side_checks()` (the CPU takes the path a GPU takes) and `HostReads` (which records
value reads, value-dependent shapes, transfers and tensors from host data). The values are
still checked: bad ids fail on the device (RuntimeError on the CPU), and the host path keeps
its ValueError. Tiny float32 models."""

from __future__ import annotations

import pytest
import torch

from pathattn.models import ATTN_TYPES, ModelConfig, PaTHLM
from pathattn.utils.host_reads import HostReads
from pathattn.utils.value_checks import checks_on_host, device_side_checks

attn_types = pytest.mark.parametrize("attn_type", ATTN_TYPES, ids=str)


def make_model(attn_type: str) -> PaTHLM:
    torch.manual_seed(0)
    return PaTHLM(ModelConfig.preset("tiny", attn_type=attn_type,
                                     initializer_range=0.2)).eval()


def prompt(B: int = 2, T: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, T] and a left-padding mask (row 0 has 3 masked tokens)."""
    gen = torch.Generator().manual_seed(1)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, :3] = 0
    return torch.randint(0, 32, (B, T), generator=gen), mask


@attn_types
@pytest.mark.parametrize("masked", [False, True], ids=["dense", "left_padded"])
def test_decode_step_reads_nothing(attn_type, masked):
    model = make_model(attn_type)
    ids, mask = prompt()
    with torch.no_grad(), device_side_checks():
        logits, cache = model.prefill(ids, mask if masked else None)
        tok = logits[:, -1:].argmax(-1)
        model.decode(tok, cache)  # the first step builds the fused projections
        for _ in range(3):
            with HostReads() as reads:
                logits = model.decode(tok, cache)
            assert not reads.events, reads.report()
            tok = logits[:, -1:].argmax(-1)


@pytest.mark.parametrize("attn_type", ["path", "rope"], ids=str)
def test_generate_greedy_reads_per_token(attn_type):
    """generate_greedy's reads do not grow with the tokens (all of them at the prefill)."""
    model = make_model(attn_type)
    ids, mask = prompt()
    counts = []
    with device_side_checks():
        for n in (2, 6):
            with HostReads() as reads:
                model.generate_greedy(ids, n, mask)
            counts.append(len(reads.events))
    assert counts[0] == counts[1], counts


def test_window_commit_reads_nothing():
    """The steps that fold the pending window into the cached keys (every
    max_pending_tokens tokens) and grow the buffers read nothing either."""
    model = make_model("path")
    ids, _ = prompt(T=60)
    with torch.no_grad(), device_side_checks():
        logits, cache = model.prefill(ids)
        tok = logits[:, -1:].argmax(-1)
        model.decode(tok, cache)
        layer = cache.layers[0].attn
        layer.max_pending_tokens = 4  # an instance override: commit every 4 tokens
        grows = layer.num_grows
        with HostReads() as reads:
            for _ in range(70):  # capacity 124 after a 60-token prompt: one growth
                tok = model.decode(tok, cache)[:, -1:].argmax(-1)
        assert not reads.events, reads.report()
        assert layer.num_grows > grows and layer.window_len < 4


@pytest.mark.parametrize("attn_type", ["path", "rope"], ids=str)
def test_device_checks_same_tokens(attn_type):
    """The device's path decodes the same logits as the host's, bit for bit."""
    model = make_model(attn_type)
    ids, mask = prompt()
    with torch.no_grad():
        host = model.generate_greedy(ids, 5, mask)
        with device_side_checks():
            device = model.generate_greedy(ids, 5, mask)
    assert torch.equal(host, device)


def test_bad_ids_still_refused():
    model = make_model("path")
    ids, _ = prompt()
    with torch.no_grad():
        _, cache = model.prefill(ids)
        with pytest.raises(ValueError, match="input_ids: ids must lie in"):
            model.decode(ids[:, :1] + 32, cache)  # host: a ValueError at the call
        with device_side_checks(), pytest.raises(RuntimeError, match="input_ids: ids must"):
            model.decode(ids[:, :1] - 40, cache)  # device: torch._assert_async
        with device_side_checks(), pytest.raises(ValueError, match="input_ids"):
            model.decode(ids[:, :1].float(), cache)  # dtypes and shapes: on the host


def test_checks_on_host_decision():
    assert checks_on_host(torch.device("cpu"))
    assert not checks_on_host(torch.device("meta"))
    with device_side_checks():
        assert not checks_on_host(torch.device("cpu"))
        with device_side_checks():
            pass
        assert not checks_on_host(torch.device("cpu"))
    assert checks_on_host(torch.device("cpu"))
