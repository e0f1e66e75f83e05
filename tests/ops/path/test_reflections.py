"""Several reflections per token, H_t = H_{t,1} ... H_{t,R}: the float64 oracles agree with
each other and with explicit Householder products; R = 1 as w [B, T, H, 1, D] is the
one-reflection op bit for bit; two equal reflections of strength 2 cancel (plain causal
softmax attention); the UT transform of c * R reflections equals the token-level one when
the reflections of a token are merged into an explicit product; the inputs are validated.
(Every backend against the reference: `tests/ops/path/conformance/test_reflections.py`.)
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pathattn import path_attn
from pathattn.ops import path_attn_full_matrix, path_attn_naive
from pathattn.ops.path.ut import block_ut

from ._helpers import (
    NAMES,
    assert_close_to_reference,
    make_dout,
    make_inputs,
    make_reflection_inputs,
    run_with_grads,
)

F64 = torch.float64


@pytest.mark.parametrize("R", [2, 3], ids=lambda r: f"R{r}")
@pytest.mark.parametrize("B, HQ, H, gates, cu", [
    pytest.param(2, 2, 2, False, None, id="mha"),
    pytest.param(2, 4, 2, True, None, id="gqa-gates"),
    pytest.param(1, 4, 2, True, [0, 1, 9, 9, 17], id="cu_seqlens-gates"),
])
def test_naive_equals_full_matrix(R, B, HQ, H, gates, cu):
    T, D, Dv = 17, 6, 5
    inputs = make_reflection_inputs(B, T, HQ, H, D, Dv, R, gates, F64)
    dout = make_dout(B, T, HQ, Dv)
    kw = {"cu_seqlens": None if cu is None else torch.tensor(cu)}
    naive = run_with_grads(path_attn_naive, inputs, dout, **kw)
    full = run_with_grads(path_attn_full_matrix, inputs, dout, **kw)
    assert_close_to_reference(full, naive, tol=1e-12)


def test_naive_equals_explicit_products():
    """logit(i, j) = scale * k_j^T H_{j+1} ... H_i q_i with H_t = H_{t,1} ... H_{t,R} as
    explicit D x D matrices (one head, no gates)."""
    T, D, Dv, R = 7, 5, 3, 3
    q, k, v, w, beta, _ = make_reflection_inputs(1, T, 1, 1, D, Dv, R, False, F64)
    eye = torch.eye(D, dtype=F64)
    Ht = []
    for t in range(T):
        M = eye
        for r in range(R):
            wr = w[0, t, 0, r]
            M = M @ (eye - beta[0, t, 0, r] * torch.outer(wr, wr))
        Ht.append(M)
    logits = torch.full((T, T), float("-inf"), dtype=F64)
    for i in range(T):
        for j in range(i + 1):
            P = eye
            for t in range(j + 1, i + 1):
                P = P @ Ht[t]
            logits[i, j] = k[0, j, 0] @ P @ q[0, i, 0] * D**-0.5
    ref = logits.softmax(-1) @ v[0, :, 0]  # [T, Dv]
    torch.testing.assert_close(path_attn_naive(q, k, v, w, beta)[0, :, 0], ref,
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fn", [path_attn_naive, path_attn_full_matrix],
                         ids=["naive", "full_matrix"])
def test_reference_single_reflection_is_token_form(fn):
    q, k, v, w, beta, g = make_inputs(2, 9, 4, 2, 6, 5, dtype=F64)
    torch.testing.assert_close(fn(q, k, v, w[:, :, :, None], beta[..., None], g),
                               fn(q, k, v, w, beta, g), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("gates, cu", [pytest.param(True, None, id="gates"),
                                       pytest.param(False, (0, 3, 20, 33), id="packed")])
def test_single_reflection_bit_for_bit(backend, gates, cu):
    """w [B, T, H, 1, D], beta [B, T, H, 1] gives exactly the output and gradients of
    w [B, T, H, D], beta [B, T, H] (torch.equal)."""
    B = 2 if cu is None else 1
    inputs = make_inputs(B, 33, 4, 2, 16, 8, gates)
    q, k, v, w, beta, g = inputs
    kw = {"cu_seqlens": None if cu is None else torch.tensor(cu), "backend": backend,
          "block_size": 16}
    dout = make_dout(B, 33, 4, 8)
    o4, grads4 = run_with_grads(path_attn, inputs, dout, **kw)
    o5, grads5 = run_with_grads(path_attn, (q, k, v, w[:, :, :, None], beta[..., None], g),
                                dout, **kw)
    assert torch.equal(o4, o5)
    for name, a, b in zip(NAMES, grads4, grads5, strict=True):
        if a is not None:
            assert torch.equal(a, b.view(a.shape)), name


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_equal_reflections_of_strength_two_cancel(backend):
    """w_{t,2} = w_{t,1}, beta = 2 for both: H_t = (I - 2 w w^T)^2 = I (unit w), so the op is
    causal softmax attention."""
    B, T, HQ, H, D, Dv = 2, 21, 4, 2, 8, 6
    q, k, v, w, _, _ = make_inputs(B, T, HQ, H, D, Dv, gates=False, dtype=F64)
    w = F.normalize(w, dim=-1)  # unit in float64 (drawn in float32)
    w2 = torch.stack([w, w], dim=3)  # [B, T, H, 2, D]
    beta2 = torch.full((B, T, H, 2), 2.0, dtype=F64)
    o = path_attn(q, k, v, w2, beta2, backend=backend, block_size=8)
    groups = HQ // H
    ref = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.repeat_interleave(groups, dim=2).transpose(1, 2),
        v.repeat_interleave(groups, dim=2).transpose(1, 2), is_causal=True).transpose(1, 2)
    torch.testing.assert_close(o, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(path_attn_naive(q, k, v, w2, beta2), ref, rtol=1e-12,
                               atol=1e-12)


def test_block_ut_of_reflections_has_token_shapes():
    """block_ut with c * R reflections per sub-block: outputs shaped by tokens, and every
    sub-block length gives the same block quantities."""
    gen = torch.Generator().manual_seed(0)
    NB, H, Gr, C, D, R = 2, 1, 2, 32, 8, 3
    qb = torch.randn(NB, H, Gr, C, D, generator=gen, dtype=F64)
    kb = torch.randn(NB, H, C, D, generator=gen, dtype=F64)
    wb = F.normalize(torch.randn(NB, H, C * R, D, generator=gen, dtype=F64), dim=-1)
    bb = 2 * torch.rand(NB, H, C * R, generator=gen, dtype=F64)
    whole = block_ut(qb, kb, wb, bb, 0.5, sub_block=C)
    assert whole.qt.shape == (NB, H, Gr * C, D) and whole.s_diag.shape == (NB, H, Gr * C, C)
    mask = torch.ones(C, C, dtype=torch.bool).tril().repeat(Gr, 1)
    for c in (4, 8, 16):
        parts = block_ut(qb, kb, wb, bb, 0.5, sub_block=c)
        for name in whole._fields:
            x, ref = getattr(parts, name), getattr(whole, name)
            if name == "s_diag":
                x, ref = x[..., mask], ref[..., mask]
            torch.testing.assert_close(x, ref, rtol=1e-10, atol=1e-10, msg=f"{name} c={c}")


def _bad(**edit):
    inputs = dict(zip(NAMES, make_reflection_inputs(1, 5, 2, 1, 8, 4, 2), strict=True))
    inputs.update(edit)
    return inputs


@pytest.mark.parametrize("edit, match", [
    pytest.param(lambda a: {"w": a["w"][None]}, r"^w must have 4 dimensions", id="w-rank6"),
    pytest.param(lambda a: {"w": a["w"][:, :, :, :0]}, r"^w: the number of reflections",
                 id="R0"),
    pytest.param(lambda a: {"beta": a["beta"][..., 0]}, r"^beta must have 4 dim.*\[B, T, H, R\]",
                 id="beta-rank3"),
    pytest.param(lambda a: {"beta": a["beta"][..., :1]}, r"^beta: expected shape \[B, T, H, R\]",
                 id="beta-R"),
    pytest.param(lambda a: {"w": a["w"][..., :7]}, r"^w: expected \[B, T, H\] and D",
                 id="w-head-dim"),
    pytest.param(lambda a: {"w": a["w"][:, :, :, 0]}, r"^beta must have 3 dim", id="w-4d"),
])
def test_validation_names_w_and_beta(edit, match):
    base = _bad()
    with pytest.raises(ValueError, match=match):
        path_attn(**_bad(**edit(base)))


def test_builtin_backends_take_reflections_and_one_without_is_refused(monkeypatch):
    """The built-in backends all declare R > 1 (the optional "fla" does not); a backend that
    does not is refused by name when asked for, and "auto" passes over it."""
    from pathattn.ops.path import backends
    from pathattn.ops.path.backends import Backend, get_backend, select_backend

    assert all(get_backend(name).reflections for name in ("triton", "cpu", "torch"))
    assert not get_backend("fla").reflections
    q = torch.empty(1, 1, 1, 16)
    single = Backend("single_only", attention=lambda *a: None, refuses=lambda q: None)
    monkeypatch.setattr(backends, "_REGISTRY", {"single_only": single, **backends._REGISTRY})
    assert select_backend("auto", q, reflections=3).name != "single_only"
    assert select_backend("auto", q, reflections=1).name == "single_only"
    with pytest.raises(ValueError, match=r"^backend='single_only': .*R=3"):
        select_backend("single_only", q, reflections=3)


def test_nonfinite_reflection_poisons_later_rows_only():
    """A NaN in one reflection of token 6 makes rows >= 6 NaN and leaves the rest equal to
    the reference."""
    q, k, v, w, beta, g = make_reflection_inputs(1, 12, 2, 1, 8, 4, 2)
    w = w.clone()
    w[0, 6, 0, 1, 3] = float("nan")
    o = path_attn(q, k, v, w, beta, g, backend="torch")
    assert torch.isnan(o[0, 6:]).all() and torch.isfinite(o[0, :6]).all()
    ref = path_attn_naive(q, k, v, w, beta, g)
    torch.testing.assert_close(o[0, :6].double(), ref[0, :6], rtol=1e-5, atol=1e-5)
