"""`PaTHLM`: a decoder-only language model (LLaMA-style pre-norm blocks) whose attention is
PaTH (paper section 2.2), PaTH-FoX, or a baseline (RoPE, FoX, stick-breaking), chosen by
`ModelConfig.attn_type` from the attention-type registry (`attention_types`):

    x_0 = E[input_ids]                                          token embedding [B, T, hidden]
    x_l = x_{l-1} + Attn_l(RMSNorm(x_{l-1}))
    x_l = x_l     + SwiGLU_l(RMSNorm(x_l))                      l = 1 .. num_hidden_layers
    logits = W_head RMSNorm(x_L)                                W_head = E when tied

(the paper's language models follow the LLaMA recipe, section 4 "Experimental setup").
Training (`forward`, optionally packed with cu_seqlens), prompt processing (`prefill`) and
incremental decoding (`decode`) are separate methods. A token with attention mask 0
(anywhere in its row: left padding, right padding or a hole) is removed from its row in
every path: no key, no transform, no position, as if it were deleted.

Labels convention: `labels[b, t]` is the target of position t, already aligned (the
next token for language modelling), -100 = not scored. This is the convention of
`pathattn.tasks` (tokens, targets) batches and it keeps packed batches correct (no shift
crosses a cu_seqlens boundary: set the last label of each packed sequence to -100). The
loss is the mean cross-entropy over the scored positions of the whole batch (NaN when none
is scored), so packed and separate batches agree on the *sum* loss * num_scored.
"""

from __future__ import annotations

import numbers

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..nn.norm import RMSNorm
from ..nn.path_attention import init_forget_gate_bias
from ..ops.common.padding import MaskedRows
from ..ops.common.validation import assert_in_graph
from ..utils.value_checks import assert_on_device, checks_on_host
from .attention_types import get_attention_type
from .config import ModelConfig

__all__ = ["PaTHLM", "DecoderTrunk", "ModelCache", "RMSNorm", "SwiGLU", "Block", "Trace",
           "IGNORE_INDEX", "check_ids"]

IGNORE_INDEX = -100


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)): x [..., hidden] -> [..., hidden], no biases."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def make_attention(config: ModelConfig) -> nn.Module:
    """The attention layer of `config.attn_type` (its registered builder), with the
    config's sizes."""
    return get_attention_type(config.attn_type).build(config)


class Block(nn.Module):
    """Pre-norm block: x + Attn(RMSNorm(x)), then + SwiGLU(RMSNorm(.)). x [B, T, hidden].
    Masks and history as the attention layer's (`PaTHAttention`)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = make_attention(config)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None
                ) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cu_seqlens)
        return x + self.mlp(self.mlp_norm(x))

    def prefill(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None,
                history: bool = False):
        """-> (x [B, T, hidden], the attention layer's cache)."""
        y, cache = self.attn.prefill(self.attn_norm(x), attention_mask, history)
        x = x + y
        return x + self.mlp(self.mlp_norm(x)), cache

    def decode(self, x: torch.Tensor, cache, mask: torch.Tensor | None = None
               ) -> torch.Tensor:
        x = x + self.attn.decode(self.attn_norm(x), cache, mask)
        return x + self.mlp(self.mlp_norm(x))

    def attention_weights(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None,
                          cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """The attention probabilities of this block's input x [B, T, hidden] (the layer's
        `attention_weights`): [B, HQ, T, T]; packed sequences (cu_seqlens, B == 1) give the
        block-diagonal matrix of each sequence's own."""
        h = self.attn_norm(x)
        if cu_seqlens is None:
            return self.attn.attention_weights(h, attention_mask)
        bounds = [int(c) for c in cu_seqlens.tolist()]
        p = None
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            if b > a:
                part = self.attn.attention_weights(h[:, a:b])  # [1, HQ, b - a, b - a]
                if p is None:
                    p = part.new_zeros(1, part.shape[1], x.shape[1], x.shape[1])
                p[:, :, a:b, a:b] = part
        return p

    def step_attention_weights(self, x: torch.Tensor, cache, mask: torch.Tensor | None = None
                               ) -> torch.Tensor:
        """After `decode(x, cache, mask)` (x its input): [B, HQ, m, n]."""
        return self.attn.step_attention_weights(self.attn_norm(x), cache, mask)


class Trace:
    """What one pass of the decoder records besides its output (Hugging Face's
    output_hidden_states / output_attentions): `hidden_states`, the embeddings then every
    block's output ([B, T, hidden] each), and `attentions`, every block's attention
    probabilities ([B, HQ, T, n], the layer's exact path); each a list, or None when not
    asked for."""

    def __init__(self, hidden_states: bool = False, attentions: bool = False):
        self.hidden_states = [] if hidden_states else None
        self.attentions = [] if attentions else None


class ModelCache:
    """Decode state of `PaTHLM`: one attention-layer cache per block (`layers`).

    `reorder(index)` selects batch rows in every layer (beam search); `truncate(n)` keeps the
    first n positions in every layer, n >= `min_len` (the layer caches' limits: PaTH and
    FoX caches go back to the start of their pending window, or anywhere when prefilled with
    history; RoPE and SBA caches anywhere). Every layer has the same type and length, so an
    out-of-range n is rejected by the first layer before any layer changes. `key_mask`
    [B, n]: False at masked positions.
    """

    def __init__(self, layers: list):
        self.layers = list(layers)

    def __len__(self) -> int:
        return len(self.layers[0])

    @property
    def seq_len(self) -> int:
        """Positions held (prompt length including masked tokens, plus decoded tokens)."""
        return len(self)

    @property
    def key_mask(self) -> torch.Tensor:
        return self.layers[0].key_mask

    @property
    def min_len(self) -> int:
        """Smallest length `truncate` accepts."""
        return max(cache.min_len for cache in self.layers)

    def reorder(self, index: torch.Tensor) -> None:
        """Row b becomes old row index[b] (index [B'] int32 / int64), in place."""
        for cache in self.layers:
            cache.reorder(index)

    def truncate(self, new_len: int) -> None:
        """Keep the first new_len positions, in place."""
        for cache in self.layers:
            cache.truncate(new_len)


def check_ids(name: str, ids, vocab_size: int, *, per_token: bool = False) -> None:
    """ids must be an integer tensor [B, T] (T >= 1) with values in [0, vocab_size).
    Under torch.compile the range is checked in the graph (a RuntimeError when the compiled
    code runs) instead of on the host. per_token (a decode step): the range is checked on
    the device wherever `checks_on_host` says so (a GPU: no host synchronisation per
    token, `pathattn.utils.value_checks`); the type, dtype and shape always on the host."""
    if not isinstance(ids, torch.Tensor):
        raise ValueError(f"{name} must be an integer tensor [B, T], got {type(ids).__name__}")
    if ids.dtype == torch.bool or ids.dtype.is_floating_point or ids.dtype.is_complex:
        raise ValueError(f"{name} must be an integer tensor (int64 / int32), got {ids.dtype}")
    if ids.ndim != 2 or ids.shape[1] == 0:
        raise ValueError(f"{name} must have shape [B, T] with T >= 1, got "
                         f"{tuple(ids.shape)}")
    message = f"{name}: ids must lie in [0, vocab_size={vocab_size})"
    if torch.compiler.is_compiling():  # checked in the graph, no host read
        assert_in_graph(((ids >= 0) & (ids < vocab_size)).all(), message)
        return
    if per_token and not checks_on_host(ids.device):  # checked by the device, no host read
        assert_on_device(((ids >= 0) & (ids < vocab_size)).all(), message)
        return
    if ids.numel():
        lo, hi = torch.stack(torch.aminmax(ids)).tolist()  # one pass, one host read
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"{message}, got min {lo}, max {hi}")


def _check_labels(labels, input_ids: torch.Tensor, vocab_size: int) -> None:
    """labels: integer tensor of input_ids' shape, values in [0, V) or IGNORE_INDEX."""
    if not isinstance(labels, torch.Tensor) or labels.dtype == torch.bool or (
            labels.dtype.is_floating_point or labels.dtype.is_complex):
        got = labels.dtype if isinstance(labels, torch.Tensor) else type(labels).__name__
        raise ValueError(f"labels must be an integer tensor [B, T], got {got}")
    if labels.shape != input_ids.shape:
        raise ValueError(f"labels must have input_ids' shape {tuple(input_ids.shape)}, got "
                         f"{tuple(labels.shape)}")
    bad = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= vocab_size))
    if torch.compiler.is_compiling():  # checked in the graph, no host read
        assert_in_graph(~bad.any(), f"labels must lie in [0, vocab_size={vocab_size}) or "
                        f"be {IGNORE_INDEX} (not scored)")
    elif bool(bad.any()):
        raise ValueError(f"labels must lie in [0, vocab_size={vocab_size}) or be "
                         f"{IGNORE_INDEX} (not scored)")


class DecoderTrunk:
    """The block stack of a decoder, shared by `PaTHLM` and the Hugging Face adapter
    (`pathattn.hf`). The host module has `embed_tokens` (nn.Embedding), `layers`
    (ModuleList of `Block`) and `norm` (RMSNorm). Each method takes the embeddings x
    [B, T, hidden] and returns the final-normed hidden states [B, T, hidden]; `trace`
    (a `Trace`) collects hidden states and attention probabilities on request."""

    def _run_block(self, block: Block, x: torch.Tensor, cu_seqlens: torch.Tensor | None
                   ) -> torch.Tensor:
        """One block of the training path (a host may checkpoint it)."""
        return block(x, cu_seqlens)

    def _hidden(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, trace: Trace | None = None
                ) -> torch.Tensor:
        """Training path. attention_mask: None or bool [B, T] with zeros anywhere: the rows'
        real tokens then run as packed sequences (`MaskedRows`), so every block runs its
        training forward; outputs at masked positions are zero."""
        rows = None
        if attention_mask is not None:
            if cu_seqlens is not None:
                raise ValueError("cu_seqlens and an attention_mask with zeros cannot be "
                                 "combined: pack the sequences, or pad them, not both")
            rows = MaskedRows(attention_mask)
            x, cu_seqlens = rows.pack(x), rows.cu_seqlens  # [1, B * T, hidden]

        def view(h: torch.Tensor) -> torch.Tensor:  # back to [B, T, ...]
            return h if rows is None else rows.unpack(h)

        if trace is not None and trace.hidden_states is not None:
            trace.hidden_states.append(view(x))
        for block in self.layers:
            x_in, x = x, self._run_block(block, x, cu_seqlens)
            if trace is not None:
                self._record(trace, view(x), lambda b=block, h=x_in: b.attention_weights(
                    view(h), attention_mask, None if rows is not None else cu_seqlens))
        return view(self.norm(x))

    @staticmethod
    def _record(trace: Trace | None, x: torch.Tensor, weights) -> None:
        """After a block: its output x, and its attention probabilities (weights(), only
        computed when asked for)."""
        if trace is None:
            return
        if trace.attentions is not None:
            trace.attentions.append(weights())
        if trace.hidden_states is not None:
            trace.hidden_states.append(x)

    def _prefill_hidden(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None,
                        history: bool = False, trace: Trace | None = None
                        ) -> tuple[torch.Tensor, ModelCache]:
        """Prompts x [B, T, hidden] with an optional mask [B, T] (zeros anywhere) ->
        ([B, T, hidden], cache); history: the layers keep every position's raw inputs."""
        caches = []
        if trace is not None and trace.hidden_states is not None:
            trace.hidden_states.append(x)
        for block in self.layers:
            x_in, (x, cache) = x, block.prefill(x, attention_mask, history)
            caches.append(cache)
            self._record(trace, x, lambda b=block, h=x_in: b.attention_weights(
                h, attention_mask))
        return self.norm(x), ModelCache(caches)

    def _decode_hidden(self, x: torch.Tensor, cache: ModelCache,
                       mask: torch.Tensor | None = None, trace: Trace | None = None
                       ) -> torch.Tensor:
        """m new tokens x [B, m, hidden] after `cache` (updated in place) -> [B, m, hidden];
        mask: None or [B, m] (0 = masked token)."""
        if not isinstance(cache, ModelCache) or len(cache.layers) != len(self.layers):
            raise ValueError(f"cache must be the ModelCache of this model's prefill "
                             f"({len(self.layers)} layers), got {type(cache).__name__}")
        if trace is not None and trace.hidden_states is not None:
            trace.hidden_states.append(x)
        for block, layer_cache in zip(self.layers, cache.layers, strict=True):
            x_in, x = x, block.decode(x, layer_cache, mask)
            self._record(trace, x, lambda b=block, h=x_in, c=layer_cache:
                         b.step_attention_weights(h, c, mask))
        return self.norm(x)


class PaTHLM(DecoderTrunk, nn.Module):
    """Decoder-only LM of `config` (module docstring). Parameters: `embed_tokens`,
    `layers` (Blocks), `norm`, `lm_head` (tied to `embed_tokens` when
    `config.tie_word_embeddings`).

    Set `model.gradient_checkpointing = True` to recompute each block in the backward of
    `forward` (torch.utils.checkpoint, non-reentrant) instead of storing its activations.
    """

    def _run_block(self, block: Block, x: torch.Tensor, cu_seqlens: torch.Tensor | None
                   ) -> torch.Tensor:
        if self.gradient_checkpointing and torch.is_grad_enabled():
            return checkpoint(block, x, cu_seqlens, use_reentrant=False)
        return block(x, cu_seqlens)

    def __init__(self, config: ModelConfig):
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise ValueError(f"config must be a ModelConfig, got {type(config).__name__}")
        self.config = config.validate()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.gradient_checkpointing = False
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Linear and embedding weights ~ N(0, initializer_range), biases 0, norm weights 1;
        forget-gate biases U(1, 5) (the layers' gate init, gates start near 1); the short
        convolutions keep their own (nn.Conv1d) init."""
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
        for block in self.layers:
            g_proj = getattr(block.attn, "g_proj", None)
            if g_proj is not None:
                init_forget_gate_bias(g_proj.bias)

    def num_parameters(self) -> int:
        """Number of distinct parameters (a tied head counted once)."""
        return sum(p.numel() for p in self.parameters())


    # ------------------------------------------------------------------------ training

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Training path.

        Args:
            input_ids: int64 / int32 [B, T], ids in [0, vocab_size).
            labels: None or int [B, T], labels[b, t] = target of position t (already
                aligned), -100 = not scored.
            cu_seqlens: None or int [N + 1] (B == 1): packed sequences; no attention (and no
                PaTH short conv) crosses a boundary.

        Returns (logits [B, T, V] float in the parameters' dtype, loss): loss is the mean
        cross-entropy (float32 math, float64 for a float64 model) over the scored positions,
        or None without labels.
        """
        check_ids("input_ids", input_ids, self.config.vocab_size)
        if labels is not None:
            _check_labels(labels, input_ids, self.config.vocab_size)
        logits = self.lm_head(self._hidden(self.embed_tokens(input_ids), cu_seqlens))
        loss = None
        if labels is not None:
            V = logits.shape[-1]
            dtype = torch.promote_types(logits.dtype, torch.float32)
            loss = F.cross_entropy(logits.to(dtype).reshape(-1, V), labels.reshape(-1).long(),
                                   ignore_index=IGNORE_INDEX)
        return logits, loss

    # ----------------------------------------------------------------------- inference

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, ModelCache]:
        """Prompts input_ids [B, T]; attention_mask [B, T] (1 = token, 0 = masked token,
        anywhere, e.g. left padding; masked ids must still lie in [0, V)). Returns (logits
        [B, T, V], ModelCache): each row's logits at its real positions equal `forward` on
        its real tokens alone; logits at masked positions are meaningless."""
        check_ids("input_ids", input_ids, self.config.vocab_size)
        hidden, cache = self._prefill_hidden(self.embed_tokens(input_ids), attention_mask)
        return self.lm_head(hidden), cache  # [B, T, V]

    @torch.no_grad()
    def decode(self, input_ids: torch.Tensor, cache: ModelCache) -> torch.Tensor:
        """m >= 1 new tokens input_ids [B, m] after `cache` (updated in place). Returns
        logits [B, m, V]: the last m rows of `forward` on the whole sequence. No gradients.
        The ids' range is checked without a host read on a GPU (`check_ids` per_token)."""
        check_ids("input_ids", input_ids, self.config.vocab_size, per_token=True)
        return self._decode_logits(input_ids, cache)

    def _decode_logits(self, input_ids: torch.Tensor, cache: ModelCache) -> torch.Tensor:
        """`decode` without the value check (ids the model chose itself)."""
        return self.lm_head(self._decode_hidden(self.embed_tokens(input_ids), cache))

    @torch.no_grad()
    def generate_greedy(self, input_ids: torch.Tensor, max_new_tokens: int,
                        attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Greedy decoding: prefill the prompts input_ids [B, T] (attention_mask as
        `prefill`, left padding), then one decode step per token. Returns only the new
        tokens, int64 [B, max_new_tokens]."""
        if isinstance(max_new_tokens, bool) or not isinstance(
                max_new_tokens, numbers.Integral) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be a non-negative int, got "
                             f"{max_new_tokens!r}")
        logits, cache = self.prefill(input_ids, attention_mask)
        out = []
        for i in range(int(max_new_tokens)):
            if i:  # ids from argmax over the vocabulary: no value check needed
                logits = self._decode_logits(out[-1], cache)
            out.append(logits[:, -1].argmax(-1, keepdim=True))  # [B, 1]
        if not out:
            return input_ids.new_zeros(input_ids.shape[0], 0, dtype=torch.long)
        return torch.cat(out, dim=1)
