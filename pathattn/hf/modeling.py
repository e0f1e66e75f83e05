"""Hugging Face models over pathattn's decoder (`pathattn.models.lm`): `PaTHModel` (hidden
states, AutoModel) and `PaTHForCausalLM` (LM head, AutoModelForCausalLM, generate()).

The blocks are `pathattn.models.lm.Block`, so a `PaTHForCausalLM` computes exactly what a
`PaTHLM` of `config.to_model_config()` computes; parameter names follow LLaMA's layout
(`model.embed_tokens`, `model.layers.N.attn...`, `model.norm`, `lm_head`).

Which path a forward call takes (training, prefill and decoding stay
separate functions; this module only dispatches):

    past_key_values holds a prefill          decode: the m new tokens after the cache
    no cache, use_cache or left padding      prefill (left padding through attention_mask)
    otherwise                                training path (cu_seqlens packing, gradient
                                             checkpointing); right padding needs no mask

use_cache defaults to config.use_cache in eval mode and False in training mode or with
cu_seqlens (a packed batch is scored, not continued).
attention_mask (1 = token, 0 = padding) may pad on the left (generation) or on the right
(training batches); padding inside a row is rejected. position_ids are accepted and
ignored: PaTH has no position ids, and the RoPE baseline counts positions from the first
real token of each row.

Labels follow the Hugging Face convention: `labels` has input_ids' shape and is shifted
inside the model (position t predicts labels[t + 1]); -100 is not scored. For a packed
batch (cu_seqlens) set the label of each sequence's first token to -100, so that no
prediction crosses a boundary.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from ..models.lm import IGNORE_INDEX, Block, DecoderTrunk, PaTHLM, check_ids
from ..nn.norm import RMSNorm
from ..nn.rope import RotaryEmbedding
from ..nn.short_conv import ShortConv
from .cache import PaTHGenerationCache
from .configuration import PaTHConfig

__all__ = ["PaTHPreTrainedModel", "PaTHModel", "PaTHForCausalLM", "padding_side"]


def padding_side(attention_mask: torch.Tensor | None, B: int, T: int) -> str:
    """"none", "left" or "right" for an attention_mask [B, T] (1 / True = token, 0 =
    padding); None is "none". Rows must be a run of zeros then ones (left) or ones then
    zeros (right), all rows the same side, every row with a token; ValueError otherwise."""
    if attention_mask is None:
        return "none"
    if not isinstance(attention_mask, torch.Tensor) or tuple(attention_mask.shape) != (B, T):
        got = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else \
            type(attention_mask).__name__
        raise ValueError(f"attention_mask must be a tensor [B, T] = [{B}, {T}], got {got}")
    m = attention_mask.to(torch.int64)  # [B, T]
    if bool(((m != 0) & (m != 1)).any()):
        raise ValueError("attention_mask must hold 0 (padding) and 1 (token) only")
    if bool((m.sum(1) == 0).any()):
        raise ValueError("attention_mask: every row needs at least one token (a 1)")
    if bool(m.all()):
        return "none"
    steps = m[:, 1:] - m[:, :-1]  # [B, T - 1]: +1 where padding ends, -1 where it starts
    if bool((steps >= 0).all()):
        return "left"
    if bool((steps <= 0).all()):
        return "right"
    raise ValueError("attention_mask: padding must be all on the left (generation) or all on "
                     "the right (training) of every row, not inside a row")


class PaTHPreTrainedModel(PreTrainedModel):
    """Weights init and HF plumbing shared by `PaTHModel` and `PaTHForCausalLM`."""

    config_class = PaTHConfig
    config: PaTHConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["Block"]
    _skip_keys_device_placement = ["past_key_values"]

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # generate() must not build a DynamicCache: the model returns its own

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """`PaTHLM.reset_parameters`'s init, one module at a time (HF skips weights that were
        loaded): Linear / Embedding ~ N(0, initializer_range), biases 0, RMSNorm 1, short
        convolutions as nn.Conv1d, forget-gate biases U(1, 5), RoPE frequencies."""
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            init.normal_(module.weight, mean=0.0, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, RMSNorm):
            init.ones_(module.weight)
        elif isinstance(module, ShortConv):
            bound = 1 / math.sqrt(module.kernel_size)
            init.uniform_(module.weight, -bound, bound)
            if module.bias is not None:
                init.uniform_(module.bias, -bound, bound)
        elif isinstance(module, RotaryEmbedding):
            exponent = torch.arange(0, module.head_dim, 2, dtype=torch.float64) / module.head_dim
            init.copy_(module.inv_freq, module.base ** -exponent)
        g_proj = getattr(module, "g_proj", None)
        if isinstance(g_proj, nn.Linear) and g_proj.bias is not None:
            init.uniform_(g_proj.bias, 1.0, 5.0)  # gates start near 1 (FoX init)


class PaTHModel(DecoderTrunk, PaTHPreTrainedModel):
    """The decoder without its LM head: input_ids [B, T] -> last_hidden_state
    [B, T, hidden] (after the final RMSNorm), plus the cache (module docstring)."""

    def __init__(self, config: PaTHConfig):
        super().__init__(config)
        mc = config.to_model_config()
        self.embed_tokens = nn.Embedding(mc.vocab_size, mc.hidden_size)
        self.layers = nn.ModuleList(Block(mc) for _ in range(mc.num_hidden_layers))
        self.norm = RMSNorm(mc.hidden_size, mc.rms_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def forward(self, input_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None,
                past_key_values: PaTHGenerationCache | None = None,
                use_cache: bool | None = None, cu_seqlens: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, return_dict: bool | None = None,
                cache: PaTHGenerationCache | None = None,
                **kwargs) -> BaseModelOutputWithPast | tuple:
        """Args (module docstring for the paths):
            input_ids: int [B, T] token ids in [0, vocab_size).
            attention_mask: None or [B, T] 0 / 1 (left or right padding).
            past_key_values: None, or a PaTHGenerationCache (empty: filled by this call).
            use_cache: return a cache (default: config.use_cache when not training and no
                cu_seqlens is given).
            cu_seqlens: int [N + 1] packed sequence boundaries (B == 1), training path only.
            inputs_embeds: not supported (PaTH's w and beta are computed from the hidden
                states inside each layer, but the cache needs token ids): ValueError.
            position_ids: ignored.
            cache: the same as past_key_values, under the name transformers' generate()
                passes it from version 5.24 on; give one of the two.
        Returns BaseModelOutputWithPast(last_hidden_state [B, T, hidden], past_key_values).
        """
        if inputs_embeds is not None:
            raise ValueError("inputs_embeds is not supported by PaTHModel; pass input_ids")
        check_ids("input_ids", input_ids, self.config.vocab_size)
        if cache is not None:
            if past_key_values is not None and past_key_values is not cache:
                raise ValueError("past_key_values and cache name the same argument; give one "
                                 "of them, not two different caches")
            past_key_values = cache
        if past_key_values is not None and not isinstance(past_key_values, PaTHGenerationCache):
            raise ValueError(f"past_key_values must be a PaTHGenerationCache (returned by this "
                             f"model), got {type(past_key_values).__name__}")
        cache = past_key_values
        if cache is not None and not cache.is_empty:
            hidden = self._decode(input_ids, attention_mask, cache, cu_seqlens)
        else:
            hidden, cache = self._encode(input_ids, attention_mask, cache, use_cache, cu_seqlens)
        out = BaseModelOutputWithPast(last_hidden_state=hidden, past_key_values=cache)
        return out if return_dict is not False else out.to_tuple()

    def _decode(self, input_ids, attention_mask, cache: PaTHGenerationCache, cu_seqlens):
        """m new tokens after a filled cache -> hidden [B, m, hidden]."""
        if cu_seqlens is not None:
            raise ValueError("cu_seqlens applies to the training path, not to decoding")
        B, m = input_ids.shape
        n = len(cache)
        if attention_mask is not None:
            if not isinstance(attention_mask, torch.Tensor) or tuple(
                    attention_mask.shape) != (B, n + m):
                raise ValueError(f"attention_mask must have shape [B, past + new] = "
                                 f"[{B}, {n + m}] when decoding after {n} cached positions")
            if not bool(attention_mask[:, n:].all()):  # only the new columns, once each
                raise ValueError("attention_mask: decoded tokens cannot be padding (only the "
                                 "prompt may be left-padded)")
        return self._decode_hidden(input_ids, cache.model_cache)

    def _encode(self, input_ids, attention_mask, cache, use_cache, cu_seqlens):
        """A whole sequence -> (hidden [B, T, hidden], cache or None)."""
        B, T = input_ids.shape
        side = padding_side(attention_mask, B, T)
        default_cache = self.config.use_cache and not self.training and cu_seqlens is None
        want_cache = cache is not None or (use_cache if use_cache is not None else default_cache)
        if want_cache and side == "right":
            if use_cache or cache is not None:
                raise ValueError("attention_mask pads on the right; a cache for generation "
                                 "needs left padding (tokenizer.padding_side = 'left')")
            want_cache = False  # a scoring pass over right-padded rows: no cache
        if not want_cache and side != "left":  # training path, right padding needs no mask
            return self._hidden(input_ids, cu_seqlens), None
        if cu_seqlens is not None:
            raise ValueError("cu_seqlens applies to the training path only (no cache, no left "
                             "padding)")
        hidden, model_cache = self._prefill_hidden(
            input_ids, attention_mask if side == "left" else None)
        if not want_cache:
            return hidden, None
        if cache is None:
            return hidden, PaTHGenerationCache(model_cache)
        cache.model_cache = model_cache
        return hidden, cache


class PaTHForCausalLM(PaTHPreTrainedModel, GenerationMixin):
    """`PaTHModel` plus the LM head (tied to the embedding when
    config.tie_word_embeddings). Works with generate() (greedy, sampling, beam search, with
    or without attention_mask, left padding), save_pretrained / from_pretrained
    (safetensors) and gradient_checkpointing_enable()."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: PaTHConfig):
        super().__init__(config)
        self.model = PaTHModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @classmethod
    def from_pathlm(cls, lm: PaTHLM, **config_kwargs) -> PaTHForCausalLM:
        """The HF model of a trained `PaTHLM` (e.g. a `pathattn train` checkpoint): same
        config, same weights (copied), identical logits. config_kwargs: HF options such as
        eos_token_id."""
        if not isinstance(lm, PaTHLM):
            raise ValueError(f"lm must be a PaTHLM, got {type(lm).__name__}")
        model = cls(PaTHConfig.from_model_config(lm.config, **config_kwargs))
        state = {("lm_head.weight" if k == "lm_head.weight" else f"model.{k}"): v
                 for k, v in lm.state_dict().items()}
        model.load_state_dict(state, strict=True)
        ref = next(lm.parameters())
        return model.to(device=ref.device, dtype=ref.dtype)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def forward(self, input_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None,
                past_key_values: PaTHGenerationCache | None = None,
                labels: torch.Tensor | None = None, use_cache: bool | None = None,
                cu_seqlens: torch.Tensor | None = None, logits_to_keep: int = 0,
                num_items_in_batch: int | torch.Tensor | None = None,
                return_dict: bool | None = None, **kwargs) -> CausalLMOutputWithPast | tuple:
        """Arguments as `PaTHModel.forward`, plus:
            labels: None or int [B, T] (HF convention, shifted inside; -100 not scored).
            logits_to_keep: > 0 computes logits for the last that many positions only
                (generate() passes 1); 0 = all. Ignored for the loss.
            num_items_in_batch: divide the summed loss by this count (HF Trainer's gradient
                accumulation) instead of averaging over this batch's scored labels.
        Returns CausalLMOutputWithPast(loss, logits [B, T', V] float, past_key_values).
        """
        out = self.model(input_ids, attention_mask=attention_mask,
                         past_key_values=past_key_values, use_cache=use_cache,
                         cu_seqlens=cu_seqlens, return_dict=True, **kwargs)
        hidden = out.last_hidden_state  # [B, T, hidden]
        keep = int(logits_to_keep)
        if keep > 0 and labels is None:
            hidden = hidden[:, -keep:]
        logits = self.lm_head(hidden)  # [B, T', V]
        loss = None if labels is None else self._loss(logits, labels, input_ids,
                                                      num_items_in_batch)
        result = CausalLMOutputWithPast(loss=loss, logits=logits,
                                        past_key_values=out.past_key_values)
        return result if return_dict is not False else result.to_tuple()

    def _loss(self, logits, labels, input_ids, num_items_in_batch) -> torch.Tensor:
        """Cross-entropy (float32, float64 for a float64 model) of logits[:, t] against
        labels[:, t + 1]."""
        if not isinstance(labels, torch.Tensor) or labels.shape != input_ids.shape:
            got = tuple(labels.shape) if isinstance(labels, torch.Tensor) else type(labels)
            raise ValueError(f"labels must be an int tensor of input_ids' shape "
                             f"{tuple(input_ids.shape)}, got {got}")
        V = logits.shape[-1]
        dtype = torch.promote_types(logits.dtype, torch.float32)
        pred = logits[:, :-1].to(dtype).reshape(-1, V)  # [B * (T - 1), V]
        target = labels[:, 1:].reshape(-1).long().to(logits.device)  # [B * (T - 1)]
        if num_items_in_batch is None:
            return F.cross_entropy(pred, target, ignore_index=IGNORE_INDEX)
        total = F.cross_entropy(pred, target, ignore_index=IGNORE_INDEX, reduction="sum")
        return total / num_items_in_batch
