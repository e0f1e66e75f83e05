"""The fused CPU UT transform with R reflections per token (wb [NB, H, C * R, D]) against
`ut.block_ut` and autograd through it: float64 tightly, float32 within a small multiple of
block_ut's own float32 error (both measured against block_ut in float64), taken as the
largest over a few roundings of the inputs so that it does not rest on one draw."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pathattn import path_attn
from pathattn.ops.path.cpu import fused_block_ut, fused_ut_applies, load_kernels, ut_backward
from pathattn.ops.path.ut import block_ut, sub_block_size, sub_block_target

from .._helpers import make_reflection_inputs

pytestmark = pytest.mark.skipif(not load_kernels(), reason="CPU kernel could not be built")

F64 = torch.float64


def _blocks(NB, H, Gr, C, D, R, special=""):
    """Block tensors in float64: qb [NB, H, Gr, C, D], kb [NB, H, C, D], wb
    [NB, H, C * R, D] (unit rows), bb [NB, H, C * R] in (0, 2)."""
    gen = torch.Generator().manual_seed(0)
    qb = torch.randn(NB, H, Gr, C, D, generator=gen, dtype=F64)
    kb = torch.randn(NB, H, C, D, generator=gen, dtype=F64)
    wb = F.normalize(torch.randn(NB, H, C * R, D, generator=gen, dtype=F64), dim=-1)
    bb = 2 * torch.rand(NB, H, C * R, generator=gen, dtype=F64)
    if special == "beta0or2":  # singular transforms (beta = 2 on unit w: reflections)
        bb = 2.0 * (torch.rand(NB, H, C * R, generator=gen) < 0.5).to(F64)
    if special == "w_big":  # expanding transforms
        wb = wb * (1 + 0.5 * torch.rand(NB, H, C * R, 1, generator=gen, dtype=F64))
    return qb, kb, wb, bb


def _cotangents(NB, H, Gr, C, D):
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(shape, generator=gen, dtype=F64) for shape in
            ((NB, H, Gr * C, D), (NB, H, C, D), (NB, H, D, D), (NB, H, Gr * C, C))]


CASES = [  # NB, H, Gr, C, D, R, sub_block, special
    (2, 2, 2, 32, 16, 2, None, ""),
    (2, 1, 1, 24, 8, 3, 6, ""),
    (1, 2, 3, 32, 12, 2, 16, ""),
    (2, 1, 1, 16, 20, 3, 4, ""),
    (2, 1, 1, 32, 16, 2, 8, "beta0or2"),
    (1, 1, 2, 16, 8, 3, None, "w_big"),
]
IDS = ["-".join(map(str, c)).rstrip("-") for c in CASES]


def _rel_err(x, ref):
    return float((x.double() - ref).abs().max() / ref.abs().max())


def _roundings(xs, n=3):
    """xs (float32 tensors), then n copies with every entry moved one unit in the last
    place up or down at random: inputs as close to the float64 ones as xs, whose results
    show the float32 error of a computation over several roundings rather than one."""
    gen = torch.Generator().manual_seed(5)
    out = [list(xs)]
    for _ in range(n):
        out.append([torch.nextafter(x, torch.where(torch.rand(x.shape, generator=gen) < 0.5,
                                                   float("inf"), float("-inf")).to(x.dtype))
                    for x in xs])
    return out


def _check(name, ours, ref64, torch32):
    """ours in float64: within 1e-12 of ref64 relative to max |ref64|. ours in float32:
    at most twice block_ut's float32 error (the largest over its runs torch32), floored at
    1e-6, and below 1e-5."""
    assert ours.shape == ref64.shape, name
    err = _rel_err(ours, ref64)
    if ours.dtype == F64:
        assert err < 1e-12, f"{name}: max error {err:.2e} relative to max |ref|"
    else:
        bound = max(max(2 * _rel_err(t, ref64) for t in torch32), 1e-6)
        assert err <= bound and err < 1e-5, \
            f"{name}: error {err:.2e}, block_ut float32 bound {bound:.2e}"


def _sub(sub, C, D):
    return sub or sub_block_size(C, sub_block_target(D, fused=True))


@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_fused_ut_matches_block_ut(case, dtype):
    NB, H, Gr, C, D, R, sub, special = case
    blocks = _blocks(NB, H, Gr, C, D, R, special)
    low = [x.to(dtype) for x in blocks]
    sub = _sub(sub, C, D)
    ours = fused_block_ut(*low, 0.3, sub)
    ref = block_ut(*blocks, 0.3, sub)
    runs = [block_ut(*xs, 0.3, sub) for xs in _roundings(low)] if dtype != F64 else []
    lower = torch.ones(C, C, dtype=torch.bool).tril().repeat(Gr, 1)  # [Gr * C, C]
    for name in ref._fields:
        x, r = getattr(ours, name), getattr(ref, name)
        r32 = [getattr(u, name) for u in runs]
        assert x.dtype == dtype, name
        if name == "s_diag":  # defined for j <= i; the scans mask the rest
            x, r, r32 = x[..., lower], r[..., lower], [t[..., lower] for t in r32]
        _check(name, x, r, r32)


@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_fused_ut_gradient_matches_autograd(case, dtype):
    NB, H, Gr, C, D, R, sub, special = case
    blocks = _blocks(NB, H, Gr, C, D, R, special)
    # the same sub-blocks on both sides: a random ds has entries above the diagonal inside
    # a sub-block, whose gradient depends on where the sub-blocks are
    sub = _sub(sub, C, D)
    cot = _cotangents(NB, H, Gr, C, D)
    ours = ut_backward(*(x.to(dtype) for x in blocks), 0.3,
                       *(x.to(dtype) for x in cot), sub_block=sub)

    def autograd(inputs):
        leaves = [x.clone().requires_grad_() for x in inputs]
        return torch.autograd.grad(list(block_ut(*leaves, 0.3, sub)), leaves,
                                   [x.to(inputs[0].dtype) for x in cot])

    ref = autograd(blocks)
    runs = [] if dtype == F64 else \
        [autograd(xs) for xs in _roundings([x.to(dtype) for x in blocks])]
    for i, (name, x, r, inp) in enumerate(zip(("q", "k", "w", "beta"), ours, ref, blocks,
                                              strict=True)):
        assert x.dtype == dtype and x.shape == inp.shape, name
        _check("d" + name, x, r, [run[i] for run in runs])


def test_zero_strength_reflections_drop_out():
    """Extra reflections with beta = 0 are identities: R = 3 with beta_{t,2} = beta_{t,3} = 0
    gives the R = 1 results of the first reflections."""
    NB, H, Gr, C, D = 2, 2, 2, 16, 8
    qb, kb, wb, bb = _blocks(NB, H, Gr, C, D, 3)
    bb3 = bb.view(NB, H, C, 3).clone()
    bb3[..., 1:] = 0
    one = fused_block_ut(qb, kb, wb.view(NB, H, C, 3, D)[..., 0, :].contiguous(),
                         bb3[..., 0].contiguous(), 0.5, 8)
    three = fused_block_ut(qb, kb, wb, bb3.view(NB, H, C * 3), 0.5, 8)
    for name in one._fields:
        torch.testing.assert_close(getattr(three, name), getattr(one, name), rtol=1e-13,
                                   atol=1e-13, msg=name)


def test_fused_ut_applies_to_several_reflections():
    qb, kb, wb, _ = _blocks(1, 1, 1, 16, 8, 2)
    assert fused_ut_applies(qb, kb, wb) == fused_ut_applies(qb, kb, kb)
    assert not fused_ut_applies(qb, kb, wb, kernels=False)


def test_cpu_backend_runs_the_fused_ut_with_reflections():
    """path_attn(backend="cpu") with R = 2 runs both fused UT kernels (forward and
    backward), not the PyTorch UT transform."""
    inputs = [x.requires_grad_() for x in make_reflection_inputs(1, 20, 2, 1, 8, 4, 2)]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        path_attn(*inputs, backend="cpu", block_size=8).sum().backward()
    names = {e.name for e in prof.events()}
    assert {"pathattn_cpu::ut_fwd", "pathattn_cpu::ut_bwd"} <= names


def test_opcheck_and_shape_checks():
    qb, kb, wb, bb = (x.float() for x in _blocks(2, 2, 2, 16, 8, 3))
    torch.library.opcheck(torch.ops.pathattn_cpu.ut_fwd.default, (qb, kb, wb, bb, 0.5, 8))
    qt, kt, pt, s = torch.ops.pathattn_cpu.ut_fwd(qb, kb, wb, bb, 0.5, 8)
    grads = tuple(torch.randn_like(x) for x in (qt, kt, pt, s))
    torch.library.opcheck(torch.ops.pathattn_cpu.ut_bwd.default,
                          (qb, kb, wb, bb, 0.5, 8) + grads)
    with pytest.raises(RuntimeError, match="wb must be"):
        torch.ops.pathattn_cpu.ut_fwd(qb, kb, wb[:, :, :-1].contiguous(), bb, 0.5, 8)
    with pytest.raises(RuntimeError, match="bb shape"):
        torch.ops.pathattn_cpu.ut_fwd(qb, kb, wb, bb[:, :, :16].contiguous(), 0.5, 8)
