"""Fine-tuning a pathattn export the Hugging Face way: gradient checkpointing gives plain
backward's loss and gradients, `Trainer` and PEFT LoRA (attention and MLP projections)
lower the loss and round-trip through save / load, bfloat16 and accelerate's device_map
loading, `resize_token_embeddings`."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM  # noqa: E402

from pathattn.hf import PaTHForCausalLM  # noqa: E402

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def batch(vocab: int, B: int = 4, T: int = 24, seed: int = 0) -> torch.Tensor:
    """[B, T] token ids, a BOS (0) first."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (B, T), generator=g)
    ids[:, 0] = 0
    return ids


def loss_of(model, ids: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        return float(model(input_ids=ids, labels=ids, use_cache=False).loss)


def logits_of(model, ids: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


def test_gradient_checkpointing_matches_plain_backward(tiny_export):
    """Same loss and gradients to 1e-6; the blocks' activations are recomputed in the
    backward instead of saved (far fewer tensors saved for it)."""
    model = PaTHForCausalLM.from_pretrained(tiny_export.model).train()
    ids = batch(model.config.vocab_size)

    def loss_and_grads():
        model.zero_grad()
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(1) or t,
                                                      lambda t: t):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        return loss.detach(), grads, len(saved)

    plain_loss, plain, plain_saved = loss_and_grads()
    model.gradient_checkpointing_enable()
    ckpt_loss, ckpt, ckpt_saved = loss_and_grads()
    assert ckpt_saved < plain_saved / 2, (plain_saved, ckpt_saved)
    torch.testing.assert_close(ckpt_loss, plain_loss, rtol=0, atol=1e-6)
    assert plain.keys() == ckpt.keys()
    for name, grad in plain.items():
        torch.testing.assert_close(ckpt[name], grad, rtol=0, atol=1e-6, msg=name)


def test_trainer_lowers_the_loss_and_round_trips(tiny_export, tmp_path):
    from transformers import Trainer, TrainingArguments

    model = PaTHForCausalLM.from_pretrained(tiny_export.model)
    ids = batch(model.config.vocab_size, B=8)
    before = loss_of(model, ids)
    rows = [{"input_ids": row, "labels": row} for row in ids]
    args = TrainingArguments(output_dir=str(tmp_path / "trainer"), max_steps=6,
                             per_device_train_batch_size=4, learning_rate=1e-2,
                             lr_scheduler_type="constant", gradient_checkpointing=True,
                             use_cpu=True, report_to="none", save_strategy="no",
                             logging_strategy="no", disable_tqdm=True, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=rows)
    trainer.train()
    after = loss_of(trainer.model, ids)
    assert after < before - 0.5, (before, after)
    trainer.save_model(str(tmp_path / "saved"))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    assert torch.equal(logits_of(loaded, ids), logits_of(trainer.model, ids))


def test_peft_lora_trains_merges_and_round_trips(tiny_export, tmp_path):
    peft = pytest.importorskip("peft")

    base = PaTHForCausalLM.from_pretrained(tiny_export.model)
    ids = batch(base.config.vocab_size, B=8)
    before = loss_of(base, ids)
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                             target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    model = peft.get_peft_model(base, config)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert {t for t in LORA_TARGETS if any(f".{t}.lora_A" in n for n in trainable)} == \
        set(LORA_TARGETS)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-2)
    model.train()
    for _ in range(12):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    assert loss_of(model, ids) < before - 0.1  # only the adapters train
    tuned = logits_of(model, ids)

    model.save_pretrained(tmp_path / "adapter")  # the adapter alone, over the export
    reloaded = peft.PeftModel.from_pretrained(
        PaTHForCausalLM.from_pretrained(tiny_export.model), tmp_path / "adapter")
    assert torch.equal(logits_of(reloaded, ids), tuned)

    merged = model.merge_and_unload()
    assert type(merged) is PaTHForCausalLM
    torch.testing.assert_close(logits_of(merged, ids), tuned, rtol=1e-5, atol=1e-5)
    merged.save_pretrained(tmp_path / "merged")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert torch.equal(logits_of(loaded, ids), logits_of(merged, ids))


def test_bfloat16_and_device_map_loading(tiny_export):
    """dtype=torch.bfloat16 (formerly torch_dtype) loads what casting the float32 model
    gives; device_map="auto" (accelerate's placement) puts it all on the CPU here."""
    pytest.importorskip("accelerate")
    ref = AutoModelForCausalLM.from_pretrained(tiny_export.model)
    ids = batch(ref.config.vocab_size)
    model = AutoModelForCausalLM.from_pretrained(tiny_export.model, dtype=torch.bfloat16,
                                                 device_map="auto")
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    cast = ref.to(torch.bfloat16)
    assert torch.equal(logits_of(model, ids), logits_of(cast, ids))


def test_resize_token_embeddings(tiny_export, tmp_path):
    model = PaTHForCausalLM.from_pretrained(tiny_export.model)
    V = model.config.vocab_size
    ids = batch(V)
    want = logits_of(model, ids)
    model.resize_token_embeddings(V + 8)
    assert model.config.vocab_size == V + 8
    assert model.get_input_embeddings().weight.shape[0] == V + 8
    assert model.get_output_embeddings().weight.shape[0] == V + 8
    assert torch.equal(logits_of(model, ids)[..., :V], want)
    new = torch.cat([ids, torch.full((ids.shape[0], 1), V + 5)], dim=1)  # a new token
    model.save_pretrained(tmp_path / "resized")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "resized")
    assert torch.equal(logits_of(loaded, new), logits_of(model, new))
