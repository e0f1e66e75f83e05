"""The PaTH attention layer (paper section 2.2, PaTH-FoX paragraph; inference section 3.4).

For a token x_t: q, k, v = W_q x_t, W_k x_t, W_v x_t;
w_t = L2normalize_per_head(ShortConv(W_w2 W_w1 x_t)); beta_t = beta_max * sigmoid(W_beta x_t
+ b_beta) per key/value head; g_t = logsigmoid(W_f x_t + b_f) per query head (PaTH-FoX);
y = W_o path_attn(q, k, v, w, beta, g). beta and g are computed in float32 whatever the
activation dtype. Training (`forward`), prefill and decode are separate methods.

Choices the paper leaves open, precision and the decode path: docs/layers.md.
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops import path_attn, path_attn_prefill, path_attn_step, path_attn_weights
from ..ops.common.padding import check_attention_mask as check_op_attention_mask
from ..ops.common.validation import check_cu_seqlens
from ..ops.path.backends import check_backend_name
from ..utils.value_checks import checks_on_host, mask_on_device
from .fused_projection import FusedProjection
from .layer_cache import LayerCache
from .norm import RMSNorm
from .short_conv import ShortConv

__all__ = ["PaTHAttention", "LayerCache", "AttentionProjections", "check_x", "strict_cap",
           "round_toward_zero", "step_mask"]


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def autocast_enabled(device_type: str) -> bool:
    """True inside torch.autocast for this device type (False for types autocast lacks)."""
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except TypeError:  # torch < 2.4: no device argument
        return bool(torch.is_autocast_cpu_enabled() if device_type == "cpu"
                    else torch.is_autocast_enabled())
    except RuntimeError:  # a device type without autocast (meta, ...)
        return False


def no_autocast(device_type: str):
    """A context that turns autocast off for this device type where it is on."""
    if autocast_enabled(device_type):
        return torch.autocast(device_type=device_type, enabled=False)
    return contextlib.nullcontext()


def check_x(x, hidden_size: int, weight_dtype: torch.dtype | None = None) -> None:
    """x must be a float tensor [B, T, hidden_size] (T = 0 allowed) with the dtype of the
    weights, weight_dtype, unless autocast is on for x's device (its rules cast then)."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError(f"x must be a float tensor [B, T, hidden_size], got "
                         f"{type(x).__name__ if not isinstance(x, torch.Tensor) else x.dtype}")
    if x.ndim != 3:
        raise ValueError(f"x must have 3 dimensions [B, T, hidden_size], got shape "
                         f"{tuple(x.shape)}")
    if x.shape[-1] != hidden_size:
        raise ValueError(f"x: last dimension must be hidden_size={hidden_size}, got shape "
                         f"{tuple(x.shape)}")
    if weight_dtype is not None and x.dtype != weight_dtype and not autocast_enabled(
            x.device.type):
        raise ValueError(f"x has dtype {x.dtype} but the layer's weights are {weight_dtype}: "
                         f"pass x.to({weight_dtype}), convert the layer with "
                         f".to({x.dtype}), or run under torch.autocast")


def gate_dtype(x: torch.Tensor) -> torch.dtype:
    """Dtype of w's normalisation, beta and the forget gates: float64 for float64 x, else
    float32 (see the module docstring)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def full_precision_linear(linear: nn.Linear, x: torch.Tensor, dtype: torch.dtype
                          ) -> torch.Tensor:
    """linear(x) computed in `dtype` outside autocast (x and the parameters cast to it;
    gradients flow back in their own dtypes)."""
    bias = None if linear.bias is None else linear.bias.to(dtype)
    with no_autocast(x.device.type):
        return F.linear(x.to(dtype), linear.weight.to(dtype), bias)


def strict_cap(beta: torch.Tensor, beta_max: float) -> torch.Tensor:
    """beta clamped to the largest value of beta's dtype below float32(beta_max) (for a
    float64 beta: below beta_max), so that beta < beta_max holds exactly."""
    top = torch.tensor(beta_max, dtype=beta.dtype, device=beta.device)
    return torch.minimum(beta, torch.nextafter(top, torch.zeros_like(top)))


@functools.cache
def strict_cap_value(beta_max: float, dtype: torch.dtype) -> float:
    """`strict_cap`'s bound for a beta of `dtype`, as a number (decode clamps with it
    instead of building the bound at every token)."""
    return float(strict_cap(torch.tensor(math.inf, dtype=dtype), beta_max))


def round_toward_zero(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x cast to `dtype`, rounded toward zero (|result_i| <= |x_i|), with the gradient of a
    plain cast."""
    with torch.no_grad():
        y = x.to(dtype)
        grew = y.abs().to(x.dtype) > x.abs()
        y = torch.where(grew, torch.nextafter(y, torch.zeros_like(y)), y)
    return y + (x - x.detach()).to(dtype) if x.requires_grad else y


def check_packing(x: torch.Tensor, cu_seqlens: torch.Tensor | None) -> None:
    """cu_seqlens: None or int [N + 1] from 0 to T, non-decreasing, with B == 1 (the op's
    checks, run before the layer uses it)."""
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, x.shape[0], x.shape[1])


def check_attention_mask(x: torch.Tensor, attention_mask: torch.Tensor | None
                         ) -> torch.Tensor | None:
    """attention_mask [B, T] of 0 / 1 (0 = masked token, anywhere) -> bool [B, T], or None
    when absent or without zeros (the op's checks)."""
    return check_op_attention_mask(attention_mask, x.shape[0], x.shape[1], x.device)


def init_forget_gate_bias(bias: torch.Tensor, low: float = 1.0, high: float = 5.0) -> None:
    """Forget-gate bias ~ U(low, high): gates sigmoid(b) start near 1 (see module docstring)."""
    with torch.no_grad():
        bias.uniform_(low, high)




class AttentionProjections(nn.Module):
    """q, k, v, o projections and optional per-head QK RMSNorm, shared by PaTH and the
    baselines. HQ = num_heads query heads, H = num_kv_heads key/value heads, head dim D.
    `bias` puts biases on the q, k, v projections and, unless `o_bias` says otherwise
    (None = same as bias), on the output projection (Qwen2: q, k, v only)."""

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int | None = None,
                 head_dim: int | None = None, qk_norm: bool = False, bias: bool = False,
                 norm_eps: float = 1e-6, o_bias: bool | None = None):
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
        self.o_proj = nn.Linear(HQ * D, hidden_size, bias=bias if o_bias is None else o_bias)
        self.q_norm = RMSNorm(D, norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(D, norm_eps) if qk_norm else None

    def check_input(self, x) -> None:
        """`check_x` against this layer's width and weight dtype (ValueError)."""
        check_x(x, self.hidden_size, self.q_proj.weight.dtype)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, hidden] -> q [B, T, HQ, D], k [B, T, H, D], v [B, T, H, D]."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim)  # [B, T, HQ, D]
        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim)  # [B, T, H, D]
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.head_dim)  # [B, T, H, D]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def empty_output(self, x: torch.Tensor) -> torch.Tensor:
        """y [B, 0, hidden] for x [B, 0, hidden] (an empty step), in the dtype `out` gives."""
        return self.out(x.new_zeros(x.shape[0], 0, self.num_heads, self.head_dim))

    def out(self, o: torch.Tensor) -> torch.Tensor:
        """o [B, T, HQ, D] -> y [B, T, hidden]."""
        B, T = o.shape[:2]
        return self.o_proj(o.reshape(B, T, self.num_heads * self.head_dim))  # [B, T, hidden]

    @staticmethod
    def weights_out(p: torch.Tensor, x: torch.Tensor, keep: torch.Tensor | None
                    ) -> torch.Tensor:
        """Attention probabilities p [B, HQ, m, n] (float64) as a layer reports them: rows
        of masked queries (keep [B, m] False) zero, in x's dtype promoted to float32."""
        if keep is not None:
            p = torch.where(keep[:, None, :, None], p, p.new_zeros(()))
        return p.to(torch.promote_types(x.dtype, torch.float32))


def step_mask(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor | None:
    """The mask [B, m] of a decode step's new tokens x [B, m, hidden] -> bool, or None when
    absent (or all ones, where values are checked on the host). Checked as an
    attention_mask, its values on the host or on the device (`checks_on_host`: no host
    synchronisation per token on a GPU)."""
    if mask is None or checks_on_host(x.device):
        return check_attention_mask(x, mask)
    return mask_on_device(mask, x.shape[0], x.shape[1], x.device)


class WholeSequence:
    """How a PaTH layer meets its sequence, the seam `PaTHAttention.sequence`: this default
    holds every token of each sequence in this process. An object with the same two methods
    changes where the tokens are without touching the layer: context parallelism
    (`pathattn.ops.path.cp.attention`) installs one whose short convolution reads
    the previous shard's last tokens and whose attention is the ring op."""

    def short_conv(self, conv: ShortConv, u: torch.Tensor,
                   cu_seqlens: torch.Tensor | None) -> torch.Tensor:
        """The short causal conv of u [B, T, H*D] (not across packed boundaries)."""
        return conv(u, cu_seqlens)

    def attention(self, q, k, v, w, beta, g, *, cu_seqlens: torch.Tensor | None,
                  backend: str = "auto") -> torch.Tensor:
        """`path_attn` of the layer's op inputs on the layer's backend."""
        return path_attn(q, k, v, w, beta, g, cu_seqlens=cu_seqlens, backend=backend)


WHOLE_SEQUENCE = WholeSequence()


class PaTHAttention(AttentionProjections):
    """PaTH (or PaTH-FoX) attention layer (equations in the module docstring).

    Args:
        hidden_size: model width.
        num_heads: HQ query heads.
        num_kv_heads: H key/value heads (default HQ; HQ must be a multiple: GQA / MQA);
            w and beta are per key/value head, forget gates per query head.
        head_dim: D (default hidden_size // num_heads).
        w_rank: rank of the w projection (None or 0: one full-rank Linear).
        conv_size: kernel size K of the short causal conv on w (paper: 3).
        use_forget_gate: PaTH-FoX forget gates g = logsigmoid(Linear(hidden, HQ)(x)).
        qk_norm: per-head RMSNorm of q and k.
        beta_max: beta = beta_max * sigmoid(.) in [0, beta_max) strictly; in (0, 2]. Use
            e.g. 1.99 for bf16 training (docs/layers.md).
        bias, o_bias: biases of the q, k, v and of the o projections (o_bias None: bias).
        norm_eps: epsilon of the QK RMSNorm.
        backend: the op's backend in every path, "auto" or a registered name.
        num_reflections: R >= 1 Householder reflections per token and key/value head.

    x is [B, T, hidden_size] in the weights' dtype (any float dtype under torch.autocast;
    ValueError otherwise); outputs have x's dtype. T = 0 gives an empty output.

    `sequence` (`WholeSequence`) is the seam through which training runs its short
    convolution and attention: parallelism replaces it, the layer's code stays as it is.
    """

    sequence: WholeSequence = WHOLE_SEQUENCE

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int | None = None,
                 head_dim: int | None = None, w_rank: int | None = 32, conv_size: int = 3,
                 use_forget_gate: bool = False, qk_norm: bool = False, beta_max: float = 2.0,
                 bias: bool = False, norm_eps: float = 1e-6, o_bias: bool | None = None,
                 backend: str = "auto", num_reflections: int = 1):
        super().__init__(hidden_size, num_heads, num_kv_heads, head_dim, qk_norm, bias,
                         norm_eps, o_bias)
        self.num_reflections = _positive_int("num_reflections", num_reflections)
        self.backend = check_backend_name(backend)
        if isinstance(beta_max, bool) or not isinstance(beta_max, numbers.Real) or not (
                0 < beta_max <= 2):
            raise ValueError(f"beta_max must be a number in (0, 2], got {beta_max!r}")
        if w_rank is not None and (isinstance(w_rank, bool) or not isinstance(
                w_rank, numbers.Integral) or w_rank < 0):
            raise ValueError(f"w_rank must be a non-negative int or None, got {w_rank!r}")
        self.beta_max = float(beta_max)
        self.w_rank = int(w_rank) if w_rank else None
        self.use_forget_gate = bool(use_forget_gate)
        C = self.num_kv_heads * self.num_reflections * self.head_dim  # w features [H, R, D]
        if self.w_rank is None:
            self.w_proj = nn.Linear(self.hidden_size, C, bias=False)
        else:
            self.w_proj = nn.Sequential(nn.Linear(self.hidden_size, self.w_rank, bias=False),
                                        nn.Linear(self.w_rank, C, bias=False))
        self.w_conv = ShortConv(C, conv_size)
        self.beta_proj = nn.Linear(self.hidden_size, self.num_kv_heads * self.num_reflections,
                                   bias=True)
        self.g_proj = None
        if self.use_forget_gate:
            self.g_proj = nn.Linear(self.hidden_size, self.num_heads, bias=True)
            init_forget_gate_bias(self.g_proj.bias)

    # ---------------------------------------------------------------- per-token inputs

    def unit_w(self, w_conv: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Short-conv output [B, T, H*D] -> unit w [B, T, H, D] (zero stays zero) in `dtype`
        (default w_conv's), normalised in float32 and rounded toward zero for 16-bit
        dtypes: |w| <= 1 (module docstring). R > 1 reflections: [B, T, H*R*D] ->
        [B, T, H, R, D], each direction normalised on its own."""
        B, T, _ = w_conv.shape
        dtype = w_conv.dtype if dtype is None else dtype
        if self.num_reflections == 1:
            w = w_conv.view(B, T, self.num_kv_heads, self.head_dim)  # [B, T, H, D]
        else:  # [B, T, H, R, D]
            w = w_conv.view(B, T, self.num_kv_heads, self.num_reflections, self.head_dim)
        gd = gate_dtype(w_conv)
        with no_autocast(w_conv.device.type):
            w = F.normalize(w if w.dtype == gd else w.to(gd), dim=-1)
        if dtype in (torch.float16, torch.bfloat16):
            return round_toward_zero(w, dtype)
        return w if w.dtype == dtype else w.to(dtype)

    def beta(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, hidden] -> beta [B, T, H] in [0, beta_max), float32 (float64 for float64
        x): beta_max * sigmoid(.) capped strictly below beta_max (module docstring);
        [B, T, H, R] with R > 1 reflections."""
        z = full_precision_linear(self.beta_proj, x, gate_dtype(x))
        return self._split_beta(strict_cap(self.beta_max * torch.sigmoid(z), self.beta_max))

    def _split_beta(self, beta: torch.Tensor) -> torch.Tensor:
        """beta [B, T, H*R] -> [B, T, H] (R = 1: as it is) or [B, T, H, R]."""
        if self.num_reflections == 1:
            return beta
        return beta.unflatten(-1, (self.num_kv_heads, self.num_reflections))

    def forget_gate(self, x: torch.Tensor) -> torch.Tensor | None:
        """x [B, T, hidden] -> log forget gates g [B, T, HQ] (<= 0) in float32 (float64 for
        float64 x), or None without gates."""
        if self.g_proj is None:
            return None
        return F.logsigmoid(full_precision_linear(self.g_proj, x, gate_dtype(x)))

    def fused_projection(self) -> FusedProjection:
        """The input projections q, k, v, the first (or only) w projection, beta and g (when
        present), stacked into one matrix for decode steps (`step_inputs`)."""
        w_in = self.w_proj if self.w_rank is None else self.w_proj[0]
        gates = [self.beta_proj] + ([] if self.g_proj is None else [self.g_proj])
        return FusedProjection([self.q_proj, self.k_proj, self.v_proj, w_in] + gates)

    def step_inputs(self, x: torch.Tensor, projection: FusedProjection):
        """`op_inputs`' projections for x [B, m, hidden] through `projection` (one product
        when x has the gates' dtype and autocast is off, else one for q, k, v, w's input
        and one for beta and g in their float32 / float64). Returns q [B, m, HQ, D],
        k, v [B, m, H, D], u [B, m, H*R*D] the short conv's input, beta [B, m, H] ([B, m, H,
        R] for R > 1 reflections) and g [B, m, HQ] or None, with the precision of
        `op_inputs`."""
        B, m, _ = x.shape
        gd = gate_dtype(x)
        if x.dtype == gd and not autocast_enabled(x.device.type):
            q, k, v, u, *gates = projection(x)  # [B, m, N] split per projection
        else:  # q, k, v, u as nn.Linear computes them; beta and g in gd, no autocast
            q, k, v, u = projection(x, 0, 4)
            with no_autocast(x.device.type):
                gates = projection(x, 4, dtype=gd)
        if self.w_rank is not None:
            u = self.w_proj[1](u)  # [B, m, H*R*D]
        q = q.view(B, m, self.num_heads, self.head_dim)  # [B, m, HQ, D]
        k = k.view(B, m, self.num_kv_heads, self.head_dim)  # [B, m, H, D]
        v = v.view(B, m, self.num_kv_heads, self.head_dim)  # [B, m, H, D]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        beta = self.beta_max * torch.sigmoid(gates[0])
        if torch.compiler.is_compiling():  # the bound as a tensor: no host read in a graph
            beta = strict_cap(beta, self.beta_max)
        else:
            beta = beta.clamp_max_(strict_cap_value(self.beta_max, beta.dtype))  # the same
        beta = self._split_beta(beta)
        g = F.logsigmoid(gates[1]) if self.g_proj is not None else None
        return q, k, v, u, beta, g

    def op_inputs(self, x: torch.Tensor, w_conv: torch.Tensor):
        """What the op receives for x [B, T, hidden] and the short conv's output w_conv
        [B, T, H*D]: (q, k, v, w, beta, g), w in q's dtype, beta and g in float32."""
        q, k, v = self.qkv(x)
        xg = x.to(gate_dtype(x))  # one float32 copy for beta and g (autograd saves it once)
        return q, k, v, self.unit_w(w_conv, q.dtype), self.beta(xg), self.forget_gate(xg)

    # ------------------------------------------------------------------------ training

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """Training path. x [B, T, hidden]; cu_seqlens [N + 1] int (B == 1) packs sequences:
        neither the short conv nor attention crosses a boundary. Returns y [B, T, hidden]."""
        self.check_input(x)
        check_packing(x, cu_seqlens)
        seq = self.sequence
        inputs = self.op_inputs(x, seq.short_conv(self.w_conv, self.w_proj(x), cu_seqlens))
        with no_autocast(x.device.type):
            o = seq.attention(*inputs, cu_seqlens=cu_seqlens, backend=self.backend)
        return self.out(o)

    # ----------------------------------------------------------------------- inference

    def prefill(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None,
                history: bool = False) -> tuple[torch.Tensor, LayerCache]:
        """A prompt x [B, T, hidden]; attention_mask [B, T] (1 = token, 0 = masked token,
        anywhere: left padding or holes; a masked token is removed from its row).

        Returns (y [B, T, hidden], cache): y equals `forward` on each row's real tokens
        alone (rows at masked positions are o_proj(0)); the cache feeds `decode`. history:
        the cache keeps every position's raw inputs (memory about twice the key cache's):
        it can then be truncated to any length and give `step_attention_weights`.
        """
        self.check_input(x)
        mask = check_attention_mask(x, attention_mask)
        u = self.w_proj(x)  # [B, T, H*R*D] conv inputs
        w_conv, conv_state = self.w_conv.prefill(u, mask)
        inputs = self.op_inputs(x, w_conv)
        with no_autocast(x.device.type):
            o, attn = path_attn_prefill(*inputs, attention_mask=mask, backend=self.backend,
                                        history=history)
        inputs_kept = None
        if history:
            inputs_kept = u.detach() if mask is None else u.detach() * mask[..., None]
        return self.out(o), LayerCache(attn, conv_state, inputs_kept)

    @torch.no_grad()
    def decode(self, x: torch.Tensor, cache: LayerCache,
               mask: torch.Tensor | None = None) -> torch.Tensor:
        """m new tokens x [B, m, hidden] after the cache (updated in place); mask: None or
        [B, m] 0 / 1, 0 at masked tokens (removed, as in `prefill`). Returns y [B, m, hidden]:
        the last m rows of `forward` on each row's real tokens (m = 0: empty, the cache
        unchanged). No gradients. The first step stacks the input projections' weights into
        `cache.projection`; later steps of this cache reuse them (a weight change reaches
        the next cache, not this one)."""
        self.check_input(x)
        if not isinstance(cache, LayerCache):
            raise ValueError(f"cache must be the LayerCache of prefill, got "
                             f"{type(cache).__name__}")
        if x.shape[1] == 0:
            return self.empty_output(x)
        keep = None if mask is None else step_mask(x, mask)
        if cache.projection is None:
            cache.projection = self.fused_projection()
        q, k, v, u, beta, g = self.step_inputs(x, cache.projection)
        if keep is not None:
            u = u * keep[..., None].to(u.dtype)
        w_conv, hist = self._conv_step(u, cache.conv_state, keep)
        with no_autocast(x.device.type):
            o = path_attn_step(q, k, v, self.unit_w(w_conv, q.dtype), beta, g,
                               state=cache.attn, backend=self.backend, mask=keep)
        cache.update(u, hist[:, hist.shape[1] - cache.conv_state.shape[1]:])
        return self.out(o)

    def _conv_step(self, u: torch.Tensor, state: torch.Tensor, keep: torch.Tensor | None):
        """The short conv's step of u [B, m, C] (zero at masked tokens) after state
        [B, K-1, C] -> (w_conv [B, m, C], history [B, K-1+m, C]), as `ShortConv.step`. One
        token per row with a mask: the plain step, and the history of a masked token is
        [0, state] (the state unchanged: the conv skips it), as the masked step gives, in
        two elementwise ops instead of its sort and gathers; the conv output of a masked
        token differs, but its w is zeroed by the op (`path_attn_step`'s mask)."""
        if keep is None or u.shape[1] != 1:
            return self.w_conv.step(u, state, keep)
        w_conv, hist = self.w_conv.step(u, state)  # [B, 1, C], [B, K, C]
        skipped = torch.cat([hist[:, -1:], hist[:, :-1]], dim=1)  # [B, K, C]: [0, state]
        return w_conv, torch.where(keep[:, :, None], hist, skipped)

    # ------------------------------------------------------------------ inspection

    def attention_weights(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None
                          ) -> torch.Tensor:
        """The attention probabilities of the prompt x [B, T, hidden] (attention_mask as in
        `prefill`): [B, HQ, T, T], by the float64 reference (`path_attn_weights`) on the
        op's inputs, rows of masked queries zero, in x's dtype promoted to float32. Cost:
        T sequential steps of O(T * HQ * D) float64 work, beside the forward."""
        self.check_input(x)
        mask = check_attention_mask(x, attention_mask)
        q, k, _, w, beta, g = self.op_inputs(x, self.w_conv.prefill(self.w_proj(x), mask)[0])
        if mask is not None:  # masked tokens transform nothing
            w, beta = w * mask.view(mask.shape + (1,) * (w.ndim - 2)), \
                beta * mask.view(mask.shape + (1,) * (beta.ndim - 2))
            g = None if g is None else g * mask[..., None]
        p = path_attn_weights(q, k, w, beta, g, key_mask=mask)
        return self.weights_out(p, x, mask)

    def step_attention_weights(self, x: torch.Tensor, cache: LayerCache,
                               mask: torch.Tensor | None = None) -> torch.Tensor:
        """After `decode(x, cache, mask)`: the probabilities of its m new queries over all n
        positions, [B, HQ, m, n], by the float64 reference from the cache's history of raw
        inputs (ValueError for a cache prefilled without history). Cost: n sequential steps
        of O(m * HQ * D) float64 work."""
        self.check_input(x)
        hist = cache.attn.history_inputs()
        q = self.qkv(x)[0]
        p = path_attn_weights(q, hist.k, hist.w, hist.beta, hist.g, key_mask=cache.key_mask)
        return self.weights_out(p, x, None if mask is None else step_mask(x, mask))
