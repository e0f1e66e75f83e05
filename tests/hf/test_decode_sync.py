"""The Hugging Face decode step reads no tensor value on the host on the GPU's path
(`device_side_checks()` on the CPU, recorded by `HostReads`): a forward with a filled cache
for every attention type, with and without attention_mask, and generate(), whose reads
inside pathattn do not grow with the tokens (transformers' own loop reads one value per
token, its stopping check, for every model)."""

from __future__ import annotations

import pytest
import torch

from pathattn.models import ATTN_TYPES
from pathattn.utils.host_reads import HostReads
from pathattn.utils.value_checks import device_side_checks

pytest.importorskip("transformers")
from pathattn.hf import PaTHConfig, PaTHForCausalLM  # noqa: E402

V = 32


def make_model(attn_type: str) -> PaTHForCausalLM:
    torch.manual_seed(0)
    return PaTHForCausalLM(PaTHConfig(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, w_rank=8, attn_type=attn_type,
        initializer_range=0.2)).eval()


def prompt() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :3] = 0
    return torch.randint(0, V, (2, 9), generator=gen), mask


def ours(reads: HostReads) -> list[tuple[str, str]]:
    """The reads made by pathattn's code (not transformers' generation loop)."""
    return [e for e in reads.events if "/pathattn/" in e[1]]


@pytest.mark.parametrize("attn_type", ATTN_TYPES, ids=str)
@pytest.mark.parametrize("mask_kind", ["none", "ones", "left_padded"])
def test_forward_decode_reads_nothing(attn_type, mask_kind):
    model = make_model(attn_type)
    ids, mask = prompt()
    mask = {"none": None, "ones": torch.ones_like(mask), "left_padded": mask}[mask_kind]
    with torch.no_grad(), device_side_checks():
        out = model(ids, attention_mask=mask, use_cache=True)
        for step in range(3):
            tok = out.logits[:, -1:].argmax(-1)
            if mask is not None:
                mask = torch.cat([mask, mask.new_ones(2, 1)], dim=1)
            with HostReads() as reads:
                out = model(tok, attention_mask=mask, cache=out.cache, logits_to_keep=1)
            if step:  # the first step builds the fused projections and, once per process,
                # the clamp bound of beta from CPU scalars (`strict_cap_value`)
                assert not reads.events, reads.report()


@pytest.mark.parametrize("attn_type", ["path", "path_fox", "fox", "rope"], ids=str)
def test_generate_reads_per_token(attn_type):
    model = make_model(attn_type)
    ids, mask = prompt()
    counts = []
    with device_side_checks():
        for n in (2, 6):
            with HostReads() as reads:
                model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                               do_sample=False, pad_token_id=0, eos_token_id=None)
            counts.append(len(ours(reads)))
    assert counts[0] == counts[1], counts


def test_device_checks_same_generation():
    model = make_model("path_fox")
    ids, mask = prompt()
    kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    host = model.generate(ids, **kw)
    with device_side_checks():
        device = model.generate(ids, **kw)
    assert torch.equal(host, device)


def test_bad_step_inputs_refused_on_the_device():
    model = make_model("path")
    ids, mask = prompt()
    with torch.no_grad(), device_side_checks():
        cache = model(ids, attention_mask=mask, use_cache=True).cache
        step = torch.cat([mask, mask.new_full((2, 1), 2)], dim=1)
        with pytest.raises(RuntimeError, match="attention_mask must hold only 0"):
            model(ids[:, :1], attention_mask=step, cache=cache)
        with pytest.raises(ValueError, match="attention_mask must be bool or integer"):
            model(ids[:, :1], attention_mask=step.float(), cache=cache)
        with pytest.raises(RuntimeError, match="input_ids: ids must lie in"):
            model(ids[:, :1] + V, cache=cache)
