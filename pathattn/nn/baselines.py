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

from ..ops import PaTHCache, path_attn, path_attn_prefill, path_attn_step
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
)
from .rope import RotaryEmbedding

__all__ = ["RoPEAttention", "RoPECache", "FoXAttention"]


class RoPECache:
    """KV cache of `RoPEAttention`: rotated keys k [B, H, n, D], values v [B, H, n, D] and
    start [B] (first real position of each row; positions are counted from it).
    `reorder(index)` selects rows; `truncate(n)` keeps the first n positions (any n)."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, start: torch.Tensor):
        self.k, self.v, self.start = k, v, start

    def __len__(self) -> int:
        return self.k.shape[2]

    @property
    def seq_len(self) -> int:
        return self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [B, H, m, D] of the new tokens (k rotated)."""
        self.k, self.v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)

    def reorder(self, index: torch.Tensor) -> None:
        index = batch_index(index, self.k.shape[0], self.k.device)
        self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)
        self.start = self.start.index_select(0, index)

    def truncate(self, new_len: int) -> None:
        if not 0 <= new_len <= len(self):
            raise ValueError(f"new_len={new_len} must lie in [0, {len(self)}]")
        self.k, self.v = self.k[:, :, :new_len], self.v[:, :, :new_len]


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

    def prefill(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, RoPECache]:
        """A prompt x [B, T, hidden]; attention_mask [B, T] (1 = token, 0 = left padding).
        Returns (y [B, T, hidden], RoPECache); rows at padding positions are o_proj(0)."""
        self.check_input(x)
        B, T, _ = x.shape
        valid = check_attention_mask(x, attention_mask)  # [B, T] bool or None
        if valid is None:
            valid = torch.ones(B, T, dtype=torch.bool, device=x.device)
        start = T - valid.sum(1)  # [B] left padding
        ar = torch.arange(T, device=x.device)
        pos = (ar[None] - start[:, None]).clamp(min=0)  # [B, T]
        q, k, v = self.qkv(x)
        q, k = self.rope(q, pos), self.rope(k, pos)
        causal = ar[:, None] >= ar[None, :]  # [T, T]
        # real keys only; a padding query sees itself so that its softmax is defined
        allowed = causal & (valid[:, None, :] | torch.eye(T, dtype=torch.bool,
                                                          device=x.device))  # [B, T, T]
        o = self._attend(q, k.transpose(1, 2), v.transpose(1, 2), allowed[:, None])
        o = o * valid[:, :, None, None].to(o.dtype)
        cache = RoPECache(k.transpose(1, 2).detach(), v.transpose(1, 2).detach(), start)
        return self.out(o), cache

    @torch.no_grad()
    def decode(self, x: torch.Tensor, cache: RoPECache) -> torch.Tensor:
        """m new tokens x [B, m, hidden] after the cache (updated in place).
        Returns y [B, m, hidden] (m = 0: empty, the cache unchanged). No gradients."""
        self.check_input(x)
        if not isinstance(cache, RoPECache):
            raise ValueError(f"cache must be the RoPECache of prefill, got "
                             f"{type(cache).__name__}")
        if x.shape[1] == 0:
            return self.empty_output(x)
        B, m, _ = x.shape
        T0 = len(cache)
        ar = torch.arange(T0 + m, device=x.device)
        pos = T0 + ar[None, :m] - cache.start[:, None]  # [B, m]
        q, k, v = self.qkv(x)
        q, k = self.rope(q, pos), self.rope(k, pos)
        cache.append(k.transpose(1, 2), v.transpose(1, 2))
        allowed = (ar[None, None, :] <= T0 + ar[None, :m, None]) & (
            ar[None, None, :] >= cache.start[:, None, None])  # [B, m, T0 + m]
        return self.out(self._attend(q, cache.k, cache.v, allowed[:, None]))


class FoXAttention(AttentionProjections):
    """Forgetting-Transformer attention (no position encoding besides the forget gates),
    run as PaTH attention with identity transforms (w = 0, beta = 0).

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
        inputs = self.op_inputs(x)
        with no_autocast(x.device.type):
            o = path_attn(*inputs, cu_seqlens=cu_seqlens)
        return self.out(o)

    def prefill(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, PaTHCache]:
        """A prompt x [B, T, hidden] (attention_mask [B, T]: 1 = token, 0 = left padding)
        -> (y [B, T, hidden], PaTHCache)."""
        self.check_input(x)
        inputs = self.op_inputs(x)
        with no_autocast(x.device.type):
            o, cache = path_attn_prefill(*inputs, attention_mask=attention_mask)
        return self.out(o), cache

    @torch.no_grad()
    def decode(self, x: torch.Tensor, cache: PaTHCache) -> torch.Tensor:
        """m new tokens x [B, m, hidden] after the cache (in place) -> [B, m, hidden]
        (m = 0: empty, the cache unchanged)."""
        self.check_input(x)
        if not isinstance(cache, PaTHCache):
            raise ValueError(f"cache must be the PaTHCache of prefill, got "
                             f"{type(cache).__name__}")
        if x.shape[1] == 0:
            return self.empty_output(x)
        inputs = self.op_inputs(x)
        with no_autocast(x.device.type):
            o = path_attn_step(*inputs, state=cache)
        return self.out(o)
