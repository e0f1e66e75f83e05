"""The fused CPU UT transform (ut_fwd.cpp) and its gradient (ut_bwd.cpp) against
`ut.block_ut` and autograd through it, on the same blocks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pathattn.ops.common.layout import block_starts, from_head_blocks, make_layout
from pathattn.ops.path.cpu import (
    fused_block_ut,
    fused_token_ut,
    load_kernels,
    token_ut_backward,
    ut_backward,
    ut_forward,
)
from pathattn.ops.path.stages import ut_blocks
from pathattn.ops.path.ut import block_ut, sub_block_size, sub_block_target

from .._helpers import make_reflection_inputs, strided_view

pytestmark = pytest.mark.skipif(not load_kernels(), reason="CPU kernel could not be built")


def _blocks(NB, H, Gr, C, D, dtype, special=""):
    gen = torch.Generator().manual_seed(0)
    qb = torch.randn(NB, H, Gr, C, D, generator=gen).to(dtype)
    kb = torch.randn(NB, H, C, D, generator=gen).to(dtype)
    wb = F.normalize(torch.randn(NB, H, C, D, generator=gen), dim=-1).to(dtype)
    bb = (2 * torch.rand(NB, H, C, generator=gen)).to(dtype)
    if special == "beta0or2":  # singular transforms (beta = 2 on unit w: reflections)
        bb = 2.0 * (torch.rand(NB, H, C, generator=gen) < 0.5).to(dtype)
    if special == "w_big":  # expanding transforms
        wb = wb * (1 + 0.5 * torch.rand(NB, H, C, 1, generator=gen)).to(dtype)
    return qb, kb, wb, bb


CASES = [  # NB, H, Gr, C, D, sub_block, special
    (3, 2, 2, 64, 16, None, ""),
    (2, 1, 1, 48, 24, None, ""),
    (2, 2, 3, 64, 48, 16, ""),
    (4, 2, 1, 128, 64, None, "beta0or2"),
    (2, 1, 2, 128, 128, None, "w_big"),
    (2, 2, 1, 32, 8, 32, ""),
    (1, 1, 1, 16, 20, 4, ""),
    (1, 2, 2, 128, 16, 16, ""),  # 8 sub-blocks: three merge levels
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_fused_ut_matches_block_ut(case, dtype):
    NB, H, Gr, C, D, sub, special = case
    qb, kb, wb, bb = _blocks(NB, H, Gr, C, D, dtype, special)
    ours = fused_block_ut(qb, kb, wb, bb, 0.3, sub)
    ref = block_ut(qb, kb, wb, bb, 0.3, sub)
    tol = {torch.float32: 2e-5, torch.float64: 1e-12}[dtype]
    lower = torch.ones(C, C, dtype=torch.bool).tril().repeat(Gr, 1)  # [Gr * C, C]
    for name in ref._fields:
        x, r = getattr(ours, name), getattr(ref, name)
        assert x.shape == r.shape and x.dtype == dtype, name
        if name == "s_diag":  # defined for j <= i; the scans mask the rest
            x, r = x[..., lower], r[..., lower]
        err = float((x - r).abs().max() / r.abs().max())
        assert err < tol, f"{name}: max error {err:.2e} relative to max |ref|"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_fused_ut_gradient_matches_autograd(case, dtype):
    NB, H, Gr, C, D, sub, special = case
    qb, kb, wb, bb = _blocks(NB, H, Gr, C, D, dtype, special)
    # the same sub-blocks on both sides: a random ds has entries above the diagonal inside
    # a sub-block, whose gradient depends on where the sub-blocks are
    sub = sub or sub_block_size(C, sub_block_target(D, fused=True))
    gen = torch.Generator().manual_seed(1)
    cot = [torch.randn(shape, generator=gen).to(dtype) for shape in
           ((NB, H, Gr * C, D), (NB, H, C, D), (NB, H, D, D), (NB, H, Gr * C, C))]
    ours = ut_backward(qb, kb, wb, bb, 0.3, *cot, sub_block=sub)
    leaves = [x.clone().requires_grad_() for x in (qb, kb, wb, bb)]
    ref = torch.autograd.grad(list(block_ut(*leaves, 0.3, sub)), leaves, cot)
    tol = {torch.float32: 2e-5, torch.float64: 1e-12}[dtype]
    for name, x, r in zip(("q", "k", "w", "beta"), ours, ref, strict=True):
        assert x.shape == r.shape and x.dtype == dtype, name
        err = float((x - r).abs().max() / r.abs().max())
        assert err < tol, f"d{name}: max error {err:.2e} relative to max |ref|"


@pytest.mark.parametrize("C", [40, 48])
def test_fused_ut_merges_sub_block_counts_other_than_powers_of_two(C):
    """5 and 6 sub-blocks of 8 tokens: the merge levels end in shorter spans. Below the
    diagonal (where the sub-blocks do not matter) the numbers of block_ut's default."""
    qb, kb, wb, bb = _blocks(2, 1, 2, C, 16, torch.float64, "")
    ours = fused_block_ut(qb, kb, wb, bb, 0.3, 8)
    ref = block_ut(qb, kb, wb, bb, 0.3)
    lower = torch.ones(C, C, dtype=torch.bool).tril().repeat(2, 1)
    for name in ref._fields:
        x, r = getattr(ours, name), getattr(ref, name)
        if name == "s_diag":
            x, r = x[..., lower], r[..., lower]
        assert float((x - r).abs().max() / r.abs().max()) < 1e-12, name


def test_s_diag_is_zero_above_the_diagonal_sub_blocks():
    qb, kb, wb, bb = _blocks(2, 1, 1, 64, 16, torch.float64)
    s = fused_block_ut(qb, kb, wb, bb, 1.0, 16).s_diag  # [2, 1, 64, 64]
    block = torch.arange(64) // 16
    assert (s[..., block[:, None] < block[None, :]] == 0).all()


def test_ut_forward_differentiates_block_ut_when_grads_are_needed():
    qb, kb, wb, bb = _blocks(2, 1, 1, 32, 16, torch.float32)
    wb.requires_grad_()
    ut = ut_forward(qb, kb, wb, bb, 1.0)
    assert ut.qt.grad_fn is not None  # the PyTorch graph
    with torch.no_grad():
        assert ut_forward(qb, kb, wb, bb, 1.0).qt.grad_fn is None


def test_opcheck():
    qb, kb, wb, bb = _blocks(2, 2, 2, 32, 16, torch.float32)
    torch.library.opcheck(torch.ops.pathattn_cpu.ut_fwd.default, (qb, kb, wb, bb, 0.5, 16))
    with pytest.raises(RuntimeError, match="sub_block"):
        torch.ops.pathattn_cpu.ut_fwd(qb, kb, wb, bb, 0.5, 24)
    qt, kt, pt, s = torch.ops.pathattn_cpu.ut_fwd(qb, kb, wb, bb, 0.5, 16)
    grads = tuple(torch.randn_like(x) for x in (qt, kt, pt, s))
    torch.library.opcheck(torch.ops.pathattn_cpu.ut_bwd.default,
                          (qb, kb, wb, bb, 0.5, 16) + grads)


TOKEN_CASES = [  # B, T, HQ, H, D, C, R, cu_seqlens
    (2, 128, 4, 2, 16, 32, 1, None),
    (1, 192, 2, 2, 24, 64, 2, (0, 64, 192)),
    (1, 96, 3, 1, 16, 32, 1, None),
]


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", TOKEN_CASES, ids=lambda c: "-".join(map(str, c[:7])))
def test_token_ut_matches_block_ut(case, dtype, strided):
    """ut_fwd_tokens reads the token tensors in place: the numbers of ut_fwd on the gathered
    blocks, for grouped queries, several reflections, packed sequences, strided views."""
    B, T, HQ, H, D, C, R, cu = case
    q, k, _, w, beta, _ = make_reflection_inputs(B, T, HQ, H, D, D, R, False, dtype)
    lay = make_layout(B, T, C, None if cu is None else torch.tensor(cu), torch.device("cpu"))
    start = block_starts(lay)
    ref = fused_block_ut(*ut_blocks(q, k, w, beta, lay, dtype), 0.3)
    N = B * T
    toks = [x.reshape(N, x.shape[2], -1) for x in (q, k, w, beta)]  # w: [N, H, R * D]
    if strided:
        toks = [strided_view(x) for x in toks]
        assert not toks[0].is_contiguous()
    ours = fused_token_ut(*toks, start, C, 0.3)
    tol = {torch.float32: 1e-6, torch.float64: 1e-14}[dtype]
    for name in ref._fields:
        x, r = getattr(ours, name), getattr(ref, name)
        assert x.shape == r.shape and x.dtype == dtype, name
        err = float((x - r).abs().max() / r.abs().max())
        assert err < tol, f"{name}: max error {err:.2e} relative to max |ref|"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", TOKEN_CASES, ids=lambda c: "-".join(map(str, c[:7])))
def test_token_ut_backward_matches_block_ut_backward(case, dtype):
    """ut_bwd_tokens: the gradients of ut_bwd on the gathered blocks, written per token."""
    B, T, HQ, H, D, C, R, cu = case
    q, k, _, w, beta, _ = make_reflection_inputs(B, T, HQ, H, D, D, R, False, dtype)
    lay = make_layout(B, T, C, None if cu is None else torch.tensor(cu), torch.device("cpu"))
    blocks = ut_blocks(q, k, w, beta, lay, dtype)
    gen = torch.Generator().manual_seed(1)
    cot = [torch.randn(x.shape, generator=gen).to(dtype)
           for x in fused_block_ut(*blocks, 0.3)]
    ref = ut_backward(*blocks, 0.3, *cot)  # block tensors, as `blocks`
    N = B * T
    toks = [strided_view(x.reshape(N, x.shape[2], -1)) for x in (q, k, w, beta)]
    ours = token_ut_backward(*toks, block_starts(lay), C, 0.3, *cot)
    tol = {torch.float32: 1e-6, torch.float64: 1e-14}[dtype]
    for name, x, r, tok in zip(("q", "k", "w", "beta"), ours, ref, toks, strict=True):
        assert x.shape == tok.shape and x.dtype == dtype, name
        rt = _block_grad_to_tokens(r, lay, tok.shape)
        err = float((x - rt).abs().max() / rt.abs().max())
        assert err < tol, f"d{name}: max error {err:.2e} relative to max |ref|"


def _block_grad_to_tokens(xb, lay, shape):
    """Block gradients ([NB, H, Gr, C, D], [NB, H, C, D], [NB, H, C * R, D], [NB, H, C * R])
    -> token rows of `shape` [N, heads, F]."""
    NB, C = lay.NB, lay.C
    heads, F = shape[1], shape[2]
    return from_head_blocks(xb.reshape(NB, heads, C, F), lay).view(shape)


def test_token_ut_rejects_bad_inputs():
    q, k, _, w, beta, _ = make_reflection_inputs(1, 64, 2, 2, 16, 16, 1, False)
    toks = [x.reshape(64, 2, -1) for x in (q, k, w, beta)]
    start = torch.tensor([32, 0])
    qt = torch.ops.pathattn_cpu.ut_fwd_tokens(*toks, start, 32, 0.5, 16)[0]  # good ones run
    assert qt.shape == (2, 2, 32, 16)
    bad = [
        ((toks[0][:, :1], *toks[1:]), start, "q's heads must be a multiple of k's"),
        ((toks[0], toks[1], toks[2][..., :8], toks[3]), start, r"w must be \[N, 2, 16\]"),
        ((toks[0].transpose(0, 2).contiguous().transpose(0, 2), *toks[1:]), start,
         "q must have unit stride along its last dim"),
        (toks, torch.tensor([40, 0]), r"start\[0\] = 40: a block of 32 tokens must lie"),
        (toks, torch.tensor([32, 0], dtype=torch.int32), "start must be a contiguous int64"),
        (toks, torch.tensor([16, 0]), "the blocks from tokens 0 and 16 overlap"),
    ]
    for args, st, message in bad:
        with pytest.raises(RuntimeError, match=message):
            torch.ops.pathattn_cpu.ut_fwd_tokens(*args, st, 32, 0.5, 16)


def test_token_opcheck():
    q, k, _, w, beta, _ = make_reflection_inputs(1, 64, 2, 1, 16, 16, 2, False)
    toks = tuple(x.reshape(64, x.shape[2], -1) for x in (q, k, w, beta))
    args = toks + (torch.tensor([32, 0]), 32, 0.5, 16)
    torch.library.opcheck(torch.ops.pathattn_cpu.ut_fwd_tokens.default, args)
    grads = tuple(torch.randn_like(x) for x in torch.ops.pathattn_cpu.ut_fwd_tokens(*args))
    torch.library.opcheck(torch.ops.pathattn_cpu.ut_bwd_tokens.default, args + grads)
