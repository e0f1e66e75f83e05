"""The float64 oracles agree with each other and with the paper's definition (section 2.2):
naive == full-matrix (section 3.2), explicit Householder products, the softmax-attention and
FoX special cases, and packed sequences."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from pathattn.ops import path_attn_full_matrix, path_attn_naive

from ._helpers import assert_close_to_reference, make_dout, make_inputs, run_with_grads

REFERENCES = [pytest.param(path_attn_naive, id="naive"),
              pytest.param(path_attn_full_matrix, id="full_matrix")]
F64 = torch.float64


@pytest.mark.parametrize("B, T, HQ, H, gates, cu", [
    pytest.param(2, 23, 2, 2, False, None, id="mha"),
    pytest.param(2, 23, 4, 2, True, None, id="gqa-gates"),
    pytest.param(2, 23, 3, 1, True, None, id="mqa-gates"),
    pytest.param(1, 23, 4, 2, True, [0, 1, 9, 9, 23], id="cu_seqlens-gates"),
])
def test_naive_equals_full_matrix(B, T, HQ, H, gates, cu):
    D, Dv = 8, 5
    inputs = make_inputs(B, T, HQ, H, D, Dv, gates, F64)
    dout = make_dout(B, T, HQ, Dv)
    kw = {"cu_seqlens": None if cu is None else torch.tensor(cu)}
    naive = run_with_grads(path_attn_naive, inputs, dout, **kw)
    full = run_with_grads(path_attn_full_matrix, inputs, dout, **kw)
    assert_close_to_reference(full, naive, tol=1e-12)


def _softmax_attention(q, k, v, bias, scale):
    """Causal softmax attention with an additive logit bias, written out.

    q [B, T, HQ, D]; k [B, T, H, D]; v [B, T, H, Dv]; bias [B, HQ, T, T] -> [B, T, HQ, Dv].
    """
    groups = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)  # HQ heads
    s = scale * torch.einsum("bihd,bjhd->bhij", q, k) + bias  # [B, HQ, T, T]
    T = q.shape[1]
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", s.softmax(-1), v)


@pytest.mark.parametrize("scale", [None, 0.7], ids=["scale_default", "scale0.7"])
@pytest.mark.parametrize("fn", REFERENCES)
def test_beta_zero_is_causal_softmax_attention(fn, scale):
    B, T, HQ, H, D, Dv = 2, 17, 4, 2, 8, 6
    q, k, v, w, beta, _ = make_inputs(B, T, HQ, H, D, Dv, gates=False, dtype=F64)
    o = fn(q, k, v, w, torch.zeros_like(beta), scale=scale)  # every H_t = I
    groups = HQ // H
    ref = F.scaled_dot_product_attention(
        q.transpose(1, 2),  # [B, HQ, T, D]
        k.repeat_interleave(groups, dim=2).transpose(1, 2),
        v.repeat_interleave(groups, dim=2).transpose(1, 2),
        is_causal=True, scale=scale,
    ).transpose(1, 2)  # [B, T, HQ, Dv]
    torch.testing.assert_close(o, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fn", REFERENCES)
def test_identity_transforms_with_gates_is_fox_attention(fn):
    B, T, HQ, H, D, Dv = 2, 19, 4, 2, 8, 6
    q, k, v, w, beta, g = make_inputs(B, T, HQ, H, D, Dv, gates=True, dtype=F64)
    o = fn(q, k, v, torch.zeros_like(w), beta, g)  # w = 0: every H_t = I
    G = g.cumsum(1).transpose(1, 2)  # [B, HQ, T]
    bias = G[..., :, None] - G[..., None, :]  # [B, HQ, T, T]: G_i - G_j
    ref = _softmax_attention(q, k, v, bias, scale=D**-0.5)
    torch.testing.assert_close(o, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fn", REFERENCES)
def test_logits_are_explicit_householder_products(fn):
    """With v_j = e_j (one-hot, Dv = T) the output row o_i is the attention row p_i, built
    here from explicit D x D matrices: logit(i, j) = scale k_j^T H_{j+1} ... H_i q_i + G_i - G_j.
    w is not normalised: the definition does not need unit w."""
    T, HQ, D, scale = 6, 2, 5, 0.37
    q, k, _, w, beta, g = make_inputs(1, T, HQ, 1, D, 1, gates=True, dtype=F64)
    w = w * torch.rand(1, T, 1, 1, dtype=F64) * 1.5  # norms in (0, 1.5)
    v = torch.eye(T, dtype=F64)[None, :, None, :]  # [1, T, 1, T]: v_j = e_j
    p = fn(q, k, v, w, beta, g, scale=scale)[0]  # [T, HQ, T]
    G = g[0].cumsum(0)  # [T, HQ]
    Hs = [torch.eye(D, dtype=F64) - beta[0, t, 0] * torch.outer(w[0, t, 0], w[0, t, 0])
          for t in range(T)]
    for h in range(HQ):
        logits = torch.full((T, T), float("-inf"), dtype=F64)
        for i in range(T):
            for j in range(i + 1):
                prod = torch.eye(D, dtype=F64)
                for t in range(j + 1, i + 1):
                    prod = prod @ Hs[t]  # H_{j+1} ... H_t
                logits[i, j] = scale * k[0, j, 0] @ prod @ q[0, i, h] + G[i, h] - G[j, h]
        torch.testing.assert_close(p[:, h], logits.softmax(-1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fn", REFERENCES)
def test_cu_seqlens_equals_separate_sequences(fn):
    cu = [0, 1, 5, 5, 17, 30]  # lengths 1, 4, 0, 12, 13
    T, HQ, H, D, Dv = cu[-1], 4, 2, 8, 6
    inputs = make_inputs(1, T, HQ, H, D, Dv, gates=True, dtype=F64)
    dout = make_dout(1, T, HQ, Dv)
    o, grads = run_with_grads(fn, inputs, dout, cu_seqlens=torch.tensor(cu))
    for s, e in itertools.pairwise(cu):
        if e == s:
            continue
        o_seg, grads_seg = run_with_grads(fn, tuple(x[:, s:e] for x in inputs), dout[:, s:e])
        torch.testing.assert_close(o[:, s:e], o_seg, rtol=1e-12, atol=1e-12)
        for gr, gr_seg in zip(grads, grads_seg, strict=True):
            torch.testing.assert_close(gr[:, s:e], gr_seg, rtol=1e-12, atol=1e-12)
