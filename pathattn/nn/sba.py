"""Stick-breaking attention layer (Tan et al. 2024), a baseline with the interface of
`PaTHAttention` (forward / prefill / decode):

    z_ij = scale * q_i . k_j,   A_ij = sigmoid(z_ij) prod_{j < k < i} (1 - sigmoid(z_ik)),
    o_i  = sum_j A_ij v_j

(`pathattn.ops.sb_attn`, whose default backend runs the Triton kernels on CUDA tensors and
the blockwise op elsewhere). No position encoding: the stick-breaking product already
favours the nearest keys. Prefill and decode run through `sb_attn_prefill` /
`sb_attn_step` with a plain KV cache (`SBACache`), which can be truncated to any length. A
masked token (attention mask 0, anywhere) is no key and breaks no stick.
"""

from __future__ import annotations

import torch

from ..ops.sba import SBACache, sb_attn, sb_attn_prefill, sb_attn_step, sb_attn_weights
from .path_attention import (
    AttentionProjections,
    check_attention_mask,
    check_packing,
    no_autocast,
    step_mask,
)

__all__ = ["SBAttention"]


class SBAttention(AttentionProjections):
    """Causal stick-breaking attention.

    Args as `PaTHAttention` where meaningful: hidden_size, num_heads, num_kv_heads,
    head_dim, qk_norm, bias, norm_eps, o_bias; attend_current: query i also attends to its
    own key (default False, so the first token's attention output is zero).
    """

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int | None = None,
                 head_dim: int | None = None, qk_norm: bool = False, bias: bool = False,
                 norm_eps: float = 1e-6, o_bias: bool | None = None,
                 attend_current: bool = False):
        super().__init__(hidden_size, num_heads, num_kv_heads, head_dim, qk_norm, bias,
                         norm_eps, o_bias)
        if not isinstance(attend_current, bool):
            raise ValueError(f"attend_current must be a bool, got {attend_current!r}")
        self.attend_current = attend_current

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """Training path: x [B, T, hidden] -> [B, T, hidden]; cu_seqlens [N + 1] packs
        sequences (B == 1)."""
        self.check_input(x)
        check_packing(x, cu_seqlens)
        q, k, v = self.qkv(x)  # [B, T, HQ, D], [B, T, H, D] x 2
        with no_autocast(x.device.type):
            o = sb_attn(q, k, v, cu_seqlens=cu_seqlens, attend_current=self.attend_current)
        return self.out(o)

    def prefill(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None,
                history: bool = False) -> tuple[torch.Tensor, SBACache]:
        """A prompt x [B, T, hidden]; attention_mask [B, T] (1 = token, 0 = masked token,
        anywhere). Returns (y [B, T, hidden], SBACache); rows at masked positions are
        o_proj(0). history: accepted for the common interface (the cache keeps every key)."""
        self.check_input(x)
        q, k, v = self.qkv(x)
        with no_autocast(x.device.type):
            o, cache = sb_attn_prefill(q, k, v, attend_current=self.attend_current,
                                       attention_mask=attention_mask)
        return self.out(o), cache

    @torch.no_grad()
    def decode(self, x: torch.Tensor, cache: SBACache,
               mask: torch.Tensor | None = None) -> torch.Tensor:
        """m new tokens x [B, m, hidden] after the cache (updated in place) -> y
        [B, m, hidden] (m = 0: empty, the cache unchanged); mask: None or [B, m] (0 = masked
        token). No gradients."""
        self.check_input(x)
        if not isinstance(cache, SBACache):
            raise ValueError(f"cache must be the SBACache of prefill, got "
                             f"{type(cache).__name__}")
        if x.shape[1] == 0:
            return self.empty_output(x)
        q, k, v = self.qkv(x)
        with no_autocast(x.device.type):
            o = sb_attn_step(q, k, v, cache, attend_current=self.attend_current,
                             mask=step_mask(x, mask))
        return self.out(o)

    # ------------------------------------------------------------------ inspection

    def attention_weights(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None
                          ) -> torch.Tensor:
        """The stick-breaking weights of the prompt x [B, T, hidden]: [B, HQ, T, T] by the
        float64 reference (`sb_attn_weights`, O(T^2 * D) beside the forward); a row sums to
        at most 1; rows of masked queries zero."""
        self.check_input(x)
        mask = check_attention_mask(x, attention_mask)
        q, k, _ = self.qkv(x)
        p = sb_attn_weights(q, k, attend_current=self.attend_current, key_mask=mask)
        return self.weights_out(p, x, mask)

    def step_attention_weights(self, x: torch.Tensor, cache: SBACache,
                               mask: torch.Tensor | None = None) -> torch.Tensor:
        """After `decode(x, cache, mask)`: the weights of its m new queries over all n
        positions, [B, HQ, m, n] (float64 reference)."""
        self.check_input(x)
        p = sb_attn_weights(self.qkv(x)[0], cache.k, attend_current=self.attend_current,
                            key_mask=cache.key_mask)
        return self.weights_out(p, x, None if mask is None else step_mask(x, mask))
