"""PaTHLM and ModelConfig: decoding paths against the training forward (greedy tokens and
logits), left-padded batches, packed batches (loss and gradients), tied embeddings,
gradient checkpointing, state_dict round trip, cache reorder / truncate, validation and
presets. Tiny float32 models (vocab 32, hidden 32, 2 layers), every attention type."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import pathattn.models.lm as lm_module
from pathattn.models import ATTN_TYPES, PRESETS, ModelCache, ModelConfig, PaTHLM

TOL = 1e-5  # relative, float32, for paths that compute the same thing


def make_model(attn_type: str, seed: int = 0, **overrides) -> PaTHLM:
    """A seeded tiny model; a larger init so that logits (and greedy tokens) vary."""
    torch.manual_seed(seed)
    cfg = ModelConfig.preset("tiny", **{"attn_type": attn_type, "initializer_range": 0.2,
                                        **overrides})
    return PaTHLM(cfg)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|."""
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def assert_rel(a: torch.Tensor, b: torch.Tensor, tol: float = TOL, msg: str = "") -> None:
    assert a.shape == b.shape, (msg, a.shape, b.shape)
    err = rel_err(a, b)
    assert err <= tol, f"{msg}: relative error {err:.3e} > {tol:.0e}"


def greedy_by_forward(model: PaTHLM, ids: torch.Tensor, n: int) -> torch.Tensor:
    """Reference greedy decoding: one full forward pass per new token. -> [B, n]."""
    seq = ids
    with torch.no_grad():
        for _ in range(n):
            logits, _ = model(seq)
            seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return seq[:, ids.shape[1]:]


def next_token_labels(ids: torch.Tensor) -> torch.Tensor:
    """labels[:, t] = ids[:, t + 1]; the last position is not scored (-100)."""
    labels = torch.full_like(ids, -100)
    labels[:, :-1] = ids[:, 1:]
    return labels


attn_types = pytest.mark.parametrize("attn_type", ATTN_TYPES, ids=str)


# ------------------------------------------------------------- decoding == forward


@attn_types
def test_greedy_prefill_decode_matches_forward(attn_type):
    model = make_model(attn_type)
    ids = torch.randint(0, 32, (2, 7))
    out = model.generate_greedy(ids, 12)
    assert out.shape == (2, 12) and out.dtype == torch.long
    assert torch.equal(out, greedy_by_forward(model, ids, 12))


@attn_types
def test_prefill_and_decode_logits_match_forward(attn_type):
    """Prefill of 9 tokens, then decode steps of 1 and 3 tokens: the logits are the rows of
    one forward pass over all 13."""
    model = make_model(attn_type)
    ids = torch.randint(0, 32, (2, 13))
    with torch.no_grad():
        ref, _ = model(ids)
        logits, cache = model.prefill(ids[:, :9])
        assert len(cache) == 9
        step1 = model.decode(ids[:, 9:10], cache)
        step3 = model.decode(ids[:, 10:], cache)
    assert len(cache) == 13
    assert_rel(logits, ref[:, :9], msg="prefill")
    assert_rel(step1, ref[:, 9:10], msg="decode m=1")
    assert_rel(step3, ref[:, 10:], msg="decode m=3")


@attn_types
def test_left_padded_batch_generates_as_alone(attn_type):
    model = make_model(attn_type)
    lengths = [5, 9, 3]
    prompts = [torch.randint(0, 32, (1, n)) for n in lengths]
    T = max(lengths)
    ids = torch.zeros(len(lengths), T, dtype=torch.long)  # pad id 0 on the left
    mask = torch.zeros(len(lengths), T, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, T - p.shape[1]:], mask[b, T - p.shape[1]:] = p[0], 1
    out = model.generate_greedy(ids, 10, attention_mask=mask)
    for b, p in enumerate(prompts):
        assert torch.equal(out[b: b + 1], model.generate_greedy(p, 10)), f"row {b}"


# ---------------------------------------------------------------------- training


def _grads(model: PaTHLM) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@attn_types
def test_packed_batch_matches_separate_sequences(attn_type):
    """cu_seqlens packing (B = 1) == each sequence alone. The loss is a mean over the scored
    positions of the batch, so compare sums: packed loss * (total scored) ==
    sum_i loss_i * scored_i, and the gradients of those sums."""
    model = make_model(attn_type)
    seqs = [torch.randint(0, 32, (1, n)) for n in (5, 9, 7)]
    labels = [next_token_labels(s) for s in seqs]  # last label of each sequence: -100
    counts = [int((y != -100).sum()) for y in labels]

    model.zero_grad()
    total = sum(model(s, y)[1] * c for s, y, c in zip(seqs, labels, counts, strict=True))
    total.backward()
    ref_grads = _grads(model)

    model.zero_grad()
    ids, lab = torch.cat(seqs, dim=1), torch.cat(labels, dim=1)  # [1, 21]
    cu_seqlens = torch.tensor([0, 5, 14, 21], dtype=torch.int32)
    logits, loss = model(ids, lab, cu_seqlens=cu_seqlens)
    packed = loss * sum(counts)
    packed.backward()

    assert_rel(packed, total, msg="summed loss")
    ref_logits = torch.cat([model(s)[0] for s in seqs], dim=1)
    assert_rel(logits, ref_logits, msg="logits")
    for name, g in _grads(model).items():
        assert_rel(g, ref_grads[name], msg=name)


@attn_types
def test_gradient_checkpointing_same_loss_and_grads(attn_type, monkeypatch):
    model = make_model(attn_type)
    ids = torch.randint(0, 32, (2, 16))
    labels = next_token_labels(ids)

    model.zero_grad()
    _, loss = model(ids, labels)
    loss.backward()
    ref_grads = _grads(model)

    calls = []

    def counting_checkpoint(*args, **kwargs):
        calls.append(1)
        return torch.utils.checkpoint.checkpoint(*args, **kwargs)

    monkeypatch.setattr(lm_module, "checkpoint", counting_checkpoint)
    model.gradient_checkpointing = True
    model.zero_grad()
    _, loss_ckpt = model(ids, labels)
    loss_ckpt.backward()
    assert len(calls) == model.config.num_hidden_layers
    assert_rel(loss_ckpt, loss, msg="loss")
    for name, g in _grads(model).items():
        assert_rel(g, ref_grads[name], msg=name)
    with torch.no_grad():  # no checkpointing without autograd
        model(ids)
    assert len(calls) == model.config.num_hidden_layers


def test_loss_is_mean_over_scored_positions():
    model = make_model("path")
    ids = torch.randint(0, 32, (2, 6))
    labels = next_token_labels(ids)
    labels[0, :3] = -100
    logits, loss = model(ids, labels)
    keep = labels != -100
    ref = torch.nn.functional.cross_entropy(logits[keep], labels[keep])
    assert_rel(loss, ref)
    assert model(ids)[1] is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_loss_dtype_follows_the_model(dtype):
    """float32 math for float32 (and lower) models, float64 for a float64 model."""
    model = make_model("path").to(dtype)
    ids = torch.randint(0, 32, (2, 6))
    logits, loss = model(ids, next_token_labels(ids))
    assert loss.dtype == dtype
    ref = torch.nn.functional.cross_entropy(logits.double().reshape(-1, logits.shape[-1]),
                                            next_token_labels(ids).reshape(-1))
    tol = 1e-6 if dtype == torch.float32 else 1e-14
    assert abs(float(loss.detach()) - float(ref.detach())) <= tol


# ---------------------------------------------------------- weights and state dict


def test_tied_embeddings_share_storage():
    model = make_model("path")
    assert model.lm_head.weight is model.embed_tokens.weight
    assert model.lm_head.weight.data_ptr() == model.embed_tokens.weight.data_ptr()
    V, C = model.config.vocab_size, model.config.hidden_size
    untied = make_model("path", tie_word_embeddings=False)
    assert untied.lm_head.weight.data_ptr() != untied.embed_tokens.weight.data_ptr()
    assert untied.num_parameters() == model.num_parameters() + V * C


def test_init():
    model = make_model("path_fox", initializer_range=0.02)
    std = model.embed_tokens.weight.std().item()
    assert 0.015 < std < 0.025
    for block in model.layers:
        assert torch.all(block.attn.beta_proj.bias == 0)
        assert torch.all((block.attn.g_proj.bias >= 1) & (block.attn.g_proj.bias <= 5))
        assert torch.all(block.attn_norm.weight == 1) and torch.all(block.mlp_norm.weight == 1)


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@attn_types
def test_state_dict_round_trip(attn_type, tie, tmp_path):
    model = make_model(attn_type, tie_word_embeddings=tie)
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)
    other = make_model(attn_type, seed=1, tie_word_embeddings=tie)
    other.load_state_dict(torch.load(path, weights_only=True))
    if tie:
        assert other.lm_head.weight is other.embed_tokens.weight
    ids = torch.randint(0, 32, (2, 11))
    with torch.no_grad():
        assert torch.equal(other(ids)[0], model(ids)[0])


# -------------------------------------------------------------------------- cache


@attn_types
def test_cache_reorder_and_truncate(attn_type):
    model = make_model(attn_type)
    ids = torch.randint(0, 32, (2, 10))
    with torch.no_grad():
        ref, _ = model(ids)
        _, cache = model.prefill(ids[:, :6])
        assert isinstance(cache, ModelCache) and len(cache.layers) == 2
        model.decode(ids[:, 6:8], cache)
        cache.truncate(7)  # drop the last token of the step
        assert len(cache) == 7
        assert_rel(model.decode(ids[:, 7:], cache), ref[:, 7:], msg="after truncate")
        cache.reorder(torch.tensor([1, 0]))
        swapped = torch.cat([ids[1:], ids[:1]])
        nxt = torch.randint(0, 32, (2, 1))
        full, _ = model(torch.cat([swapped, nxt], dim=1))
        assert_rel(model.decode(nxt, cache), full[:, -1:], msg="after reorder")


# --------------------------------------------------------------------- validation


@pytest.mark.parametrize("bad", [
    lambda ids: ids.float(),
    lambda ids: ids.bool(),
    lambda ids: ids[0],
    lambda ids: ids[:, :, None],
    lambda ids: ids[:, :0],
    lambda ids: ids + 32,
    lambda ids: ids.index_fill(1, torch.tensor([0]), -1),
], ids=["float", "bool", "rank1", "rank3", "empty", "above_vocab", "negative"])
def test_bad_input_ids(bad):
    model = make_model("rope")
    ids = torch.randint(0, 32, (2, 5))
    _, cache = model.prefill(ids)
    calls = {"forward": model, "prefill": model.prefill,
             "decode": lambda x: model.decode(x, cache),
             "generate_greedy": lambda x: model.generate_greedy(x, 2)}
    for name, call in calls.items():
        with pytest.raises(ValueError, match="input_ids"):
            call(bad(ids))
            pytest.fail(f"{name} accepted bad input_ids")


def test_bad_labels():
    model = make_model("rope")
    ids = torch.randint(0, 32, (2, 5))
    with pytest.raises(ValueError, match="labels.*shape"):
        model(ids, ids[:, :4])
    with pytest.raises(ValueError, match="labels.*integer"):
        model(ids, ids.float())
    with pytest.raises(ValueError, match="labels.*vocab_size"):
        model(ids, ids + 32)
    with pytest.raises(ValueError, match="cache"):
        model.decode(ids[:, :1], cache=None)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate_greedy(ids, -1)
    assert model.generate_greedy(ids, 0).shape == (2, 0)


BAD_FIELDS = {
    "vocab_size": 0, "hidden_size": -4, "intermediate_size": 2.5, "num_hidden_layers": True,
    "num_attention_heads": 0, "num_key_value_heads": 3, "head_dim": 0,
    "max_position_embeddings": 0, "rms_norm_eps": 0.0, "tie_word_embeddings": 1,
    "attn_type": "alibi", "w_rank": -1, "conv_size": 0, "qk_norm": "yes", "beta_max": 2.5,
    "rope_theta": -1.0, "initializer_range": 0,
}


@pytest.mark.parametrize("field", list(BAD_FIELDS), ids=str)
def test_config_validation_names_field(field):
    with pytest.raises(ValueError, match=field):
        ModelConfig.preset("tiny", **{field: BAD_FIELDS[field]})
    cfg = ModelConfig.preset("tiny")
    setattr(cfg, field, BAD_FIELDS[field])  # validate() also catches later edits
    with pytest.raises(ValueError, match=field):
        cfg.validate()
    with pytest.raises(ValueError, match=field):
        PaTHLM(cfg)


def test_config_cross_field_checks():
    with pytest.raises(ValueError, match="head_dim"):
        ModelConfig.preset("tiny", hidden_size=30)  # 30 % 4 heads
    ModelConfig.preset("tiny", hidden_size=30, head_dim=8)
    with pytest.raises(ValueError, match="head_dim"):
        ModelConfig.preset("tiny", attn_type="rope", head_dim=7)
    ModelConfig.preset("tiny", attn_type="path", head_dim=7)


@pytest.mark.parametrize("name", list(PRESETS), ids=str)
def test_presets_and_dict_round_trip(name):
    cfg = ModelConfig.preset(name)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    over = ModelConfig.preset(name, vocab_size=7, attn_type="fox")
    assert over.vocab_size == 7 and over.attn_type == "fox"
    assert dataclasses.replace(over, vocab_size=cfg.vocab_size, attn_type=cfg.attn_type) == cfg


def test_preset_values_and_errors():
    ff = ModelConfig.preset("fflm-1l")
    assert (ff.num_hidden_layers, ff.num_attention_heads, ff.hidden_size) == (1, 2, 64)
    tiny = ModelConfig.preset("tiny")
    assert (tiny.vocab_size, tiny.hidden_size, tiny.num_hidden_layers) == (32, 32, 2)
    with pytest.raises(ValueError, match="preset"):
        ModelConfig.preset("huge")
    with pytest.raises(ValueError, match="unknown ModelConfig field"):
        ModelConfig.preset("tiny", hidden=3)
    with pytest.raises(ValueError, match="unknown ModelConfig field"):
        ModelConfig.from_dict({"vocab": 3})
    with pytest.raises(ValueError, match="config"):
        PaTHLM(tiny.to_dict())


@pytest.mark.parametrize("attn_type", ATTN_TYPES, ids=str)
def test_layer_type_follows_config(attn_type):
    from pathattn.nn import FoXAttention, PaTHAttention, RoPEAttention, SBAttention
    model = make_model(attn_type, qk_norm=True, num_key_value_heads=1)
    attn = model.layers[0].attn
    expected = {"path": PaTHAttention, "path_fox": PaTHAttention, "rope": RoPEAttention,
                "fox": FoXAttention, "sba": SBAttention}[attn_type]
    assert type(attn) is expected
    assert attn.num_kv_heads == 1 and attn.q_norm is not None
    if expected is PaTHAttention:
        assert attn.use_forget_gate == (attn_type == "path_fox") and attn.w_rank == 8
    ids = torch.randint(0, 32, (1, 6))
    assert torch.equal(model.generate_greedy(ids, 4), greedy_by_forward(model, ids, 4))
