"""Baseline attention layers with the interface of `PaTHAttention` (forward / prefill /
decode): RoPE attention (paper section 2.1, the fixed-rotation special case) and the
Forgetting Transformer's attention (FoX, PaTH-FoX paragraph of section 2.2, without PaTH):

    RoPE:  logit(i, j) = scale * (R_i q_i)^T (R_j k_j)
    FoX:   logit(i, j) = scale * k_j^T q_i + G_i - G_j,   G_i = sum_{t <= i} g_t,
           g_t = logsigmoid(W_f x_t + b_f) per query head.

FoX runs through pathattn's own op with w = 0 and beta = 0, i.e. every H_t = I: that is FoX
exactly (same gate convention: the gate term is not scaled), including prefill and decode
through `path_attn_prefill` / `path_attn_step`; it costs as much as PaTH (the UT transforms
are still computed).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops import (
    PaTHCache,
    fox_attn,
    path_attn_prefill,
    path_attn_step,
    path_attn_weights,
)
from ..ops.common.heads import expand_kv_heads
from ..ops.common.validation import batch_index
from .path_attention import (
    AttentionProjections,
    check_attention_mask,
    check_packing,
    full_precision_linear,
    gate_dtype,
    init_forget_gate_bias,
    no_autocast,
    step_mask,
)
from .rope import RotaryEmbedding

__all__ = ["RoPEAttention", "RoPECache", "FoXAttention"]


class RoPECache:
    """KV cache of `RoPEAttention`: rotated keys k [B, H, n, D], values v [B, H, n, D] and
    key_mask [B, n] (bool, False at masked tokens: no key, no position). Positions count the
    real tokens of each row. `reorder(index)` selects rows; `truncate(n)` keeps the first n
    positions (any n)."""

    min_len = 0  # truncate goes anywhere

    def __init__(self, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor):
        self.k, self.v, self.key_mask = k, v, key_mask

    def __len__(self) -> int:
        return self.k.shape[2]

    @property
    def seq_len(self) -> int:
        return self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor) -> None:
        """k, v [B, H, m, D] of the new tokens (k rotated); keep [B, m] bool."""
        self.k, self.v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        self.key_mask = torch.cat([self.key_mask, keep], dim=1)

    def reorder(self, index: torch.Tensor) -> None:
        index = batch_index(index, self.k.shape[0], self.k.device)
        self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)
        self.key_mask = self.key_mask.index_select(0, index)

    def truncate(self, new_len: int) -> None:
        if not 0 <= new_len <= len(self):
            raise ValueError(f"new_len={new_len} must lie in [0, {len(self)}]")
        self.k, self.v = self.k[:, :, :new_len], self.v[:, :, :new_len]
        self.key_mask = self.key_mask[:, :new_len]


class RoPEAttention(AttentionProjections):
    """Causal softmax attention with rotary embeddings (base `rope_base`) on the head dim.

    Args as `PaTHAttention` where meaningful: hidden_size, num_heads, num_kv_heads,
    head_dim (even), qk_norm (applied before the rotation), bias, norm_eps, o_bias;
    rope_base.
    """

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int | None = None,
                 head_dim: int | None = None, qk_norm: bool = False, bias: bool = False,
                 norm_eps: float = 1e-6, rope_base: float = 10000.0,
                 o_bias: bool | None = None):
        super().__init__(hidden_size, num_heads, num_kv_heads, head_dim, qk_norm, bias,
                         norm_eps, o_bias)
        self.rope = RotaryEmbedding(self.head_dim, rope_base)

    def _attend(self, q, k, v, allowed: torch.Tensor) -> torch.Tensor:
        """q [B, T, HQ, D]; k, v [B, H, n, D] (k rotated); allowed bool [B or 1, 1, T, n].
        Returns o [B, T, HQ, D]."""
        groups = self.num_heads // self.num_kv_heads
        k, v = expand_kv_heads(k, groups), expand_kv_heads(v, groups)  # [B, HQ, n, D]
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=allowed)
        return o.transpose(1, 2)  # [B, T, HQ, D]

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """Training path: x [B, T, hidden] -> [B, T, hidden]. cu_seqlens [N + 1] (B == 1)
        packs sequences: a block-diagonal causal mask, positions restart at each boundary."""
        self.check_input(x)
        check_packing(x, cu_seqlens)
        B, T, _ = x.shape
        q, k, v = self.qkv(x)
        pos = torch.arange(T, device=x.device)
        seg = torch.zeros_like(pos)
        if cu_seqlens is not None:
            cu = cu_seqlens.to(device=x.device, dtype=torch.long)
            seg = torch.searchsorted(cu, pos, right=True) - 1  # [T] sequence of each token
            pos = pos - cu[seg]
        allowed = (seg[:, None] == seg[None, :]) & (pos[:, None] >= pos[None, :])  # [T, T]
        q, k = self.rope(q, pos), self.rope(k, pos)
        o = self._attend(q, k.transpose(1, 2), v.transpose(1, 2), allowed[None, None])
        return self.out(o)

    def prefill(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None,
                history: bool = False) -> tuple[torch.Tensor, RoPECache]:
        """A prompt x [B, T, hidden]; attention_mask [B, T] (1 = token, 0 = masked token,
        anywhere: no key, and positions count the real tokens only, as if it were deleted).
        Returns (y [B, T, hidden], RoPECache); rows at masked positions are o_proj(0).
        history: accepted for the common interface (this cache truncates anywhere)."""
        self.check_input(x)
        B, T, _ = x.shape
        valid = self._valid(x, attention_mask)  # [B, T]
        q, k, v = self._rotated(x, valid)
        ar = torch.arange(T, device=x.device)
        causal = ar[:, None] >= ar[None, :]  # [T, T]
        # real keys only; a masked query sees itself so that its softmax is defined
        allowed = causal & (valid[:, None, :] | torch.eye(T, dtype=torch.bool,
                                                          device=x.device))  # [B, T, T]
        o = self._attend(q, k.transpose(1, 2), v.transpose(1, 2), allowed[:, None])
        o = o * valid[:, :, None, None].to(o.dtype)
        cache = RoPECache(k.transpose(1, 2).detach(), v.transpose(1, 2).detach(), valid)
        return self.out(o), cache

    @staticmethod
    def _valid(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The mask [B, T] of x's tokens as bool (all True without one)."""
        valid = check_attention_mask(x, mask)
        return torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if valid is None \
            else valid

    def _rotated(self, x: torch.Tensor, valid: torch.Tensor, before: torch.Tensor | None = None):
        """q, k rotated at the positions of x's tokens (the real tokens before each, plus
        before [B] when x follows a cache), and v."""
        pos = valid.long().cumsum(1) - 1  # [B, T]
        if before is not None:
            pos = pos + before[:, None]
        pos = pos.clamp(min=0)
        q, k, v = self.qkv(x)
        return self.rope(q, pos), self.rope(k, pos), v

    @torch.no_grad()
    def decode(self, x: torch.Tensor, cache: RoPECache,
               mask: torch.Tensor | None = None) -> torch.Tensor:
        """m new tokens x [B, m, hidden] after the cache (updated in place); mask: None or
        [B, m] 0 / 1 (0 = masked token). Returns y [B, m, hidden] (m = 0: empty, the cache
        unchanged). No gradients."""
        self.check_input(x)
        if not isinstance(cache, RoPECache):
            raise ValueError(f"cache must be the RoPECache of prefill, got "
                             f"{type(cache).__name__}")
        if x.shape[1] == 0:
            return self.empty_output(x)
        B, m, _ = x.shape
        T0 = len(cache)
        keep = step_mask(x, mask)  # values on the host or the device (`checks_on_host`)
        valid = torch.ones(B, m, dtype=torch.bool, device=x.device) if keep is None else keep
        q, k, v = self._rotated(x, valid, cache.key_mask.sum(1))
        cache.append(k.transpose(1, 2), v.transpose(1, 2), valid)
        ar = torch.arange(T0 + m, device=x.device)
        allowed = (ar[None, None, :] <= T0 + ar[None, :m, None]) & cache.key_mask[:, None, :]
        allowed = allowed | (ar[None, None, :] == T0 + ar[None, :m, None])  # softmax defined
        o = self._attend(q, cache.k, cache.v, allowed[:, None])  # [B, m, HQ, D]
        return self.out(o * valid[:, :, None, None].to(o.dtype))

    # ------------------------------------------------------------------ inspection

    def _weights(self, q: torch.Tensor, k: torch.Tensor, key_mask: torch.Tensor
                 ) -> torch.Tensor:
        """softmax(scale q k^T) in float64 for q [B, m, HQ, D] (the last m positions) and
        rotated keys k [B, H, n, D]: [B, HQ, m, n], masked and later keys excluded."""
        m, n = q.shape[1], k.shape[2]
        kq = expand_kv_heads(k.to(torch.float64), self.num_heads // self.num_kv_heads)
        s = (q.transpose(1, 2).to(torch.float64) @ kq.mT) * self.head_dim ** -0.5
        allowed = torch.arange(n, device=q.device)[None, :] <= torch.arange(
            n - m, n, device=q.device)[:, None]  # [m, n]
        allowed = allowed[None, None] & key_mask[:, None, None, :]
        return torch.nan_to_num(torch.softmax(s.masked_fill(~allowed, float("-inf")), -1))

    def attention_weights(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None
                          ) -> torch.Tensor:
        """The attention probabilities of the prompt x [B, T, hidden] (attention_mask as in
        `prefill`): [B, HQ, T, T], a plain softmax in float64 (O(T^2 * D) beside the
        forward); rows of masked queries zero."""
        self.check_input(x)
        valid = self._valid(x, attention_mask)
        q, k, _ = self._rotated(x, valid)
        return self.weights_out(self._weights(q, k.transpose(1, 2), valid), x, valid)

    def step_attention_weights(self, x: torch.Tensor, cache: RoPECache,
                               mask: torch.Tensor | None = None) -> torch.Tensor:
        """After `decode(x, cache, mask)`: the probabilities of its m new queries over all n
        positions, [B, HQ, m, n] (plain softmax in float64)."""
        self.check_input(x)
        m = x.shape[1]
        valid = self._valid(x, mask)
        q, _, _ = self._rotated(x, valid, cache.key_mask[:, :-m].sum(1))
        p = self._weights(q, cache.k, cache.key_mask)
        return self.weights_out(p, x, None if mask is None else step_mask(x, mask))


class FoXAttention(AttentionProjections):
    """Forgetting-Transformer attention (no position encoding besides the forget gates).
    Training runs `fox_attn` (gated FlashAttention kernels on CUDA, the PaTH op with
    identity transforms w = 0, beta = 0 elsewhere); prefill and decode use the PaTH op.

    Args as `PaTHAttention` where meaningful: hidden_size, num_heads, num_kv_heads,
    head_dim, qk_norm, bias, norm_eps, o_bias. The forget-gate bias starts at U(1, 5) as
    PaTH-FoX. The cache of prefill / decode is the op's `PaTHCache` (reorder and truncate
    included).
    """

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int | None = None,
                 head_dim: int | None = None, qk_norm: bool = False, bias: bool = False,
                 norm_eps: float = 1e-6, o_bias: bool | None = None):
        super().__init__(hidden_size, num_heads, num_kv_heads, head_dim, qk_norm, bias,
                         norm_eps, o_bias)
        self.g_proj = nn.Linear(self.hidden_size, self.num_heads, bias=True)
        init_forget_gate_bias(self.g_proj.bias)

    def forget_gate(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, hidden] -> log forget gates g [B, T, HQ] (<= 0), computed in float32
        (float64 for float64 x) as PaTH's gates."""
        return F.logsigmoid(full_precision_linear(self.g_proj, x, gate_dtype(x)))

    def op_inputs(self, x: torch.Tensor):
        """What the PaTH op receives: q, k, v, w = 0, beta = 0 (float32), g (float32)."""
        q, k, v = self.qkv(x)
        w = torch.zeros_like(k)  # [B, T, H, D]: H_t = I
        beta = k.new_zeros(k.shape[:3], dtype=gate_dtype(x))  # [B, T, H]
        return q, k, v, w, beta, self.forget_gate(x)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """Training path: x [B, T, hidden] -> [B, T, hidden]; cu_seqlens packs (B == 1)."""
        self.check_input(x)
        check_packing(x, cu_seqlens)
        q, k, v = self.qkv(x)
        g = self.forget_gate(x)
        with no_autocast(x.device.type):
            o = fox_attn(q, k, v, g, cu_seqlens=cu_seqlens)
        return self.out(o)

    def prefill(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None,
                history: bool = False) -> tuple[torch.Tensor, PaTHCache]:
        """A prompt x [B, T, hidden] (attention_mask [B, T]: 1 = token, 0 = masked token,
        anywhere) -> (y [B, T, hidden], PaTHCache); history as `PaTHAttention.prefill`."""
        self.check_input(x)
        inputs = self.op_inputs(x)
        with no_autocast(x.device.type):
            o, cache = path_attn_prefill(*inputs, attention_mask=attention_mask,
                                         history=history)
        return self.out(o), cache

    @torch.no_grad()
    def decode(self, x: torch.Tensor, cache: PaTHCache,
               mask: torch.Tensor | None = None) -> torch.Tensor:
        """m new tokens x [B, m, hidden] after the cache (in place) -> [B, m, hidden]
        (m = 0: empty, the cache unchanged); mask: None or [B, m] (0 = masked token)."""
        self.check_input(x)
        if not isinstance(cache, PaTHCache):
            raise ValueError(f"cache must be the PaTHCache of prefill, got "
                             f"{type(cache).__name__}")
        if x.shape[1] == 0:
            return self.empty_output(x)
        inputs = self.op_inputs(x)
        with no_autocast(x.device.type):
            o = path_attn_step(*inputs, state=cache, mask=step_mask(x, mask))
        return self.out(o)

    # ------------------------------------------------------------------ inspection

    def attention_weights(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None
                          ) -> torch.Tensor:
        """The attention probabilities of the prompt x [B, T, hidden]: [B, HQ, T, T], by the
        float64 reference (`path_attn_weights` with identity transforms), rows of masked
        queries zero. Cost: T sequential steps of O(T * HQ * D)."""
        self.check_input(x)
        mask = check_attention_mask(x, attention_mask)
        q, k, _, w, beta, g = self.op_inputs(x)
        if mask is not None:
            g = g * mask[..., None]
        return self.weights_out(path_attn_weights(q, k, w, beta, g, key_mask=mask), x, mask)

    def step_attention_weights(self, x: torch.Tensor, cache: PaTHCache,
                               mask: torch.Tensor | None = None) -> torch.Tensor:
        """After `decode(x, cache, mask)`: [B, HQ, m, n] by the float64 reference from the
        cache's history (ValueError for a cache prefilled without history)."""
        self.check_input(x)
        hist = cache.history_inputs()
        p = path_attn_weights(self.qkv(x)[0], hist.k, hist.w, hist.beta, hist.g,
                              key_mask=cache.key_mask)
        return self.weights_out(p, x, None if mask is None else step_mask(x, mask))
