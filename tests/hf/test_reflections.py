"""PaTHForCausalLM with num_reflections=2: generate() equals argmax over full forward
passes (also with a left-padded batch), and save_pretrained / from_pretrained keep the field
and the logits. float64, so that cached decoding and full passes agree far below any gap
between the top two logits."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM  # noqa: E402

from pathattn.hf import PaTHConfig, PaTHForCausalLM  # noqa: E402

V = 32


@pytest.fixture(scope="module", params=["path_fox"])
def model(request) -> PaTHForCausalLM:
    torch.manual_seed(0)
    config = PaTHConfig(vocab_size=V, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        w_rank=8, initializer_range=0.3, attn_type=request.param,
                        num_reflections=2)
    return PaTHForCausalLM(config).double().eval()


def _greedy(model, ids: torch.Tensor, n: int) -> torch.Tensor:
    for _ in range(n):
        with torch.no_grad():
            logits = model(ids, use_cache=False).logits  # [B, T, V]
        ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


def test_generate_equals_full_forward_argmax(model):
    ids = torch.randint(1, V, (2, 7), generator=torch.Generator().manual_seed(1))
    out = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(out, _greedy(model, ids, 12))


def test_left_padded_generate_equals_each_prompt_alone(model):
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(1, V, (1, n), generator=g) for n in (7, 3)]
    ids = torch.zeros(2, 7, dtype=torch.long)
    mask = torch.zeros(2, 7, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, 7 - p.shape[1]:], mask[b, 7 - p.shape[1]:] = p[0], 1
    out = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                         pad_token_id=0)
    for b, p in enumerate(prompts):
        alone = model.generate(p, max_new_tokens=8, do_sample=False, pad_token_id=0)
        assert torch.equal(out[b, 7:], alone[0, p.shape[1]:])


def test_save_and_load_keep_reflections(model, tmp_path):
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["num_reflections"] == 2
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    assert loaded.config.num_reflections == 2
    saved, back = model.state_dict(), loaded.state_dict()
    assert saved.keys() == back.keys()
    assert all(torch.equal(saved[k], back[k]) for k in saved)  # every weight, bit for bit
    ids = torch.randint(0, V, (2, 15), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        a, b = loaded(ids).logits, model(ids).logits
    # equal up to rounding: the loaded weights sit at other memory alignments, and MKL's
    # GEMMs round differently by alignment on some CPUs (seen: 5.9e-15 on an AMD EPYC)
    assert float((a - b).abs().max() / b.abs().max()) < 1e-13
