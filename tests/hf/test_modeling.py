"""`pathattn.hf`: PaTHForCausalLM under transformers' generate(), Auto classes,
save_pretrained / from_pretrained, packing and gradient checkpointing, for every attn_type.
Models run in float64 so that cached decoding and full forward passes agree far below any
gap between the top two logits."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM  # noqa: E402

from pathattn.hf import PaTHConfig, PaTHForCausalLM, PaTHGenerationCache, PaTHModel  # noqa: E402
from pathattn.models import ATTN_TYPES, ModelConfig, PaTHLM  # noqa: E402

V = 32


def make_model(attn_type: str, seed: int = 0, **over) -> PaTHForCausalLM:
    """A 2-layer GQA model in float64 with a wide init (distinct top logits)."""
    torch.manual_seed(seed)
    kw = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, w_rank=8,
              initializer_range=0.3, attn_type=attn_type)
    return PaTHForCausalLM(PaTHConfig(**{**kw, **over})).double().eval()


def greedy_by_full_forward(model, ids: torch.Tensor, n: int) -> torch.Tensor:
    """n tokens by argmax over repeated full forward passes (no cache)."""
    for _ in range(n):
        with torch.no_grad():
            logits = model(ids, use_cache=False).logits  # [B, T, V]
        ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


@pytest.fixture(params=ATTN_TYPES)
def attn_type(request):
    return request.param


def test_greedy_generate_equals_full_forward_argmax(attn_type):
    model = make_model(attn_type)
    # ids avoid the pad id 0: generate() would infer left padding from it
    ids = torch.randint(1, V, (2, 9), generator=torch.Generator().manual_seed(1))
    out = model.generate(ids, max_new_tokens=32, do_sample=False, pad_token_id=0)
    assert out.shape == (2, 41)
    assert torch.equal(out, greedy_by_full_forward(model, ids, 32))
    # an attention mask without padding changes nothing (fla fails here on transformers 5)
    masked = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32,
                            do_sample=False, pad_token_id=0)
    assert torch.equal(masked, out)


def test_left_padded_batch_equals_each_prompt_alone(attn_type):
    model = make_model(attn_type, seed=1)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(1, V, (n,), generator=g) for n in (3, 8, 5)]
    T = max(len(p) for p in prompts)
    ids = torch.zeros(3, T, dtype=torch.long)  # pad id 0 on the left
    mask = torch.zeros(3, T, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, T - len(p):], mask[b, T - len(p):] = p, 1
    batch = model.generate(ids, attention_mask=mask, max_new_tokens=32, do_sample=False,
                           pad_token_id=0)[:, T:]
    for b, p in enumerate(prompts):
        alone = model.generate(p[None], max_new_tokens=32, do_sample=False, pad_token_id=0)
        assert torch.equal(batch[b], alone[0, len(p):]), f"row {b}"


def test_sampling_and_beam_search_match_uncached_generation(attn_type):
    model = make_model(attn_type, seed=2)
    ids = torch.randint(1, V, (2, 6), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding in row 1
    runs = {}
    for use_cache in (True, False):
        torch.manual_seed(7)
        sampled = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=True,
                                 top_k=0, temperature=1.0, pad_token_id=0, use_cache=use_cache)
        beams = model.generate(ids, attention_mask=mask, max_new_tokens=12, num_beams=3,
                               num_return_sequences=2, do_sample=False, pad_token_id=0,
                               use_cache=use_cache)
        runs[use_cache] = sampled, beams
    assert runs[True][1].shape == (4, 18)
    assert torch.equal(runs[True][0], runs[False][0])
    assert torch.equal(runs[True][1], runs[False][1])


def test_save_and_auto_load_give_identical_logits(attn_type, tmp_path):
    model = make_model(attn_type, seed=3, tie_word_embeddings=attn_type != "fox")
    model.save_pretrained(tmp_path)
    files = {p.name for p in tmp_path.iterdir()}
    assert "model.safetensors" in files and not any(f.endswith(".bin") for f in files)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "pathattn"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    assert type(loaded) is PaTHForCausalLM
    assert isinstance(AutoConfig.from_pretrained(tmp_path), PaTHConfig)
    ids = torch.randint(0, V, (2, 20), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
        base = AutoModel.from_pretrained(tmp_path, dtype=torch.float64).eval()
        assert type(base) is PaTHModel
        assert torch.equal(base(ids).last_hidden_state,
                           model.model(ids).last_hidden_state)
    if model.config.tie_word_embeddings:
        assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    else:
        assert not torch.equal(loaded.lm_head.weight, loaded.model.embed_tokens.weight)


def test_packed_batch_equals_padded_batch(attn_type):
    """Loss and every gradient: two sequences packed with cu_seqlens (first label of each
    sequence -100) against the same two right-padded in a batch."""
    model = make_model(attn_type, seed=4).train()
    g = torch.Generator().manual_seed(5)
    a, b = torch.randint(0, V, (7,), generator=g), torch.randint(0, V, (4,), generator=g)
    packed = torch.cat([a, b])[None]  # [1, 11]
    labels = packed.clone()
    labels[0, 7] = -100  # no prediction across the boundary
    cu = torch.tensor([0, 7, 11], dtype=torch.int32)
    padded = torch.zeros(2, 7, dtype=torch.long)
    padded[0], padded[1, :4] = a, b
    mask = (torch.arange(7) < torch.tensor([[7], [4]])).long()
    pad_labels = padded.masked_fill(mask == 0, -100)

    def loss_and_grads(**kw):
        model.zero_grad()
        loss = model(**kw).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    l1, g1 = loss_and_grads(input_ids=packed, labels=labels, cu_seqlens=cu)
    l2, g2 = loss_and_grads(input_ids=padded, labels=pad_labels, attention_mask=mask)
    torch.testing.assert_close(l1, l2, rtol=1e-12, atol=0)
    for name in g1:
        torch.testing.assert_close(g1[name], g2[name], rtol=1e-10, atol=1e-12, msg=name)


def test_packed_batch_in_eval_mode_needs_no_use_cache_flag(attn_type):
    """eval() turns use_cache on by default; a packed batch then takes the no-cache path
    (it used to raise unless use_cache=False was passed) and scores like separate rows."""
    model = make_model(attn_type, seed=4).eval()
    g = torch.Generator().manual_seed(5)
    a, b = torch.randint(0, V, (7,), generator=g), torch.randint(0, V, (4,), generator=g)
    packed = torch.cat([a, b])[None]
    cu = torch.tensor([0, 7, 11], dtype=torch.int32)
    with torch.no_grad():
        out = model(input_ids=packed, cu_seqlens=cu, output_attentions=True)
        assert out.cache is None
        alone = [model(input_ids=s[None], output_attentions=True) for s in (a, b)]
        torch.testing.assert_close(out.logits[0, :7], alone[0].logits[0])
        torch.testing.assert_close(out.logits[0, 7:], alone[1].logits[0])
        for layer, p in enumerate(out.attentions):  # block-diagonal: each sequence's own
            torch.testing.assert_close(p[:, :, :7, :7], alone[0].attentions[layer])
            torch.testing.assert_close(p[:, :, 7:, 7:], alone[1].attentions[layer])
            assert torch.all(p[:, :, 7:, :7] == 0)
        with pytest.raises(ValueError, match="cu_seqlens"):
            model(input_ids=packed, cu_seqlens=cu, use_cache=True)


def test_loss_is_shifted_hf_convention():
    model = make_model("path", seed=6)
    ids = torch.randint(0, V, (2, 10), generator=torch.Generator().manual_seed(7))
    out = model(ids, labels=ids)
    ref = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, V),
                                            ids[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, ref)
    summed = model(ids, labels=ids, num_items_in_batch=3).loss
    torch.testing.assert_close(summed, ref * 18 / 3)


def test_from_pathlm_identical_logits(attn_type):
    torch.manual_seed(8)
    lm = PaTHLM(ModelConfig.preset("tiny", attn_type=attn_type)).double().eval()
    hf = PaTHForCausalLM.from_pathlm(lm).eval()
    ids = torch.randint(0, 32, (2, 15), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        assert torch.equal(hf(ids, use_cache=False).logits, lm(ids)[0])


def test_cache_continues_generation_and_crops():
    model = make_model("path_fox", seed=9)
    ids = torch.randint(1, V, (1, 8), generator=torch.Generator().manual_seed(9))
    cache = PaTHGenerationCache()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the older name, without a warning
        first = model.generate(ids, past_key_values=cache, max_new_tokens=5, do_sample=False,
                               pad_token_id=0)
    assert len(cache) == 12  # the last generated token is not fed back yet
    more = model.generate(first, cache=cache, max_new_tokens=5, do_sample=False,
                          pad_token_id=0)
    assert torch.equal(more, greedy_by_full_forward(model, ids, 10))
    with pytest.raises(ValueError, match="cannot go back to 2 positions"):
        cache.crop(2)  # PaTH keys cannot be un-transformed past the pending window


@pytest.mark.parametrize("attn_type", ["path", "rope"])
@torch.no_grad()
def test_cache_names_of_transformers_5_and_the_older_one(attn_type, monkeypatch):
    """forward takes the cache as `cache` (transformers 5) or `past_key_values`, returns it
    as `output.cache`, and never goes through transformers' deprecated names."""
    from transformers.utils import generic

    deprecated = []
    monkeypatch.setattr(generic.logger, "warning_once", deprecated.append)
    model = make_model(attn_type).eval()
    ids = torch.randint(1, V, (2, 7), generator=torch.Generator().manual_seed(3))
    logits = []
    for name in ("past_key_values", "cache"):
        cache = model(ids[:, :6], use_cache=True)["cache"]
        out = model(ids[:, 6:], **{name: cache})
        assert out["cache"] is cache and len(cache) == 7
        logits.append(out.logits)
    assert torch.equal(logits[0], logits[1])
    assert deprecated == []
    cache = model(ids[:, :6], use_cache=True).cache
    with pytest.raises(ValueError, match="cache and past_key_values"):
        model(ids[:, 6:], past_key_values=cache, cache=PaTHGenerationCache())


@torch.no_grad()
def test_masked_tokens_equal_their_removal(attn_type):
    """Zeros anywhere in attention_mask (holes, left padding; and the pad id inside a
    prompt, from which generate() infers the mask): each row equals its real tokens alone,
    in the training path, the prefill and generation."""
    model = make_model(attn_type, seed=10)
    g = torch.Generator().manual_seed(10)
    ids = torch.randint(1, V, (2, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[0, [2, 3, 6]] = 0  # holes
    mask[1, [0, 1, 5]] = 0  # left padding and a hole
    for use_cache in (False, True):
        logits = model(ids, attention_mask=mask, use_cache=use_cache).logits
        for b in range(2):
            alone = model(ids[b: b + 1, mask[b] == 1], use_cache=False).logits[0]
            torch.testing.assert_close(logits[b, mask[b] == 1], alone, rtol=1e-9, atol=1e-11)
    prompt = ids[:1].clone()
    prompt[0, [2, 5]] = 0  # the pad id inside the prompt: generate() masks it
    out = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)
    removed = prompt[:, prompt[0] != 0]
    assert torch.equal(out[:, 9:], greedy_by_full_forward(model, removed, 4)[:, 7:])


@pytest.mark.parametrize("kwargs,match", [
    (dict(inputs_embeds=torch.zeros(1, 3, 32)), "exactly one of input_ids"),
    (dict(attention_mask=torch.tensor([[1, 1, 0]]), use_cache=True), "pad on the left"),
    (dict(attention_mask=torch.tensor([[0, 0, 0]])), "at least one token"),
    (dict(attention_mask=torch.ones(1, 4)), r"\[B, T\]"),
    (dict(past_key_values=object()), "PaTHGenerationCache"),
    (dict(labels=torch.zeros(1, 2, dtype=torch.long)), "labels"),
    (dict(shift_labels=torch.zeros(1, 3, dtype=torch.long)), "pass labels too"),
    (dict(foo=1, token_type_ids=torch.zeros(1, 3)), r"\['foo', 'token_type_ids'\]"),
    (dict(cu_seq_lens_q=torch.tensor([0, 3])), "pass cu_seqlens"),
    (dict(output_attentions=1), "output_attentions must be a bool"),
], ids=["ids-and-embeds", "right-pad-cache", "empty-row", "mask-shape", "cache-type",
        "labels-shape", "shift-labels-alone", "unknown", "packing-kwargs", "flag-type"])
def test_bad_input_raises_naming_the_argument(kwargs, match):
    model = make_model("path")
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match=match):
        model(ids, **kwargs)


def test_inputs_embeds_of_another_dtype_are_refused():
    model = make_model("path")
    embeds = model.get_input_embeddings()(torch.tensor([[1, 2, 3]]))
    with pytest.raises(ValueError, match="inputs_embeds must have the embeddings' dtype"):
        model(inputs_embeds=embeds.float())


def test_config_validates_fields():
    with pytest.raises(ValueError, match="attn_type"):
        PaTHConfig(attn_type="alibi")
    with pytest.raises(ValueError, match="num_key_value_heads"):
        PaTHConfig(num_attention_heads=4, num_key_value_heads=3)
    cfg = PaTHConfig.from_model_config(ModelConfig.preset("tiny"), eos_token_id=3)
    assert cfg.to_model_config() == ModelConfig.preset("tiny") and cfg.eos_token_id == 3
