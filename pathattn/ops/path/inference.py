"""PaTH attention inference: prefill and incremental steps over a `PaTHCache` (section 3.4).

Prefill of a prompt of length P: the output is `path_attn`'s; the cache gets the keys
transformed by every later prompt token, k_j^(P) = H_{P-1} ... H_{j+1} k_j, computed
blockwise from the per-block UT quantities with suffix products of the block transitions
(the paper's "reuse the suffix cumulative product"). Without autograd the forward's own
block quantities give the keys (`path_attn_with_keys`: about 5 % beyond the forward);
when the output must be differentiable, a separate key-only UT pass does
(`cache.key_transforms`).

Step of m >= 1 new tokens at positions [T, T + m) (decode: m = 1; speculative drafts: m > 1).
With the chunk as one UT block (`ut.block_ut`): the boundary-adjusted queries
q~_i = H_T ... H_i q_i see the cache as plain attention, logit(i, j < T) =
scale * (k_j^(T))^T q~_i; inside the chunk the logits are the in-block UT logits; gates add
G_i - G_j (not scaled). The chunk's keys, transformed inside the chunk, join the cache, and
the chunk's transition P = H_T ... H_{T+m-1} is applied to the earlier keys (lazily: see
the pending window of `cache.py`). Decode costs one pass over the cached keys and values per
step (O(T * D) per head) plus, every `max_pending_tokens` steps, one (T x D) @ (D x D) GEMM.

Masked tokens: `attention_mask` [B, P] in the prefill and `mask` [B, m] in a step (1 =
token, 0 = masked, zeros anywhere: left padding is the common case). A masked token is
removed from its row: the real tokens run packed (`cu_seqlens`, `MaskedRows`) through
`path_attn`; in the cache masked tokens have k = v = 0, the identity transform (w = 0,
beta = 0), g = 0, and no key (`key_mask`). Each row equals its real tokens run alone.

Inference only: the step output and the cache carry no gradients (the prefill output is
`path_attn`'s and is differentiable as usual).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from ...utils.value_checks import checks_on_host, mask_on_device
from ..common.heads import compute_dtype, default_scale
from ..common.padding import MaskedRows, check_attention_mask
from .api import path_attn, path_attn_with_keys
from .backends import select_backend
from .cache import History, PaTHCache, Transition, key_transforms
from .stages import num_reflections, single_reflection
from .ut import block_ut
from .validation import check_path_attn_inputs

__all__ = ["path_attn_prefill", "path_attn_step"]

UT_PAD = 64  # chunks longer than this are padded to a multiple of it for `block_ut`


def _cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in dtype; x itself when it has it (no dispatched op: a decode step is latency
    bound)."""
    return x if x.dtype == dtype else x.to(dtype)


def _head_major(x: torch.Tensor, cd: torch.dtype) -> torch.Tensor:
    """[B, T, H, *F] -> [B, H, T, *F] (a view when no cast is needed)."""
    return _cast(x, cd).transpose(1, 2)


# ----------------------------------------------------------------------------- prefill


def path_attn_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor,
                      beta: torch.Tensor, g: torch.Tensor | None = None, *,
                      scale: float | None = None,
                      attention_mask: torch.Tensor | None = None,
                      backend: str = "auto", history: bool = False
                      ) -> tuple[torch.Tensor, PaTHCache]:
    """Causal PaTH attention over a prompt, plus the cache for `path_attn_step`.

    Args:
        q, k, v, w, beta, g, scale: as `pathattn.path_attn`: q [B, T, HQ, D]; k, w
            [B, T, H, D]; v [B, T, H, Dv]; beta [B, T, H]; g [B, T, HQ] log forget gates or
            None. R reflections per token: w [B, T, H, R, D], beta [B, T, H, R].
        attention_mask: optional [B, T] (bool or integer 0 / 1): 1 for real tokens, 0 for
            masked ones, anywhere (module docstring). Each row then equals its real tokens
            run alone; output rows at masked tokens are zero.
        backend: as `path_attn` (`pathattn.ops.path.backends`). Without autograd the output and
            the cached keys come from one blockwise pass ("cpu" or "torch"; "auto" picks
            one); a backend without transformed keys ("triton") or a differentiable output
            runs the op and a separate key-only pass.
        history: keep the raw k, w, beta, g of every position in the cache (about the
            key cache's memory again), so that it can be truncated to any length.

    Returns (o, state): o [B, T, HQ, Dv] in q's dtype, equal to `path_attn`; state a
    `PaTHCache` holding the keys transformed by every later prompt token (compute dtype:
    float32, or float64 for float64 inputs), the values and (with gates) the float64 gate
    cumsums.
    """
    check_path_attn_inputs(q, k, v, w, beta, g, scale, None)
    w, beta = single_reflection(w, beta)  # R = 1 runs as w [B, T, H, D]
    impl = select_backend(backend, q, num_reflections(w))
    B, T, HQ, _ = q.shape
    mask = check_attention_mask(attention_mask, B, T, q.device)
    inputs = (q, k, v, w, beta, g)
    one_pass = backend == "auto" or impl.with_keys is not None
    if one_pass and not (torch.is_grad_enabled() and any(
            x is not None and x.requires_grad for x in inputs)):
        # one pass: the forward's own UT quantities also give the cached keys
        o, keys = _prefill_output(q, k, v, w, beta, g, scale, mask, backend, with_keys=True)
    else:  # the op (with autograd where asked), keys by a separate UT pass
        o = _prefill_output(q, k, v, w, beta, g, scale, mask, backend)
        keys = None
    with torch.no_grad():
        state = _prefill_state(k, v, w, beta, g, mask, HQ, keys, history)
    return o, state


def _prefill_output(q, k, v, w, beta, g, scale, mask: torch.Tensor | None, backend: str,
                    with_keys: bool = False):
    """path_attn on the prompts; with masked tokens, each row's masked and real tokens as
    two sequences of one packed batch (`MaskedRows`), output zero at masked tokens.

    with_keys: also return the transformed keys [B, T, H, D] (zero at masked tokens),
    computed in the same pass (`path_attn_with_keys`, no autograd)."""
    if mask is None:
        if with_keys:
            return path_attn_with_keys(q, k, v, w, beta, g, scale=scale, backend=backend)
        return path_attn(q, k, v, w, beta, g, scale=scale, backend=backend)
    pad = MaskedRows(mask)
    packed = [pad.pack(x) for x in (q, k, v, w, beta, g)]
    if with_keys:
        o, keys = path_attn_with_keys(*packed, scale=scale, cu_seqlens=pad.cu_seqlens,
                                      backend=backend)
        return pad.unpack(o), pad.unpack(keys)
    return pad.unpack(path_attn(*packed, scale=scale, cu_seqlens=pad.cu_seqlens,
                                backend=backend))


def _prefill_state(k, v, w, beta, g, mask: torch.Tensor | None, HQ: int,
                   keys: torch.Tensor | None = None, history: bool = False) -> PaTHCache:
    """Cache of the prompt: masked tokens get k = v = 0, w = 0, beta = 0 (identity), g = 0
    and no key. keys: the transformed keys [B, T, H, D] when already computed
    (`path_attn_with_keys`); history: keep the raw inputs (`PaTHCache`)."""
    B, T = k.shape[:2]
    cd = compute_dtype(k.dtype)
    keep = None if mask is None else mask[:, None, :].to(cd)  # [B, 1, T]
    vh = _head_major(v, cd)  # [B, H, T, Dv]
    if keep is not None:
        vh = vh * keep[..., None]
    raw = None
    if keys is None or history:  # the (masked-zeroed) raw inputs, head-major
        kh, wh = (_head_major(x, cd) for x in (k, w))  # [B, H, T, D] or [B, H, T, R, D]
        bh = _head_major(beta, cd)  # [B, H, T] or [B, H, T, R]
        if w.ndim == 4:  # one reflection per token: [B, H, T, 1, D], [B, H, T, 1]
            wh, bh = wh[:, :, :, None], bh[..., None]
        if keep is not None:
            kh, wh, bh = kh * keep[..., None], wh * keep[..., None, None], bh * keep[..., None]
        raw = (kh, wh, bh)
    if keys is None:  # a key-only UT pass over the (masked-zeroed) prompt
        kn = key_transforms(raw[0], raw[1].flatten(2, 3), raw[2].flatten(2, 3))[0]
    else:  # already zero at masked tokens
        kn = _head_major(keys, cd)
    start = torch.zeros(B, dtype=torch.long, device=k.device)
    if mask is not None:  # first real position
        start = torch.where(mask.any(1), mask.to(torch.uint8).argmax(1), T)
    g64 = G = None
    if g is not None:
        g64 = g.to(torch.float64)
        if mask is not None:
            g64 = g64 * mask[..., None]
        g64 = g64.transpose(1, 2)  # [B, HQ, T]
        G = g64.cumsum(-1)
    hist = None
    if history:
        hist = History(*raw, g64)  # copied into the cache's buffers
    return PaTHCache(kn, vh, G, start, HQ, padded=mask is not None,
                     reflections=num_reflections(w), key_mask=mask, history=hist)


# ----------------------------------------------------------------------------- step


class ChunkUT(NamedTuple):
    """UT quantities of the m > 1 new tokens of a step (R = Gr * m query rows, head-major)."""

    qt: torch.Tensor  # [B, H, R, D]  scale * q~_i, q~_i = H_T ... H_i q_i
    kt: torch.Tensor  # [B, H, m, D]  keys transformed inside the chunk
    s: torch.Tensor  # [B, H, R, m]   scale * in-chunk logits, -inf above the diagonal
    tr: Transition  # the chunk's transition (and its raw w, beta)
    k: torch.Tensor  # [B, H, m, D]   raw keys (the cache rebuilds from them on truncate)


def path_attn_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor,
                   beta: torch.Tensor, g: torch.Tensor | None = None, *, state: PaTHCache,
                   scale: float | None = None, backend: str = "auto",
                   mask: torch.Tensor | None = None) -> torch.Tensor:
    """PaTH attention of m >= 1 new tokens against the cache and each other.

    Args:
        q [B, m, HQ, D], k, w [B, m, H, D], v [B, m, H, Dv], beta [B, m, H], g [B, m, HQ] or
            None: the new tokens, as in `path_attn` (g required iff the prefill had gates);
            R reflections per token: w [B, m, H, R, D], beta [B, m, H, R].
        state: the `PaTHCache` of `path_attn_prefill`; updated in place (the tokens are
            appended; their transforms reach the earlier keys, lazily).
        scale: logit scale, default D ** -0.5 (the gate term is not scaled).
        backend: checked as `path_attn`'s; the step itself is PyTorch ops for every
            backend (one pass over the cache per token: memory-bound, no kernel needed).
        mask: None, or [B, m] bool / 0-1 with 0 at masked new tokens (module docstring);
            its values are checked on the host on the CPU, on the device elsewhere
            (`pathattn.utils.value_checks`: no host synchronisation per step on a GPU).

    Returns o [B, m, HQ, Dv] in q's dtype: the last m rows of `path_attn` on the whole
    sequence of each row's real tokens (zero at masked tokens). No gradients.
    """
    _check_step(q, k, v, w, beta, g, state, scale)
    keep = None
    if mask is not None and checks_on_host(q.device):
        keep = check_attention_mask(mask, q.shape[0], q.shape[1], q.device)
    elif mask is not None:  # values checked by the device: no host read per token
        keep = mask_on_device(mask, q.shape[0], q.shape[1], q.device)
    if keep is not None:  # masked tokens: k = v = 0, w = 0, beta = 0, g = 0, no key
        k, v, w, beta, g = (_zero_masked(x, keep) for x in (k, v, w, beta, g))
    key = (backend, q.dtype) if isinstance(backend, str) else None
    if torch.compiler.is_compiling():  # traced into guards: no cost per token, no new state
        select_backend(backend, q)
    elif key not in state.step_backends:  # checked once per cache and dtype
        select_backend(backend, q)
        state.step_backends.add(key)
    B, m, HQ, D = q.shape
    scale = default_scale(D, scale)
    with torch.no_grad():
        if state.window_len >= state.max_pending_tokens:
            state.commit()
        G = None
        if g is not None:  # [B, HQ, m] float64
            G = g.to(torch.float64).transpose(1, 2).cumsum(-1)
            G += state.last_gate_cumsum()[..., None]
        new = NewTokens(_head_major(v, state.dtype), G, keep,
                        None if g is None or not state.has_history else
                        g.to(torch.float64).transpose(1, 2))
        if m == 1:
            o = _decode_token(state, q, k, w, beta, new, scale)  # [B, H, Gr, Dv]
        else:
            o = _step_chunk(state, q, k, w, beta, new, scale)  # [B, H, Gr * m, Dv]
            H = o.shape[1]
            o = o.view(B, H, HQ // H, m, -1).permute(0, 3, 1, 2, 4)
    o = _cast(o.reshape(B, m, HQ, -1), q.dtype)
    return o if keep is None else _zero_masked(o, keep)


class NewTokens(NamedTuple):
    """What a step appends besides its keys and transforms."""

    v: torch.Tensor  # [B, H, m, Dv] values (compute dtype)
    G: torch.Tensor | None  # [B, HQ, m] float64 gate cumsums
    keep: torch.Tensor | None  # [B, m] bool, False at masked tokens; None: all real
    g: torch.Tensor | None  # [B, HQ, m] float64 raw log gates (kept with history)


def _zero_masked(x: torch.Tensor | None, keep: torch.Tensor) -> torch.Tensor | None:
    """x [B, m, ...] with the rows of masked tokens (keep [B, m] False) set to zero."""
    if x is None:
        return None
    return torch.where(keep.reshape(keep.shape + (1,) * (x.ndim - 2)), x, x.new_zeros(()))


def _decode_token(state: PaTHCache, q, k, w, beta, new: NewTokens,
                  scale: float) -> torch.Tensor:
    """One new token at position T: [B, H, Gr, Dv]. No UT transform is needed.

    Appending the token first turns the window rows [M ; window keys] into
    [M H_T ; window keys H_T ; k_T], so that one product qs @ rows^T (qs = scale * q) gives
    q~ M^T with q~ = H_T qs (the query for the committed keys), the window logits
    q~ . k_j^(T) and the token's own logit qs . k_T.
    """
    B, _, HQ, D = q.shape
    H, cd = state.num_heads, state.dtype
    qs = _cast(q, cd).reshape(B, H, HQ // H, D) * scale
    kh = _cast(k, cd).reshape(B, H, 1, D)
    wh = _cast(w, cd).reshape(B, H, -1, D)  # [B, H, R, D]: the token's R reflections
    T0 = state.committed_len
    state.append(kh, kh, Transition(wh, _cast(beta, cd).reshape(B, H, -1), None), new.v,
                 new.G, new.keep, new.g)
    Y = qs @ state.window_rows().mT  # [B, H, Gr, D + T + 1 - T0]
    return _attend(state, Y, T0, 1)


def _step_chunk(state: PaTHCache, q, k, w, beta, new: NewTokens,
                scale: float) -> torch.Tensor:
    """m > 1 new tokens (one UT block): [B, H, Gr * m, Dv]. The window rows are read with
    the boundary-adjusted queries before the chunk joins the window."""
    ch = _chunk_ut(q, k, w, beta, scale, state.dtype)
    T0 = state.committed_len
    Y = torch.cat([ch.qt @ state.window_rows().mT, ch.s], dim=-1)  # [B, H, R, D + n - T0]
    state.append(ch.kt, ch.k, ch.tr, new.v, new.G, new.keep, new.g)
    return _attend(state, Y, T0, q.shape[1])


def _chunk_ut(q, k, w, beta, scale: float, cd: torch.dtype) -> ChunkUT:
    """UT transform of the m new tokens as one block (padded to a multiple of 64 tokens
    when longer than that)."""
    B, m, HQ, D = q.shape
    H = k.shape[2]
    Gr = HQ // H
    qb = q.to(cd).view(B, m, H, Gr, D).permute(0, 2, 3, 1, 4)  # [B, H, Gr, m, D]
    kb, wb = (_head_major(x, cd) for x in (k, w))  # [B, H, m, D]
    bb = _head_major(beta, cd)  # [B, H, m]
    R = num_reflections(w)
    if w.ndim == 5:  # [B, H, m * R, D] and [B, H, m * R]: the reflections in order
        wb, bb = wb.flatten(2, 3), bb.flatten(2, 3)
    C = m if m <= UT_PAD else -(-m // UT_PAD) * UT_PAD
    pad = C - m  # identity tokens after the chunk (their rows are dropped)
    qp, kp = (F.pad(x, (0, 0, 0, pad)).contiguous() for x in (qb, kb))
    wp = F.pad(wb, (0, 0, 0, pad * R)).contiguous()
    ut = block_ut(qp, kp, wp, F.pad(bb, (0, pad * R)).contiguous(), scale)
    qt = ut.qt.view(B, H, Gr, C, D)[:, :, :, :m].reshape(B, H, Gr * m, D)
    upper = torch.ones(m, m, dtype=torch.bool, device=q.device).triu(1)
    s = ut.s_diag.view(B, H, Gr, C, C)[..., :m, :m].masked_fill(upper, float("-inf"))
    return ChunkUT(qt, ut.kt[:, :, :m], s.reshape(B, H, Gr * m, m),
                   Transition(wb, bb, ut.pt), kb)


def _attend(state: PaTHCache, Y: torch.Tensor, T0: int, m: int) -> torch.Tensor:
    """Softmax attention of the last m tokens' rows over all n = seq_len positions.

    Y [B, H, R, D + n - T0]: the query q~ M^T for the committed keys, then the logits of
    positions [T0, n) (window keys and the new tokens). One attention pass over the first
    n rows of the big key buffer (committed keys k_j^(t0), zeros from t0 on): the committed
    logits come from the keys, the others enter as the additive bias of their zero keys.
    Returns [B, H, R, Dv].
    """
    D, n = state.head_dim, state.seq_len
    if state.has_gates or state.padded:
        bias = _bias(state, m)  # [B, H, R, n]
        bias[..., T0:] += Y[..., D:]
    else:  # the window logits after T0 zeros
        bias = F.pad(Y[..., D:], (T0, 0))  # [B, H, R, n]
    return _attention(Y[..., :D], state.keys(n), state.values(n), bias)


def _bias(state: PaTHCache, m: int) -> torch.Tensor:
    """Additive logit terms of the last m rows against all n = seq_len positions,
    [B, H, R, n] (a new tensor): the gate term G_i - G_j (formed in float64) and -inf at
    masked positions."""
    n = state.seq_len
    B, H = state.batch_size, state.num_heads
    Gr = state.num_q_heads // H
    if state.has_gates:
        G = state.gate_cumsum(n).view(B, H, Gr, n)
        gate = G[..., n - m:, None] - G[..., None, :]  # [B, H, Gr, m, n] float64
        bias = gate.to(state.dtype).view(B, H, Gr * m, n)
    else:
        bias = torch.zeros(B, H, Gr * m, n, dtype=state.dtype, device=state.device)
    if state.padded:
        bias.masked_fill_(~state.key_mask[:, None, None, :], float("-inf"))
    return bias


def _attention(q: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
               bias: torch.Tensor) -> torch.Tensor:
    """softmax(q K^T + bias) V (no scale): q [B, H, R, D], K [B, H, n, D], V [B, H, n, Dv],
    bias [B, H, R, n]; returns [B, H, R, Dv]. On CPU, PyTorch runs its fused flash-attention
    kernel (float additive masks included): one pass over K and V.

    Under torch.compile the same softmax is spelled out, in float32 or wider: inductor's CPU
    lowering of SDPA with a bias fails on symbolic sizes in torch 2.13 ("Exponent must be
    non-negative"), which a decode loop gets as soon as the cache length or m changes.
    With R = m query rows the [R, n] logits are small."""
    if torch.compiler.is_compiling():
        acc = torch.promote_types(q.dtype, torch.float32)
        s = torch.matmul(q.to(acc), K.to(acc).transpose(-1, -2)) + bias.to(acc)
        return torch.matmul(torch.softmax(s, dim=-1), V.to(acc)).to(q.dtype)
    return F.scaled_dot_product_attention(q, K, V, attn_mask=bias, scale=1.0)


_FLOAT = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_step(q, k, v, w, beta, g, state, scale) -> None:
    """Shapes as `path_attn`, m >= 1, and agreement with the state. The common valid call
    is recognised with a few comparisons (decode is latency bound); anything else runs the
    full checks, whose errors name the argument."""
    if isinstance(state, PaTHCache) and _step_fits(q, k, v, w, beta, g, state, scale):
        return
    _diagnose_step(q, k, v, w, beta, g, state, scale)


def _step_fits(q, k, v, w, beta, g, state: PaTHCache, scale) -> bool:
    """True for a valid step with scale=None (checked without any error message)."""
    if scale is not None or not all(isinstance(x, torch.Tensor) for x in (q, k, v, w, beta)):
        return False
    if (g is not None) != state.has_gates or (g is not None and not isinstance(g, torch.Tensor)):
        return False
    B, H, D, HQ = state.batch_size, state.num_heads, state.head_dim, state.num_q_heads
    m = q.shape[1] if q.ndim == 4 else 0
    dev = state.device
    return (m >= 1 and q.shape == (B, m, HQ, D) and k.shape == (B, m, H, D)
            and w.shape[:3] + w.shape[-1:] == k.shape and w.ndim in (4, 5)
            and v.shape == (B, m, H, state.value_dim) and beta.shape == w.shape[:-1]
            and (w.ndim == 4 or w.shape[3] >= 1) and (g is None or g.shape == (B, m, HQ))
            and q.dtype in _FLOAT and k.dtype == v.dtype == w.dtype == q.dtype
            and compute_dtype(q.dtype) == state.dtype and beta.dtype.is_floating_point
            and (g is None or g.dtype.is_floating_point)
            and q.device == k.device == v.device == w.device == beta.device == dev
            and (g is None or g.device == dev))


def _diagnose_step(q, k, v, w, beta, g, state, scale) -> None:
    """The full step checks (ValueError naming the argument)."""
    if not isinstance(state, PaTHCache):
        raise ValueError(f"state must be a PaTHCache (from path_attn_prefill), got "
                         f"{type(state).__name__}")
    check_path_attn_inputs(q, k, v, w, beta, g, scale, None)
    B, m, HQ, D = q.shape
    H, Dv = k.shape[2], v.shape[3]
    if m < 1:
        raise ValueError("q: a step needs at least one new token (q.shape[1] = m >= 1), "
                         "got m=0")
    for name, got, want, what in (("q", B, state.batch_size, "batch size B"),
                                  ("k", H, state.num_heads, "key/value heads H"),
                                  ("q", HQ, state.num_q_heads, "query heads HQ"),
                                  ("q", D, state.head_dim, "head dim D"),
                                  ("v", Dv, state.value_dim, "value head dim Dv")):
        if got != want:
            raise ValueError(f"{name}: {what}={got} differs from the state's {want}")
    if (g is None) == state.has_gates:
        need = "pass g (the prefill had forget gates)" if state.has_gates else \
            "pass g=None (the prefill had no forget gates)"
        raise ValueError(f"g: {need}")
    if compute_dtype(q.dtype) != state.dtype:
        raise ValueError(f"q: dtype {q.dtype} computes in {compute_dtype(q.dtype)} but the "
                         f"state holds {state.dtype}")
    if q.device != state.device:
        raise ValueError(f"q is on {q.device} but the state is on {state.device}")
