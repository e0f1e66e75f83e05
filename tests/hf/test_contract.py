"""The transformers model contract, one suite for every attention type and, as the
reference of each behaviour, a LlamaForCausalLM of the same size: assisted decoding and
prompt lookup equal greedy search, hidden states and attentions on request, inputs_embeds,
shift_labels, gradient checkpointing through transformers' layer mechanism. Models run in
float64 so that the paths agree far below any gap between the top two logits."""

from __future__ import annotations

import functools

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from pathattn.hf import PaTHConfig, PaTHForCausalLM, PaTHGenerationCache  # noqa: E402
from pathattn.models import ATTN_TYPES  # noqa: E402

V = 32
SIZES = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3)
KINDS = ["llama", *ATTN_TYPES]  # llama: transformers' behaviour, the reference


def make_model(kind: str, seed: int = 0):
    """A 2-layer GQA model in float64 (eval mode) with a wide init (distinct top logits)."""
    torch.manual_seed(seed)
    if kind == "llama":
        config = LlamaConfig(**SIZES, attn_implementation="eager", pad_token_id=0)
        return LlamaForCausalLM(config).double().eval()
    return PaTHForCausalLM(PaTHConfig(**SIZES, w_rank=8, attn_type=kind)).double().eval()


def attention_modules(model) -> list:
    """Each block's attention module."""
    return [getattr(layer, "self_attn", None) or layer.attn for layer in model.model.layers]


def values_and_output(kind: str, attn, h: torch.Tensor):
    """The attention module's values v [B, T, H, D] of its input h, and its output map
    o [B, T, HQ, D] -> [B, T, hidden]."""
    if kind != "llama":
        return attn.qkv(h)[2], attn.out
    B, T = h.shape[:2]
    D = attn.head_dim
    v = attn.v_proj(h).view(B, T, -1, D)
    return v, lambda o: attn.o_proj(o.reshape(B, T, -1))


def greedy(model, ids: torch.Tensor, n: int, **kw) -> torch.Tensor:
    return model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0, **kw)


@pytest.fixture(params=KINDS)
def kind(request):
    return request.param


# ------------------------------------------------------------------ assisted decoding


def test_assisted_decoding_and_prompt_lookup_equal_greedy(kind, monkeypatch):
    """A draft model of other weights and prompt lookup (the prompt repeats itself, so
    candidates are proposed) give greedy search's tokens; drafts were rolled back."""
    crops = []
    crop = PaTHGenerationCache.crop
    monkeypatch.setattr(PaTHGenerationCache, "crop",
                        lambda self, n: (crops.append(n), crop(self, n))[1])
    model, draft = make_model(kind), make_model(kind, seed=1)
    ids = torch.tensor([[3, 9, 4, 7, 3, 9, 4, 7]])
    expected = greedy(model, ids, 6)
    assert torch.equal(greedy(model, ids, 6, assistant_model=draft), expected)
    assert torch.equal(greedy(model, ids, 6, prompt_lookup_num_tokens=3), expected)
    if kind != "llama":
        assert any(n < 0 for n in crops), "no draft token was rejected: the test is void"


@pytest.mark.parametrize("attn_type", ATTN_TYPES)
@torch.no_grad()
def test_crop_goes_back_to_any_length_after_recording(attn_type):
    """A cache that recorded its past crops to every length, into its prompt, and goes on
    as the full forward; without recording, a PaTH cache names its limit."""
    model = make_model(attn_type)
    ids = torch.randint(1, V, (2, 12), generator=torch.Generator().manual_seed(2))
    full = model(ids, use_cache=False).logits
    for keep in (3, 8):  # into the prompt, into the draft step
        cache = PaTHGenerationCache()
        cache.activate_past_recording()
        model(ids[:, :7], cache=cache)
        model(ids[:, 7:10], cache=cache)  # a draft step
        cache.crop(keep - 10)
        assert len(cache) == keep and cache.is_croppable
        torch.testing.assert_close(model(ids[:, keep:], cache=cache).logits,
                                   full[:, keep:], rtol=1e-9, atol=1e-11)
    cache = model(ids[:, :7], use_cache=True).cache
    model(ids[:, 7:10], cache=cache)
    cache.crop(-2)  # inside the last step: always possible
    if attn_type.startswith("path") or attn_type == "fox":
        assert not cache.is_croppable
        with pytest.raises(ValueError, match="activate_past_recording"):
            cache.crop(-3)


# ------------------------------------------------------------- hidden states, attentions


@torch.no_grad()
def test_hidden_states_equal_forward_hooks(kind):
    """L + 1 hidden states: the embeddings, each block's output, the last one after the
    final norm (forward hooks on those modules); in generate() one tuple per step."""
    model = make_model(kind)
    seen = []
    hook = lambda module, args, out: seen.append(out[0] if isinstance(out, tuple) else out)  # noqa: E731
    for module in (model.model.embed_tokens, *model.model.layers[:-1], model.model.norm):
        module.register_forward_hook(hook)
    ids = torch.randint(1, V, (2, 7), generator=torch.Generator().manual_seed(3))
    out = model(ids, output_hidden_states=True, use_cache=False)
    assert len(out.hidden_states) == len(seen) == 3
    for got, hooked in zip(out.hidden_states, seen, strict=True):
        assert torch.equal(got, hooked)
    gen = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0,
                         return_dict_in_generate=True, output_hidden_states=True)
    assert [tuple(step[-1].shape) for step in gen.hidden_states] == [(2, 7, 32), (2, 1, 32),
                                                                      (2, 1, 32)]
    plain = model(ids, output_hidden_states=False, use_cache=False)
    assert plain.hidden_states is None and plain.attentions is None


@torch.no_grad()
def test_attentions_sum_to_one_and_reproduce_the_output(kind):
    """Each block's probabilities [B, HQ, T, T]: causal, rows summing to 1 (stick-breaking:
    at most 1), and p @ v through the output projection gives the attention's output."""
    model = make_model(kind)
    inputs = []
    for attn in attention_modules(model):
        attn.register_forward_hook(
            lambda m, args, kwargs, out: inputs.append(
                (args[0] if args else kwargs["hidden_states"],
                 out[0] if isinstance(out, tuple) else out)), with_kwargs=True)
    ids = torch.randint(1, V, (2, 7), generator=torch.Generator().manual_seed(4))
    out = model(ids, output_attentions=True, use_cache=False)
    assert len(out.attentions) == 2
    for p, attn, (h, y) in zip(out.attentions, attention_modules(model), inputs, strict=True):
        assert p.shape == (2, 4, 7, 7)
        assert torch.all(p.triu(1) == 0)
        total = p.sum(-1)
        if kind == "sba":
            assert torch.all(total <= 1 + 1e-12) and torch.all(total[..., 1:] > 0)
        else:  # Llama's eager softmax runs in float32, ours in float64
            atol = 1e-6 if kind == "llama" else 1e-12
            torch.testing.assert_close(total, torch.ones_like(total), rtol=0, atol=atol)
        v, project = values_and_output(kind, attn, h)
        vq = v.repeat_interleave(2, dim=2).transpose(1, 2)  # [B, HQ, T, D]
        o = (p.to(v.dtype) @ vq).transpose(1, 2)  # [B, T, HQ, D]
        torch.testing.assert_close(project(o), y, rtol=1e-9, atol=1e-11)


@torch.no_grad()
def test_decode_step_attentions_equal_the_full_forwards(kind):
    """generate(output_attentions=True): each step's probabilities [B, HQ, 1, n] are the
    last row of the full forward's over the sequence so far."""
    model = make_model(kind)
    ids = torch.randint(1, V, (1, 6), generator=torch.Generator().manual_seed(5))
    gen = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0,
                         return_dict_in_generate=True, output_attentions=True)
    full = model(gen.sequences[:, :-1], output_attentions=True, use_cache=False).attentions
    # transformers' eager Llama attention takes its softmax in float32 and casts back, so
    # even a float64 Llama's probabilities carry float32 rounding (a row alone and within
    # the full matrix round apart); every PaTH model's stay float64
    tol = {"rtol": 4e-6, "atol": 5e-7} if kind == "llama" else {"rtol": 1e-9, "atol": 1e-12}
    for s, step in enumerate(gen.attentions[1:], start=1):
        n = 6 + s
        for p, ref in zip(step, full, strict=True):
            assert p.shape == (1, 4, 1, n)
            torch.testing.assert_close(p[:, :, 0], ref[:, :, n - 1, :n], **tol)


# ------------------------------------------------------------------------ inputs


@torch.no_grad()
def test_inputs_embeds_equal_ids(kind):
    model = make_model(kind)
    ids = torch.randint(1, V, (2, 7), generator=torch.Generator().manual_seed(6))
    embeds = model.get_input_embeddings()(ids)
    assert torch.equal(model(inputs_embeds=embeds, use_cache=False).logits,
                       model(ids, use_cache=False).logits)
    from_embeds = model.generate(inputs_embeds=embeds, max_new_tokens=3, do_sample=False,
                                 pad_token_id=0)
    assert torch.equal(from_embeds, greedy(model, ids, 3)[:, 7:])


def test_shift_labels_change_the_loss_as_for_llama(kind):
    """With labels, shift_labels are the targets of each position, unshifted."""
    model = make_model(kind)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(1, V, (2, 8), generator=g)
    shifted = torch.randint(0, V, (2, 8), generator=g)
    shifted[0, :3] = -100
    out = model(ids, labels=ids, shift_labels=shifted, use_cache=False)
    expected = torch.nn.functional.cross_entropy(out.logits.reshape(-1, V), shifted.reshape(-1))
    torch.testing.assert_close(out.loss.double(), expected, rtol=1e-6, atol=0)  # Llama: fp32
    plain = model(ids, labels=ids, use_cache=False).loss
    assert not torch.isclose(plain, out.loss)


# ------------------------------------------------------------- gradient checkpointing


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_checkpointing_equals_plain_backward(kind, reentrant, monkeypatch):
    """activation_checkpointing_enable(kwargs): every block runs through transformers'
    checkpoint function with those kwargs, and loss and gradients equal a plain backward
    (masked tokens included: a hole and right padding)."""
    calls = []
    checkpoint = transformers.modeling_utils.checkpoint

    def spy(function, *args, **kwargs):
        calls.append(kwargs.get("use_reentrant"))
        return checkpoint(function, *args, **kwargs)

    monkeypatch.setattr(transformers.modeling_utils, "checkpoint", spy)
    model = make_model(kind).train()
    ids = torch.randint(1, V, (2, 9), generator=torch.Generator().manual_seed(8))
    mask = torch.ones_like(ids)
    mask[0, 7:] = mask[1, 4] = 0
    runs = []
    for enable in (False, True):
        if enable:
            model.activation_checkpointing_enable({"use_reentrant": reentrant})
        model.zero_grad()
        loss = model(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        loss.backward()
        runs.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    assert calls == [reentrant, reentrant]  # once per block, in the checkpointed run
    torch.testing.assert_close(runs[0][0], runs[1][0], rtol=0, atol=0)
    for x, y in zip(runs[0][1], runs[1][1], strict=True):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-14)


def test_trainer_gradient_checkpointing_flag(tmp_path, monkeypatch):
    """Trainer(gradient_checkpointing=True, gradient_checkpointing_kwargs=...) reaches the
    blocks: one training step runs each block through the checkpoint with those kwargs."""
    from transformers import Trainer, TrainingArguments

    calls = []
    checkpoint = transformers.modeling_utils.checkpoint
    monkeypatch.setattr(transformers.modeling_utils, "checkpoint", functools.partial(
        lambda f, *a, **k: (calls.append(k.get("use_reentrant")), checkpoint(f, *a, **k))[1]))
    model = make_model("path").float()
    ids = torch.randint(1, V, (4, 8), generator=torch.Generator().manual_seed(9))
    data = [dict(input_ids=row, labels=row) for row in ids]
    with pytest.warns(FutureWarning, match="gradient_checkpointing"):
        args = TrainingArguments(output_dir=str(tmp_path), max_steps=1,
                                 per_device_train_batch_size=4, gradient_checkpointing=True,
                                 gradient_checkpointing_kwargs={"use_reentrant": True},
                                 report_to=[], use_cpu=True, save_strategy="no")
    Trainer(model=model, args=args, train_dataset=data).train()
    assert calls == [True, True]
