"""Reference implementations of PaTH / PaTH-FoX attention: the oracles of the tests.

The functions compute, for each sequence and each query head, the paper's definition
(section 2.2, "PaTH-FoX" paragraph) with H_t = I - beta_t w_t w_t^T, or, with R reflections
per token, H_t = H_{t,1} H_{t,2} ... H_{t,R}, H_{t,r} = I - beta_{t,r} w_{t,r} w_{t,r}^T:

    logit(i, j) = scale * k_j^T H_{j+1} H_{j+2} ... H_i q_i  +  (G_i - G_j),   j <= i
    o_i         = sum_j softmax_j(logit(i, .)) v_j

where G is the cumulative sum over time of the log forget gates g (G = 0 without gates).
They are written for clarity, not speed: O(T^2) memory, float64 by default.

* `path_attn_naive` applies the transforms one token at a time (the definition itself).
* `path_attn_weights` returns the attention probabilities themselves (the definition's
  sweep, for the last rows of a sequence: what a model reports as its attentions).
* `path_attn_full_matrix` uses the masked UT transform of section 3.2:

      A     = (I + strictLower(diag(beta) W W^T))^{-1} diag(beta)          [T, T]
      logit = tril(Q K^T) - tril(Q W^T) A strictLower(W K^T)               [T, T]

  (A is the paper's T^{-1}.) With R reflections per token the same formula runs over the
  L * R reflections, reflection l = t * R + r of token t = l // R, and the two masks read
  the token of each reflection: query i takes the reflections of tokens <= i, key j those
  of tokens > j.

Shapes follow `pathattn.path_attn`: q [B, T, HQ, D]; k [B, T, H, D]; v [B, T, H, Dv];
w [B, T, H, D] and beta [B, T, H] (one reflection per token), or w [B, T, H, R, D] and
beta [B, T, H, R]; g [B, T, HQ] or None; cu_seqlens [N + 1] with B == 1 for packed
sequences. Query head h uses key/value head h // (HQ // H).
"""

from __future__ import annotations

import torch

from ..common.heads import expand_kv_heads

__all__ = ["path_attn_naive", "path_attn_full_matrix", "path_attn_weights"]


def _segments(T: int, B: int, cu_seqlens: torch.Tensor | None) -> list[tuple[int, int, int]]:
    """(batch index, start, end) of every sequence."""
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)]
    bounds = [int(x) for x in cu_seqlens.tolist()]
    return [(0, s, e) for s, e in zip(bounds[:-1], bounds[1:], strict=True) if e > s]


def _softmax_out(logits: torch.Tensor, G: torch.Tensor | None, v: torch.Tensor) -> torch.Tensor:
    """logits [HQ, T, T] (scaled, -inf above the diagonal), G [T, HQ] or None, v [T, HQ, Dv]."""
    if G is not None:
        Gt = G.transpose(0, 1)  # [HQ, T]
        L = Gt.shape[1]
        causal = torch.ones(L, L, dtype=torch.bool, device=G.device).tril()
        # the gate term exists for j <= i only: a non-finite G_j must not reach rows i < j
        logits = logits + (Gt[:, :, None] - Gt[:, None, :]).masked_fill(~causal, 0)
    p = torch.softmax(logits, dim=-1)  # [HQ, T, T]
    if bool(torch.isfinite(v).all()):
        return torch.einsum("hij,jhd->ihd", p, v)  # [T, HQ, Dv]
    # o_i sums over j <= i only: a non-finite v_j must not reach rows i < j through 0 * inf
    rows = [torch.einsum("hj,jhd->hd", p[:, i, : i + 1], v[: i + 1]) for i in range(v.shape[0])]
    return torch.stack(rows, dim=0)  # [T, HQ, Dv]


def _run(one_sequence, q, k, v, w, beta, g, scale, cu_seqlens, dtype):
    B, T, HQ, D = q.shape
    H = k.shape[2]
    groups = HQ // H
    scale = D**-0.5 if scale is None else scale
    cast = (lambda x: x.to(dtype)) if dtype is not None else (lambda x: x)
    out = torch.zeros(B, T, HQ, v.shape[-1], dtype=dtype or q.dtype, device=q.device)
    pieces = []
    for b, s, e in _segments(T, B, cu_seqlens):
        qs, ks, vs, ws = (cast(x[b, s:e]) for x in (q, k, v, w))
        bs = cast(beta[b, s:e])
        G = None if g is None else torch.cumsum(cast(g[b, s:e]), dim=0)  # [L, HQ]
        ks, vs, ws, bs = (expand_kv_heads(x, groups) for x in (ks, vs, ws, bs))
        if ws.ndim == 3:  # one reflection per token: [L, HQ, 1, D]
            ws, bs = ws[:, :, None], bs[:, :, None]
        logits = one_sequence(qs, ks, ws, bs) * scale  # [HQ, L, L]
        pieces.append(((b, s, e), _softmax_out(logits, G, vs)))
    # assemble without in-place writes so that autograd flows through every piece
    rows = []
    for b in range(B):
        segs = sorted((se, o) for (bb, *se), o in pieces if bb == b)
        parts, cursor = [], 0
        for (s, e), o in segs:
            if s > cursor:
                parts.append(out[b, cursor:s])
            parts.append(o)
            cursor = e
        if cursor < T:
            parts.append(out[b, cursor:T])
        rows.append(torch.cat(parts, dim=0))
    return torch.stack(rows, dim=0)


def _logits_naive(q, k, w, beta):
    """Sequential definition. q, k [L, HQ, D], w [L, HQ, R, D], beta [L, HQ, R] -> logits
    [HQ, L, L].

    Walk the key index j from L-1 down to 0 keeping, for every query i >= j,
    x_i = H_{j+1} ... H_i q_i; then logit(i, j) = k_j . x_i, and stepping to j-1
    applies H_j = H_{j,1} ... H_{j,R} to every x_i with i >= j (H_{j,R} first).
    """
    L = q.shape[0]
    x = q  # x[i] = H_{j+1} ... H_i q_i for the current j (empty product when i == j)
    idx = torch.arange(L, device=q.device)
    neg_inf = torch.tensor(float("-inf"), dtype=q.dtype, device=q.device)
    columns = []
    for j in range(L - 1, -1, -1):
        col = torch.einsum("ihd,hd->hi", x, k[j])  # [HQ, L]
        columns.append(torch.where(idx >= j, col, neg_inf))
        for r in range(w.shape[2] - 1, -1, -1):
            # x_i <- H_{j,r} x_i = x_i - beta_{j,r} (w_{j,r} . x_i) w_{j,r}   for i >= j
            wr = w[j, :, r]  # [HQ, D]
            proj = torch.einsum("ihd,hd->ih", x, wr) * beta[j, :, r]  # [L, HQ]
            upd = proj[:, :, None] * wr[None]  # [L, HQ, D]
            x = x - torch.where((idx >= j)[:, None, None], upd, torch.zeros_like(upd))
    return torch.stack(columns[::-1], dim=-1)  # [HQ, L(i), L(j)]


def _logits_full_matrix(q, k, w, beta):
    """Masked UT form (section 3.2) over the L * R reflections. q, k [L, HQ, D],
    w [L, HQ, R, D], beta [L, HQ, R] -> logits [HQ, L, L]."""
    L, HQ, R, D = w.shape
    Q, K = (x.transpose(0, 1) for x in (q, k))  # [HQ, L, D]
    W = w.transpose(0, 1).reshape(HQ, L * R, D)  # [HQ, L*R, D], reflection l = t * R + r
    bt = beta.transpose(0, 1).reshape(HQ, L * R)  # [HQ, L*R]
    eye = torch.eye(L * R, dtype=q.dtype, device=q.device)
    Tm = eye + torch.tril(bt[:, :, None] * (W @ W.transpose(1, 2)), diagonal=-1)  # [HQ, LR, LR]
    A = torch.linalg.solve_triangular(Tm, torch.diag_embed(bt), upper=False, unitriangular=True)
    QK = Q @ K.transpose(1, 2)
    token = torch.arange(L * R, device=q.device) // R  # token of each reflection
    pos = torch.arange(L, device=q.device)
    QW = (Q @ W.transpose(1, 2)) * (token[None, :] <= pos[:, None])  # [HQ, L, LR]: token <= i
    WK = (W @ K.transpose(1, 2)) * (token[:, None] > pos[None, :])  # [HQ, LR, L]: token > j
    logits = QK - QW @ A @ WK
    mask = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    return logits.masked_fill(~mask, float("-inf"))


def path_attn_naive(q, k, v, w, beta, g=None, *, scale=None, cu_seqlens=None,
                    dtype=torch.float64):
    """PaTH attention by its definition, one Householder transform at a time.

    Args: as `pathattn.path_attn`. `dtype` is the precision of every operation
    (float64 by default; pass None to compute in the inputs' own dtype, which the tests
    use to measure the error of plain PyTorch at low precision).
    Returns o [B, T, HQ, Dv] in `dtype` (or the inputs' dtype when dtype is None).
    """
    return _run(_logits_naive, q, k, v, w, beta, g, scale, cu_seqlens, dtype)


def path_attn_full_matrix(q, k, v, w, beta, g=None, *, scale=None, cu_seqlens=None,
                          dtype=torch.float64):
    """PaTH attention through the full-matrix masked UT transform (paper section 3.2).

    Args and returns as `path_attn_naive`. Needs a triangular solve, so dtype must be
    float32 or float64.
    """
    return _run(_logits_full_matrix, q, k, v, w, beta, g, scale, cu_seqlens, dtype)


def path_attn_weights(q, k, w, beta, g=None, *, scale=None, key_mask=None,
                      dtype=torch.float64):
    """The attention probabilities of PaTH by its definition, for the last m positions of
    one sequence per row (m = T: the whole prompt).

    Args:
        q: [B, m, HQ, D] queries of positions T - m .. T - 1.
        k: [B, T, H, D]; w: [B, T, H, D] or [B, T, H, R, D]; beta: [B, T, H] or
            [B, T, H, R]; g: [B, T, HQ] log forget gates or None (as `path_attn_naive`).
        scale: logit scale, default D ** -0.5 (the gate term is not scaled).
        key_mask: None or bool [B, T]: False marks positions that are no key (masked
            tokens; their w, beta and g must be zero, so that they transform nothing).
        dtype: the computation's dtype (float64 by default).

    Returns p [B, HQ, m, T] in `dtype`: softmax_j(logit(i, j)) over the allowed keys j <= i;
    a row without any allowed key is zero. Cost: T sequential steps of O(m * HQ * R * D)
    (the transforms applied to the queries one key position at a time, as
    `path_attn_naive` does), O(m * T) memory per head.
    """
    B, m, HQ, D = q.shape
    T, H = k.shape[1], k.shape[2]
    groups = HQ // H
    scale = D**-0.5 if scale is None else scale
    if w.ndim == 4:  # one reflection per token: [B, T, H, 1, D]
        w, beta = w[:, :, :, None], beta[..., None]
    kq = expand_kv_heads(k.transpose(1, 2).to(dtype), groups)  # [B, HQ, T, D]
    wq = expand_kv_heads(w.transpose(1, 2).to(dtype), groups)  # [B, HQ, T, R, D]
    bq = expand_kv_heads(beta.transpose(1, 2).to(dtype), groups)  # [B, HQ, T, R]
    x = q.transpose(1, 2).to(dtype)  # [B, HQ, m, D]: H_{j+1} ... H_i q_i for the current j
    pos = torch.arange(T - m, T, device=q.device)  # [m] position of each query
    cols = []
    for j in range(T - 1, -1, -1):
        cols.append(x @ kq[:, :, j, :, None])  # [B, HQ, m, 1]
        live = (pos >= j).to(dtype)[:, None]  # [m, 1]: queries the transform H_j reaches
        for r in range(wq.shape[3] - 1, -1, -1):  # x <- H_{j,r} x, H_{j,R} first
            wr = wq[:, :, j, r, :, None]  # [B, HQ, D, 1]
            x = x - (x @ wr) * bq[:, :, j, r, None, None] * live * wr.mT
    logits = torch.cat(cols[::-1], dim=-1) * scale  # [B, HQ, m, T]
    if g is not None:
        G = g.to(dtype).cumsum(1).transpose(1, 2)  # [B, HQ, T]
        Gi = G[:, :, T - m:, None]  # [B, HQ, m, 1]
        logits = logits + (Gi - G[:, :, None, :])
    allowed = torch.arange(T, device=q.device)[None, :] <= pos[:, None]  # [m, T]
    allowed = allowed[None, None]
    if key_mask is not None:
        allowed = allowed & key_mask.to(torch.bool)[:, None, None, :]
    p = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    return torch.nan_to_num(p, nan=0.0)  # rows without a key: 0 / 0
