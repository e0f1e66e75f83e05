"""The PaTH attention layer (paper section 2.2, PaTH-FoX paragraph; inference section 3.4).

For a token x_t [hidden]:

    q_t, k_t, v_t = W_q x_t, W_k x_t, W_v x_t                   split into heads
    w_t    = L2normalize_per_head(ShortConv_3(W_w2 W_w1 x_t))   low rank -> short conv -> L2
    beta_t = beta_max * sigmoid(W_beta x_t + b_beta)            one per key/value head
    g_t    = logsigmoid(W_f x_t + b_f)                          one per query head (PaTH-FoX)
    o      = path_attn(q, k, v, w, beta, g);  y = W_o o

(footnote of section 2.2: "a low-rank linear layer followed by a short convolution layer
(filter size 3) and an L2 normalization layer"; beta_t = 2 sigmoid(u^T x_t + b) in (0, 2)).
Choices the paper leaves open, documented here:

* no activation after the short convolution (the paper names none; fla's reference code
  applies SiLU), see `short_conv.py`;
* beta_max (default 2) caps beta below 2 when set lower: the paper's Limitations section
  reports that bf16 rounding of beta near 2 can give eigenvalues above 1 and divergence, so
  use e.g. beta_max = 1.99 (or lower) when training in bf16;
* the forget-gate bias starts at U(1, 5): f = sigmoid(b) in (0.73, 0.993), so the gates
  start near 1 (little forgetting) with per-head spread (a decay over ~4 to ~150 tokens);
* optional QK RMSNorm is per head (one learnable weight [D] for q, one for k, shared by the
  heads), applied to q and k before path_attn in all three paths.

The three paths are separate methods (STYLE point 6): `forward` (training, optionally packed
with cu_seqlens), `prefill` (prompt -> output and `LayerCache`) and `decode` (m >= 1 new
tokens, in place on the cache).
"""

from __future__ import annotations

import numbers

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops import PaTHCache, path_attn, path_attn_prefill, path_attn_step
from ..ops.inference import check_attention_mask as check_op_attention_mask
from ..ops.validation import check_cu_seqlens
from .norm import RMSNorm
from .short_conv import ShortConv

__all__ = ["PaTHAttention", "LayerCache", "AttentionProjections"]


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def check_x(x, hidden_size: int) -> None:
    """x must be a float tensor [B, T, hidden_size]."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError(f"x must be a float tensor [B, T, hidden_size], got "
                         f"{type(x).__name__ if not isinstance(x, torch.Tensor) else x.dtype}")
    if x.ndim != 3:
        raise ValueError(f"x must have 3 dimensions [B, T, hidden_size], got shape "
                         f"{tuple(x.shape)}")
    if x.shape[-1] != hidden_size:
        raise ValueError(f"x: last dimension must be hidden_size={hidden_size}, got shape "
                         f"{tuple(x.shape)}")


def check_packing(x: torch.Tensor, cu_seqlens: torch.Tensor | None) -> None:
    """cu_seqlens: None or int [N + 1] from 0 to T, non-decreasing, with B == 1 (the op's
    checks, run before the layer uses it)."""
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, x.shape[0], x.shape[1])


def check_attention_mask(x: torch.Tensor, attention_mask: torch.Tensor | None
                         ) -> torch.Tensor | None:
    """attention_mask [B, T] of 0 / 1 with padding on the left only -> bool [B, T], or None
    when absent or without padding (the op's checks)."""
    return check_op_attention_mask(attention_mask, x.shape[0], x.shape[1], x.device)


def init_forget_gate_bias(bias: torch.Tensor, low: float = 1.0, high: float = 5.0) -> None:
    """Forget-gate bias ~ U(low, high): gates sigmoid(b) start near 1 (see module docstring)."""
    with torch.no_grad():
        bias.uniform_(low, high)




class AttentionProjections(nn.Module):
    """q, k, v, o projections and optional per-head QK RMSNorm, shared by PaTH and the
    baselines. HQ = num_heads query heads, H = num_kv_heads key/value heads, head dim D."""

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int | None = None,
                 head_dim: int | None = None, qk_norm: bool = False, bias: bool = False,
                 norm_eps: float = 1e-6):
        super().__init__()
        hidden_size = _positive_int("hidden_size", hidden_size)
        num_heads = _positive_int("num_heads", num_heads)
        num_kv_heads = num_heads if num_kv_heads is None else _positive_int(
            "num_kv_heads", num_kv_heads)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} must be a multiple of num_kv_heads="
                             f"{num_kv_heads} (GQA / MQA)")
        if head_dim is None:
            if hidden_size % num_heads:
                raise ValueError(f"hidden_size={hidden_size} must be divisible by num_heads="
                                 f"{num_heads} (or pass head_dim)")
            head_dim = hidden_size // num_heads
        head_dim = _positive_int("head_dim", head_dim)
        self.hidden_size, self.num_heads, self.num_kv_heads = hidden_size, num_heads, num_kv_heads
        self.head_dim = head_dim
        HQ, H, D = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(hidden_size, HQ * D, bias=bias)
        self.k_proj = nn.Linear(hidden_size, H * D, bias=bias)
        self.v_proj = nn.Linear(hidden_size, H * D, bias=bias)
        self.o_proj = nn.Linear(HQ * D, hidden_size, bias=bias)
        self.q_norm = RMSNorm(D, norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(D, norm_eps) if qk_norm else None

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, hidden] -> q [B, T, HQ, D], k [B, T, H, D], v [B, T, H, D]."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim)  # [B, T, HQ, D]
        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim)  # [B, T, H, D]
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.head_dim)  # [B, T, H, D]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def out(self, o: torch.Tensor) -> torch.Tensor:
        """o [B, T, HQ, D] -> y [B, T, hidden]."""
        B, T = o.shape[:2]
        return self.o_proj(o.reshape(B, T, self.num_heads * self.head_dim))  # [B, T, hidden]


class LayerCache:
    """Decode state of `PaTHAttention`: the `PaTHCache` of the attention op (`attn`) and the
    short conv's last K-1 inputs per row (`conv_state` [B, K-1, H*D], zeros before a row's
    start with left padding).

    `reorder(index)` selects batch rows of both parts (beam search). `truncate(n)` goes back
    to any length in [start of the last step, current length], as `PaTHCache.truncate`: the
    inputs of the last step are kept for that, so the conv state can be rebuilt.
    """

    def __init__(self, attn: PaTHCache, conv_history: torch.Tensor, kernel_size: int):
        self.attn = attn
        self._K1 = kernel_size - 1
        self._hist = conv_history  # [B, K-1+m, C]: conv inputs ending at the current length
        self._hist_start = len(attn) - (conv_history.shape[1] - self._K1)  # last step's start

    def __len__(self) -> int:
        return len(self.attn)

    @property
    def seq_len(self) -> int:
        return len(self.attn)

    @property
    def conv_state(self) -> torch.Tensor:
        """[B, K-1, C]: the last K-1 inputs of the short conv."""
        return self._hist[:, self._hist.shape[1] - self._K1:]

    def update(self, conv_history: torch.Tensor, start: int) -> None:
        """After a step from length `start`: conv_history [B, K-1+m, C] = old state + inputs."""
        self._hist, self._hist_start = conv_history, start

    def reorder(self, index: torch.Tensor) -> None:
        """Row b becomes old row index[b] (index [B'] int32 / int64) in both parts."""
        self.attn.reorder(index)  # validates index
        self._hist = self._hist.index_select(0, index.to(self._hist.device, torch.long))

    def truncate(self, new_len: int) -> None:
        """Keep the first new_len positions; new_len in [start of the last step, length]."""
        if isinstance(new_len, bool) or not isinstance(new_len, numbers.Integral) or not (
                self._hist_start <= new_len <= len(self)):
            raise ValueError(f"new_len={new_len!r} is out of range: a LayerCache can only be "
                             f"truncated to a length in [{self._hist_start}, {len(self)}] "
                             "(back to the start of the last step at most)")
        self.attn.truncate(int(new_len))
        self._hist = self._hist[:, : self._K1 + int(new_len) - self._hist_start]


class PaTHAttention(AttentionProjections):
    """PaTH (or PaTH-FoX) attention layer; see the module docstring for the equations.

    Args:
        hidden_size: model width.
        num_heads: HQ query heads.
        num_kv_heads: H key/value heads (default HQ; HQ must be a multiple: GQA / MQA).
            w and beta are per key/value head, forget gates per query head.
        head_dim: D (default hidden_size // num_heads).
        w_rank: rank of the w projection Linear(hidden, rank) -> Linear(rank, H*D); None or
            0 for one full-rank Linear(hidden, H*D).
        conv_size: kernel size K of the short causal conv on w (paper: 3).
        use_forget_gate: PaTH-FoX forget gates g = logsigmoid(Linear(hidden, HQ)(x)).
        qk_norm: per-head RMSNorm of q and k.
        beta_max: beta = beta_max * sigmoid(.), in (0, beta_max); must lie in (0, 2].
            Use a value below 2 (e.g. 1.99) for bf16 training (paper, Limitations).
        bias: bias of the q, k, v, o projections.
        norm_eps: epsilon of the QK RMSNorm.

    x is [B, T, hidden_size] in any float dtype; the outputs have x's dtype.
    """

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int | None = None,
                 head_dim: int | None = None, w_rank: int | None = 32, conv_size: int = 3,
                 use_forget_gate: bool = False, qk_norm: bool = False, beta_max: float = 2.0,
                 bias: bool = False, norm_eps: float = 1e-6):
        super().__init__(hidden_size, num_heads, num_kv_heads, head_dim, qk_norm, bias,
                         norm_eps)
        if isinstance(beta_max, bool) or not isinstance(beta_max, numbers.Real) or not (
                0 < beta_max <= 2):
            raise ValueError(f"beta_max must be a number in (0, 2], got {beta_max!r}")
        if w_rank is not None and (isinstance(w_rank, bool) or not isinstance(
                w_rank, numbers.Integral) or w_rank < 0):
            raise ValueError(f"w_rank must be a non-negative int or None, got {w_rank!r}")
        self.beta_max = float(beta_max)
        self.w_rank = int(w_rank) if w_rank else None
        self.use_forget_gate = bool(use_forget_gate)
        C = self.num_kv_heads * self.head_dim
        if self.w_rank is None:
            self.w_proj = nn.Linear(self.hidden_size, C, bias=False)
        else:
            self.w_proj = nn.Sequential(nn.Linear(self.hidden_size, self.w_rank, bias=False),
                                        nn.Linear(self.w_rank, C, bias=False))
        self.w_conv = ShortConv(C, conv_size)
        self.beta_proj = nn.Linear(self.hidden_size, self.num_kv_heads, bias=True)
        self.g_proj = None
        if self.use_forget_gate:
            self.g_proj = nn.Linear(self.hidden_size, self.num_heads, bias=True)
            init_forget_gate_bias(self.g_proj.bias)

    # ---------------------------------------------------------------- per-token inputs

    def _w(self, w_conv: torch.Tensor) -> torch.Tensor:
        """Short-conv output [B, T, H*D] -> unit w [B, T, H, D] (zero stays zero)."""
        B, T, _ = w_conv.shape
        return F.normalize(w_conv.view(B, T, self.num_kv_heads, self.head_dim), dim=-1)

    def beta(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, hidden] -> beta [B, T, H] in (0, beta_max)."""
        return self.beta_max * torch.sigmoid(self.beta_proj(x))

    def forget_gate(self, x: torch.Tensor) -> torch.Tensor | None:
        """x [B, T, hidden] -> log forget gates g [B, T, HQ] (<= 0), or None without gates."""
        return None if self.g_proj is None else F.logsigmoid(self.g_proj(x))

    # ------------------------------------------------------------------------ training

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """Training path. x [B, T, hidden]; cu_seqlens [N + 1] int (B == 1) packs sequences:
        neither the short conv nor attention crosses a boundary. Returns y [B, T, hidden]."""
        check_x(x, self.hidden_size)
        check_packing(x, cu_seqlens)
        q, k, v = self.qkv(x)
        w = self._w(self.w_conv(self.w_proj(x), cu_seqlens))  # [B, T, H, D]
        o = path_attn(q, k, v, w, self.beta(x), self.forget_gate(x), cu_seqlens=cu_seqlens)
        return self.out(o)

    # ----------------------------------------------------------------------- inference

    def prefill(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, LayerCache]:
        """A prompt x [B, T, hidden]; attention_mask [B, T] (1 = token, 0 = left padding).

        Returns (y [B, T, hidden], cache): y equals `forward` on each row's tokens alone
        (rows at padding positions are o_proj(0)); the cache feeds `decode`.
        """
        check_x(x, self.hidden_size)
        check_attention_mask(x, attention_mask)
        q, k, v = self.qkv(x)
        w_conv, conv_state = self.w_conv.prefill(self.w_proj(x), attention_mask)
        o, attn = path_attn_prefill(q, k, v, self._w(w_conv), self.beta(x),
                                    self.forget_gate(x), attention_mask=attention_mask)
        return self.out(o), LayerCache(attn, conv_state, self.w_conv.kernel_size)

    @torch.no_grad()
    def decode(self, x: torch.Tensor, cache: LayerCache) -> torch.Tensor:
        """m >= 1 new tokens x [B, m, hidden] after the cache (updated in place). Returns
        y [B, m, hidden]: the last m rows of `forward` on the whole sequence. No gradients."""
        check_x(x, self.hidden_size)
        if not isinstance(cache, LayerCache):
            raise ValueError(f"cache must be the LayerCache of prefill, got "
                             f"{type(cache).__name__}")
        start = len(cache)
        q, k, v = self.qkv(x)
        w_conv, hist = self.w_conv.step(self.w_proj(x), cache.conv_state)
        o = path_attn_step(q, k, v, self._w(w_conv), self.beta(x), self.forget_gate(x),
                           state=cache.attn)
        cache.update(hist, start)
        return self.out(o)
