"""Hugging Face models over pathattn's decoder (`pathattn.models.lm`): `PaTHModel` (hidden
states, AutoModel) and `PaTHForCausalLM` (LM head, AutoModelForCausalLM, generate()).

The blocks are `pathattn.models.lm.Block` (as transformers' checkpointable layer,
`PaTHDecoderLayer`), so a `PaTHForCausalLM` computes exactly what a `PaTHLM` of
`config.to_model_config()` computes; parameter names follow LLaMA's layout
(`model.embed_tokens`, `model.layers.N.attn...`, `model.norm`, `lm_head`).

Which path a forward call takes (training, prefill and decoding stay separate functions;
this module only dispatches):

    cache holds a prefill                  decode: the m new tokens after the cache
    no cache, use_cache                    prefill (the cache is returned)
    otherwise                              training path (cu_seqlens packing, gradient
                                           checkpointing through `PaTHDecoderLayer`)

use_cache defaults to config.use_cache in eval mode and False in training mode or with
cu_seqlens (a packed batch is scored, not continued). attention_mask (1 = token, 0 =
masked) may hold zeros anywhere: a masked token is removed from its row (no key, no
transform, no position), in every path; a cache needs the last position of every row to
be a token (left padding). position_ids are accepted and ignored: PaTH has no position
ids, and the RoPE baseline counts the real tokens of each row. The cache argument is
`cache` (transformers 5); `past_key_values` is accepted too, without a warning.

Labels follow the Hugging Face convention: `labels` has the inputs' shape and is shifted
inside the model (position t predicts labels[t + 1]), or `shift_labels` gives the targets
already shifted; -100 is not scored. For a packed batch (cu_seqlens) set the label of each
sequence's first token to -100, so that no prediction crosses a boundary.
output_hidden_states and output_attentions follow transformers' layout; the attentions
come from an exact float64 path beside the forward (its cost: docs/hf_contract.md).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from ..models.lm import IGNORE_INDEX, Block, DecoderTrunk, PaTHLM, Trace, check_ids
from ..nn.norm import RMSNorm
from ..nn.rope import RotaryEmbedding
from ..nn.short_conv import ShortConv
from ..ops.common.padding import check_attention_mask
from ..utils.value_checks import checks_on_host, mask_on_device
from .cache import PaTHGenerationCache
from .configuration import PaTHConfig

__all__ = ["PaTHPreTrainedModel", "PaTHModel", "PaTHForCausalLM", "PaTHDecoderLayer",
           "check_mask"]

# transformers' packing arguments (DataCollatorWithFlattening): refused with a pointer
_PACKING_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
                   "seq_idx")


def check_mask(attention_mask, B: int, T: int, device) -> torch.Tensor | None:
    """attention_mask [B, T] of 0 / 1 (zeros anywhere: masked tokens) -> bool [B, T], or
    None when absent or all ones. ValueError naming attention_mask for a wrong shape,
    dtype or device, values other than 0 / 1, or a row without any token."""
    mask = check_attention_mask(attention_mask, B, T, device)
    if mask is not None and not bool(mask.any(1).all()):
        raise ValueError("attention_mask: every row needs at least one token (a 1)")
    return mask


def refuse_unknown(kwargs: dict, owner: str) -> None:
    """ValueError naming every keyword argument in kwargs that is not None (the arguments a
    forward does not know); a silently ignored argument could change what the caller gets."""
    unknown = sorted(name for name, value in kwargs.items() if value is not None)
    if not unknown:
        return
    hint = ""
    if any(name in _PACKING_KWARGS for name in unknown):
        hint = " (packed sequences: pass cu_seqlens, the boundaries [N + 1], instead)"
    raise ValueError(f"{owner} got unknown keyword argument(s) {unknown}{hint}")


def one_cache(cache, past_key_values):
    """The cache given as `cache` or under its older name `past_key_values` (one of them)."""
    if past_key_values is None:
        return cache
    if cache is not None and cache is not past_key_values:
        raise ValueError("cache and past_key_values name the same argument; give one of "
                         "them, not two different caches")
    return past_key_values


class PaTHDecoderLayer(Block, GradientCheckpointingLayer):
    """`pathattn.models.lm.Block` as transformers' checkpointable layer: after
    `gradient_checkpointing_enable(gradient_checkpointing_kwargs)` (or Trainer's
    `gradient_checkpointing=True`), the training forward of each block runs through the
    checkpoint function transformers installs, with its kwargs (use_reentrant, ...), in
    training mode with gradients on."""


class PaTHPreTrainedModel(PreTrainedModel):
    """Weights init and HF plumbing shared by `PaTHModel` and `PaTHForCausalLM`."""

    config_class = PaTHConfig
    config: PaTHConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["PaTHDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values"]

    @classmethod
    def register_for_auto_class(cls, auto_class: str = "AutoModel") -> None:
        """Nothing to do: saving the config writes pathattn's auto_map and modules
        (`PaTHConfig.save_pretrained`); transformers' version would copy this package's
        source into the next folder saved."""

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
    """The decoder without its LM head: input_ids [B, T] (or inputs_embeds) ->
    last_hidden_state [B, T, hidden] (after the final RMSNorm), plus the cache (module
    docstring)."""

    def __init__(self, config: PaTHConfig):
        super().__init__(config)
        mc = config.to_model_config()
        self.embed_tokens = nn.Embedding(mc.vocab_size, mc.hidden_size)
        self.layers = nn.ModuleList(PaTHDecoderLayer(mc) for _ in range(mc.num_hidden_layers))
        self.norm = RMSNorm(mc.hidden_size, mc.rms_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def forward(self, input_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None,
                cache: PaTHGenerationCache | None = None,
                use_cache: bool | None = None, cu_seqlens: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                output_hidden_states: bool | None = None,
                output_attentions: bool | None = None, return_dict: bool | None = None,
                past_key_values: PaTHGenerationCache | None = None,
                **kwargs) -> BaseModelOutputWithPast | tuple:
        """Args (module docstring for the paths):
            input_ids: int [B, T] token ids in [0, vocab_size); or
            inputs_embeds: [B, T, hidden] in the embeddings' dtype (one of the two).
            attention_mask: None or [B, T] (decoding: [B, past + new]) 0 / 1.
            cache: None, or a PaTHGenerationCache (empty: filled by this call);
                past_key_values: the same, under its older name.
            use_cache: return a cache (default: config.use_cache when not training and no
                cu_seqlens is given).
            cu_seqlens: int [N + 1] packed sequence boundaries (B == 1), training path only.
            position_ids: ignored.
            output_hidden_states, output_attentions: default config's; the attentions of
                a decode step need a cache whose prefill reported them too.
        Unknown keyword arguments raise ValueError naming them. Returns
        BaseModelOutputWithPast(last_hidden_state [B, T, hidden], cache, hidden_states:
        L + 1 tensors [B, T, hidden] (embeddings, block outputs, the last one normed),
        attentions: L tensors [B, HQ, T, past + T]).
        """
        refuse_unknown(kwargs, "PaTHModel.forward")
        cache = one_cache(cache, past_key_values)
        if cache is not None and not isinstance(cache, PaTHGenerationCache):
            raise ValueError(f"cache must be a PaTHGenerationCache (returned by this model), "
                             f"got {type(cache).__name__}")
        decoding = cache is not None and not cache.is_empty
        x = self.embeddings(input_ids, inputs_embeds, per_token=decoding)  # [B, T, hidden]
        trace = Trace(self._flag(output_hidden_states, "output_hidden_states"),
                      self._flag(output_attentions, "output_attentions"))
        if decoding:
            hidden = self._decode(x, attention_mask, cache, cu_seqlens, trace)
        else:
            mask = check_mask(attention_mask, x.shape[0], x.shape[1], x.device)
            hidden, cache = self._encode(x, mask, cache, use_cache, cu_seqlens, trace)
        states = None
        if trace.hidden_states is not None:  # the last one normed, as transformers' models
            states = tuple(trace.hidden_states[:-1]) + (hidden,)
        out = BaseModelOutputWithPast(
            last_hidden_state=hidden, cache=cache, hidden_states=states,
            attentions=None if trace.attentions is None else tuple(trace.attentions))
        return out if return_dict is not False else out.to_tuple()

    def embeddings(self, input_ids: torch.Tensor | None,
                   inputs_embeds: torch.Tensor | None, per_token: bool = False
                   ) -> torch.Tensor:
        """The trunk's input x [B, T, hidden]: embed_tokens(input_ids), or inputs_embeds
        as given. ValueError unless exactly one is given, with its shape and dtype.
        per_token (a decode step): the ids' range is checked as `check_ids` per_token does
        (on the device on a GPU)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids [B, T] and inputs_embeds "
                             "[B, T, hidden]")
        if inputs_embeds is None:
            check_ids("input_ids", input_ids, self.config.vocab_size, per_token=per_token)
            return self.embed_tokens(input_ids)
        weight = self.embed_tokens.weight
        if not isinstance(inputs_embeds, torch.Tensor) or inputs_embeds.ndim != 3 or (
                inputs_embeds.shape[1] == 0 or inputs_embeds.shape[2] != weight.shape[1]):
            got = tuple(inputs_embeds.shape) if isinstance(inputs_embeds, torch.Tensor) else \
                type(inputs_embeds).__name__
            raise ValueError(f"inputs_embeds must be a tensor [B, T, hidden={weight.shape[1]}] "
                             f"with T >= 1, got {got}")
        if inputs_embeds.dtype != weight.dtype or inputs_embeds.device != weight.device:
            raise ValueError(f"inputs_embeds must have the embeddings' dtype and device "
                             f"({weight.dtype}, {weight.device}), got ({inputs_embeds.dtype}, "
                             f"{inputs_embeds.device})")
        return inputs_embeds

    def _flag(self, value, name: str) -> bool:
        """An output_* argument: None takes the config's value."""
        value = getattr(self.config, name, False) if value is None else value
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be a bool or None, got {value!r}")
        return value

    def _decode(self, x, attention_mask, cache: PaTHGenerationCache, cu_seqlens, trace: Trace):
        """m new tokens x [B, m, hidden] after a filled cache -> hidden [B, m, hidden]."""
        if cu_seqlens is not None:
            raise ValueError("cu_seqlens applies to the training path, not to decoding")
        B, m = x.shape[:2]
        n = len(cache)
        step_mask = None
        if attention_mask is not None:
            if not isinstance(attention_mask, torch.Tensor) or tuple(
                    attention_mask.shape) != (B, n + m):
                raise ValueError(f"attention_mask must have shape [B, past + new] = "
                                 f"[{B}, {n + m}] when decoding after {n} cached positions")
            if checks_on_host(x.device):
                mask = check_mask(attention_mask, B, n + m, x.device)
                step_mask = None if mask is None else mask[:, n:]  # old columns are cached
            else:  # the new columns only (the old ones are cached), checked by the device
                step_mask = mask_on_device(attention_mask[:, n:], B, m, x.device)
        if trace.attentions is not None and not cache.is_croppable:
            raise ValueError("output_attentions while decoding needs a cache whose prefill "
                             "kept its inputs: prefill with output_attentions=True (generate() "
                             "does) or call cache.activate_past_recording() before it")
        return self._decode_hidden(x, cache.model_cache, step_mask, trace)

    def _encode(self, x, mask, cache, use_cache, cu_seqlens, trace: Trace):
        """A whole sequence x [B, T, hidden] -> (hidden [B, T, hidden], cache or None)."""
        default_cache = self.config.use_cache and not self.training and cu_seqlens is None
        want_cache = cache is not None or (use_cache if use_cache is not None else default_cache)
        if want_cache and mask is not None and not bool(mask[:, -1].all()):
            if use_cache or cache is not None:
                raise ValueError("attention_mask: a row ends with a masked token, but a cache "
                                 "continues after the last position; pad on the left for "
                                 "generation (tokenizer.padding_side = 'left')")
            want_cache = False  # a scoring pass over right-padded rows: no cache
        if not want_cache:
            return self._hidden(x, cu_seqlens, mask, trace), None
        if cu_seqlens is not None:
            raise ValueError("cu_seqlens applies to the training path only (no cache)")
        history = trace.attentions is not None or (cache is not None and cache.record_past)
        hidden, model_cache = self._prefill_hidden(x, mask, history, trace)
        cache = PaTHGenerationCache() if cache is None else cache
        cache.model_cache = model_cache
        return hidden, cache


class PaTHForCausalLM(PaTHPreTrainedModel, GenerationMixin):
    """`PaTHModel` plus the LM head (tied to the embedding when
    config.tie_word_embeddings). Works with generate() (greedy, sampling, beam search,
    assisted decoding and prompt lookup, from input_ids or inputs_embeds, left padding or
    masked tokens anywhere), save_pretrained / from_pretrained (safetensors), Trainer and
    gradient checkpointing (`PaTHDecoderLayer`)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    accepts_loss_kwargs = True  # Trainer passes num_items_in_batch

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
                cache: PaTHGenerationCache | None = None,
                labels: torch.Tensor | None = None, use_cache: bool | None = None,
                cu_seqlens: torch.Tensor | None = None, logits_to_keep: int = 0,
                inputs_embeds: torch.Tensor | None = None,
                shift_labels: torch.Tensor | None = None,
                num_items_in_batch: int | torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                output_hidden_states: bool | None = None,
                output_attentions: bool | None = None, return_dict: bool | None = None,
                past_key_values: PaTHGenerationCache | None = None,
                **kwargs) -> CausalLMOutputWithPast | tuple:
        """Arguments as `PaTHModel.forward`, plus:
            labels: None or int [B, T] (HF convention, shifted inside; -100 not scored).
            shift_labels: None or int [B, T], the targets already shifted (shift_labels[t]
                is the target of position t; sequence / context parallel trainers), used
                instead of shifting labels; needs labels, as in transformers' models.
            logits_to_keep: > 0 computes logits for the last that many positions only
                (generate() passes 1); 0 = all. Ignored for the loss.
            num_items_in_batch: divide the summed loss by this count (HF Trainer's gradient
                accumulation) instead of averaging over this batch's scored labels.
        Unknown keyword arguments raise ValueError naming them. Returns
        CausalLMOutputWithPast(loss, logits [B, T', V] float, cache, hidden_states,
        attentions).
        """
        refuse_unknown(kwargs, "PaTHForCausalLM.forward")
        out = self.model(input_ids, attention_mask=attention_mask, cache=cache,
                         past_key_values=past_key_values, use_cache=use_cache,
                         cu_seqlens=cu_seqlens, inputs_embeds=inputs_embeds,
                         position_ids=position_ids, output_hidden_states=output_hidden_states,
                         output_attentions=output_attentions, return_dict=True)
        hidden = out.last_hidden_state  # [B, T, hidden]
        keep = int(logits_to_keep)
        if keep > 0 and labels is None:
            hidden = hidden[:, -keep:]
        logits = self.lm_head(hidden)  # [B, T', V]
        loss = None
        if labels is not None:
            loss = self._loss(logits, labels, shift_labels, num_items_in_batch)
        elif shift_labels is not None:
            raise ValueError("shift_labels is used with labels (the loss is computed when "
                             "labels are given, as in transformers' models); pass labels too")
        result = CausalLMOutputWithPast(loss=loss, logits=logits, cache=out.cache,
                                        hidden_states=out.hidden_states,
                                        attentions=out.attentions)
        return result if return_dict is not False else result.to_tuple()

    @staticmethod
    def _loss(logits, labels, shift_labels, num_items_in_batch) -> torch.Tensor:
        """Cross-entropy (float32, float64 for a float64 model) of logits[:, t] against
        labels[:, t + 1], or against shift_labels[:, t] when given."""
        shape = tuple(logits.shape[:2])
        for name, x in (("labels", labels), ("shift_labels", shift_labels)):
            if x is not None and (not isinstance(x, torch.Tensor) or tuple(x.shape) != shape):
                got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"{name} must be an int tensor of the inputs' shape {shape}, "
                                 f"got {got}")
        V = logits.shape[-1]
        dtype = torch.promote_types(logits.dtype, torch.float32)
        if shift_labels is None:
            pred, target = logits[:, :-1], labels[:, 1:]  # [B, T - 1, V], [B, T - 1]
        else:
            pred, target = logits, shift_labels  # [B, T, V], [B, T]
        pred = pred.to(dtype).reshape(-1, V)
        target = target.reshape(-1).long().to(logits.device)
        if num_items_in_batch is None:
            return F.cross_entropy(pred, target, ignore_index=IGNORE_INDEX)
        total = F.cross_entropy(pred, target, ignore_index=IGNORE_INDEX, reduction="sum")
        return total / num_items_in_batch

    # ---------------------------------------------------------------------- generate()

    def generate(self, *args, past_key_values: PaTHGenerationCache | None = None, **kwargs):
        """transformers' generate(); the cache may also be given under its older name
        past_key_values (without transformers' deprecation warning)."""
        if past_key_values is not None:
            kwargs["cache"] = one_cache(kwargs.get("cache"), past_key_values)
        return super().generate(*args, **kwargs)

    def _prepare_cache_for_generation(self, generation_config, model_kwargs: dict, *args,
                                      **kwargs) -> None:
        """generate()'s hook before the first step: an empty PaTHGenerationCache unless
        use_cache=False, so that assisted decoding and prompt lookup find one; an
        assistant's cache records its past (it is cropped into its prompt)."""
        super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
        if model_kwargs.get("cache") is None and generation_config.use_cache is not False:
            model_kwargs["cache"] = PaTHGenerationCache()
            if getattr(generation_config, "is_assistant", False):
                model_kwargs["cache"].activate_past_recording()
