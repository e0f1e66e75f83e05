"""The fused CPU scans (scan_fwd.cpp, scan_bwd.cpp) against the PyTorch scans on the same
block tensors. End to end, both backends ("cpu" and "torch") run the conformance suite,
`tests/ops/path/conformance`."""

from __future__ import annotations

import pytest
import torch

from pathattn.ops.common.heads import kv_blocks, row_blocks, rows_to_tokens
from pathattn.ops.common.layout import block_starts, from_head_blocks, make_layout
from pathattn.ops.path.blockwise import backward_scan, block_growth, forward_scan
from pathattn.ops.path.cpu import (
    fused_backward_scan,
    fused_forward_scan,
    fused_token_backward_scan,
    fused_token_scan,
    load_kernels,
    predecessors,
    scan_forward,
    scan_group,
)
from pathattn.ops.path.gates import block_gates
from pathattn.ops.path.stages import ut_blocks
from pathattn.ops.path.ut import block_ut

from .._helpers import make_inputs, strided_view

pytestmark = pytest.mark.skipif(not load_kernels(), reason="CPU kernel could not be built")


def _block_inputs(B, T, HQ, H, D, Dv, C, gates, cu, dtype, special=""):
    """Block tensors of random inputs: (layout, UT quantities, vb, gates, (wb, bb))."""
    q, k, v, w, beta, g = make_inputs(B, T, HQ, H, D, Dv, gates, dtype=dtype)
    if special == "sharp":  # logits far above the diagonal's: the running max must move
        q = q * 30
    if special == "cliff" and g is not None:  # G falls by 2500 mid-sequence
        g[:, T // 3: T // 3 + 50] = -50.0
    cu_t = None if cu is None else torch.tensor(cu)
    lay = make_layout(B, T, C, cu_t, torch.device("cpu"))
    blocks = ut_blocks(q, k, w, beta, lay, dtype)
    vb = kv_blocks(v, lay, dtype)
    gt = None if g is None else block_gates(g.reshape(B * T, HQ), lay, H)
    return lay, block_ut(*blocks, D**-0.5), vb, gt, blocks[2:]


CASES = [  # B, T, HQ, H, D, Dv, C, gates, cu, special
    (1, 1, 1, 1, 16, 16, 16, False, None, ""),
    (2, 7, 2, 2, 16, 8, 16, True, None, ""),
    (2, 65, 4, 2, 48, 32, 16, True, None, ""),
    (1, 300, 2, 1, 64, 64, 32, False, (0, 1, 130, 131, 300), ""),
    (1, 300, 4, 2, 32, 48, 32, True, (0, 1, 130, 131, 300), ""),
    (1, 300, 3, 3, 128, 64, 64, True, None, "sharp"),
    (2, 300, 2, 1, 16, 16, 32, True, None, "cliff"),
    (1, 513, 1, 1, 24, 40, 128, False, None, ""),
    (1, 200, 4, 2, 16, 24, 64, True, (0, 7, 200), ""),  # row groups in diagonal strips
]
# key blocks per scan step: every size from one block to the kernels' most (8), and the
# default (`scan_group`); all give the PyTorch scan's numbers
GROUPS = [1, 2, 3, None, 8]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[:8])) + c[9])
@pytest.mark.parametrize("group", GROUPS, ids=lambda g: f"group{g}")
def test_fused_matches_torch_scan(case, dtype, group):
    B, T, HQ, H, D, Dv, C, gates, cu, special = case
    lay, ut, vb, gt, wb_bb = _block_inputs(B, T, HQ, H, D, Dv, C, gates, cu, dtype, special)
    growth = block_growth(*wb_bb)
    s_diag = ut.s_diag.clone()
    o, lse = fused_forward_scan(lay, ut.qt, ut.kt, ut.pt, s_diag, vb, gt, group=group)
    torch.testing.assert_close(s_diag, ut.s_diag, rtol=0, atol=0)  # read only
    o_ref, lse_ref = forward_scan(lay, ut.qt, ut.kt, ut.pt, ut.s_diag.clone(), vb, gt, growth)
    tol = {torch.float32: 2e-5, torch.float64: 1e-12}[dtype]
    assert o.dtype == lse.dtype == dtype
    assert o.shape == o_ref.shape and lse.shape == lse_ref.shape
    torch.testing.assert_close(o, o_ref, rtol=tol, atol=tol)
    torch.testing.assert_close(lse, lse_ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c[:8])) + c[9])
@pytest.mark.parametrize("group", GROUPS, ids=lambda g: f"group{g}")
def test_fused_backward_matches_torch_scan(case, dtype, group):
    B, T, HQ, H, D, Dv, C, gates, cu, special = case
    lay, ut, vb, gt, wb_bb = _block_inputs(B, T, HQ, H, D, Dv, C, gates, cu, dtype, special)
    growth = block_growth(*wb_bb)
    o, lse = forward_scan(lay, ut.qt, ut.kt, ut.pt, ut.s_diag.clone(), vb, gt, growth)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(3), dtype=dtype)
    delta = (do * o).sum(-1)
    s_diag = ut.s_diag.clone()
    ours = fused_backward_scan(lay, ut.qt, ut.kt, ut.pt, s_diag, vb, gt, do, lse, delta,
                               group=group)
    torch.testing.assert_close(s_diag, ut.s_diag, rtol=0, atol=0)  # read only
    ref = backward_scan(lay, ut.qt, ut.kt, ut.pt, ut.s_diag.clone(), vb, gt, do, lse, delta)
    _assert_grads_close(ours, ref, dtype, {torch.float32: 1e-4, torch.float64: 1e-11}[dtype])


def _assert_grads_close(ours, ref, dtype, tol, to_ref=None):
    """Every field of two `ScanGrads` within tol of the reference's largest entry (both None
    where the reference's is); to_ref(name, x): the reference's layout of our field."""
    for name in ref._fields:
        x, x_ref = getattr(ours, name), getattr(ref, name)
        if x_ref is None:
            assert x is None, name
            continue
        if to_ref is not None:
            x_ref = to_ref(name, x_ref)
        assert x.dtype == dtype and x.shape == x_ref.shape, name
        # relative to the largest entry (dpt is 0 where no step multiplies transitions:
        # sequences of 1 and 2 blocks)
        scale = x_ref.abs().max().clamp_min(1e-30)
        err = float((x - x_ref).abs().max() / scale)
        assert err < tol, f"{name}: max error {err:.2e} relative to max |ref|"


def test_predecessors_follow_each_sequence():
    lay = make_layout(1, 300, 32, torch.tensor([0, 1, 130, 131, 300]), torch.device("cpu"))
    pred = predecessors(lay)
    # walking back from every block visits the blocks of its sequence in local order
    starts = sorted({int(x) for x in lay.slot_token.view(lay.NB, 32)[:, 0]})
    chains = []
    for a in range(lay.NB):
        chain, b = [], a
        while b >= 0:
            chain.append(int(lay.slot_token[b * 32]))
            b = int(pred[b])
        chains.append(chain)
    assert all(c == sorted(c, reverse=True) for c in chains)
    assert sorted(c[-1] for c in chains if len(c) == 1) == [0, 1, 130, 131]
    assert len(starts) == lay.NB


def test_kernel_rejects_bad_block_tensors():
    lay, ut, vb, _, _ = _block_inputs(1, 64, 1, 1, 16, 16, 16, False, None, torch.float32)
    args = [ut.qt, ut.kt, ut.pt, ut.s_diag, vb, predecessors(lay), None]
    torch.ops.pathattn_cpu.scan_fwd(*args)  # the good arguments run
    bad = [(1, ut.kt.double(), "kt has dtype Double"),
           (5, torch.zeros(lay.NB, dtype=torch.long), r"pred\[0\] out of range")]
    for i, x, message in bad:
        with pytest.raises(RuntimeError, match=message):
            torch.ops.pathattn_cpu.scan_fwd(*args[:i], x, *args[i + 1:])
    for group in (0, 9):
        with pytest.raises(RuntimeError, match=rf"group must be in \[1, 8\], got {group}"):
            torch.ops.pathattn_cpu.scan_fwd(*args, group)


def test_disabled_kernel_runs_torch_scan(monkeypatch):
    """PATHATTN_CPU_KERNEL=0: scan_forward is the PyTorch scan (it overwrites s_diag)."""
    lay, ut, vb, gt, wb_bb = _block_inputs(2, 65, 2, 1, 16, 16, 16, True, None,
                                           torch.float32)
    s_diag = ut.s_diag.clone()
    monkeypatch.setenv("PATHATTN_CPU_KERNEL", "0")
    scan_forward(lay, ut._replace(s_diag=s_diag), vb, gt, *wb_bb)
    assert not torch.equal(s_diag, ut.s_diag)
    monkeypatch.setenv("PATHATTN_CPU_KERNEL", "1")
    s_diag = ut.s_diag.clone()
    scan_forward(lay, ut._replace(s_diag=s_diag), vb, gt, *wb_bb)
    assert torch.equal(s_diag, ut.s_diag)


@pytest.mark.parametrize("gates", [False, True], ids=["nogates", "gates"])
def test_opcheck(gates):
    """Schema, fake (meta) implementation and dispatch of the registered op."""
    lay, ut, vb, gt, _ = _block_inputs(1, 100, 2, 1, 16, 8, 32, gates, None, torch.float32)
    G = None if gt is None else gt.G.contiguous()
    args = (ut.qt.contiguous(), ut.kt.contiguous(), ut.pt.contiguous(),
            ut.s_diag.contiguous(), vb, predecessors(lay), G)
    torch.library.opcheck(torch.ops.pathattn_cpu.scan_fwd.default, args)
    o, lse = torch.ops.pathattn_cpu.scan_fwd(*args)
    do = torch.randn_like(o)
    torch.library.opcheck(torch.ops.pathattn_cpu.scan_bwd.default,
                          args + (do, lse, (do * o).sum(-1)))


def test_scan_group_balances_updates_and_tiles():
    """sqrt(n / 2) blocks per step for sequences of n blocks, within [2, 4], and no more
    than keeps the [R, group * C] logit tile within 3 * 2^16 entries."""
    assert [scan_group(128, 128, n) for n in (1, 8, 16, 32, 64)] == [2, 2, 3, 4, 4]
    assert scan_group(256, 256, 32) == 3  # tile cap
    assert scan_group(512, 128, 64) == 3 and scan_group(1024, 128, 64) == 2


TOKEN_CASES = [  # B, T, HQ, H, D, Dv, C, gates, cu_seqlens
    (2, 128, 4, 2, 16, 24, 32, True, None),
    (1, 192, 2, 2, 32, 16, 64, False, (0, 64, 192)),
    (1, 96, 3, 1, 16, 16, 32, True, None),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", TOKEN_CASES, ids=lambda c: "-".join(map(str, c[:8])))
def test_token_scan_matches_block_scan(case, dtype):
    """scan_fwd_tokens reads the values from a strided token view and writes token outputs:
    the numbers of scan_fwd on the gathered blocks, mapped to tokens."""
    B, T, HQ, H, D, Dv, C, gates, cu = case
    lay, ut, vb, gt, _ = _block_inputs(B, T, HQ, H, D, Dv, C, gates, cu, dtype)
    v = make_inputs(B, T, HQ, H, D, Dv, gates, dtype=dtype)[2]
    o_ref, lse_ref = fused_forward_scan(lay, *ut, vb, gt)
    o, lse = fused_token_scan(lay, block_starts(lay), *ut,
                              strided_view(v.reshape(B * T, H, Dv)), gt)
    assert o.shape == (B * T, HQ, Dv) and lse.shape == (B * T, HQ)
    tol = {torch.float32: 1e-6, torch.float64: 1e-14}[dtype]
    for x, r in ((o, rows_to_tokens(o_ref, lay, (B * T, HQ, Dv))),
                 (lse, rows_to_tokens(lse_ref[..., None], lay, (B * T, HQ, 1))[..., 0])):
        assert float((x - r).abs().max() / r.abs().max()) < tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", TOKEN_CASES, ids=lambda c: "-".join(map(str, c[:8])))
def test_token_backward_scan_matches_block_scan(case, dtype):
    """scan_bwd_tokens reads v, do, lse and delta per token (strided views) and accumulates
    dv per token: the numbers of scan_bwd on the gathered blocks."""
    B, T, HQ, H, D, Dv, C, gates, cu = case
    N = B * T
    lay, ut, vb, gt, _ = _block_inputs(B, T, HQ, H, D, Dv, C, gates, cu, dtype)
    v = make_inputs(B, T, HQ, H, D, Dv, gates, dtype=dtype)[2]
    o, lse = fused_token_scan(lay, block_starts(lay), *ut, v.reshape(N, H, Dv), gt)
    gen = torch.Generator().manual_seed(3)
    do = torch.randn(N, HQ, Dv, generator=gen).to(dtype)
    delta = (do * o).sum(-1)
    rows = lambda x: row_blocks(x.view(B, T, HQ, -1), lay, H, dtype).flatten(2, 3)  # noqa: E731
    ref = fused_backward_scan(lay, *ut, vb, gt, rows(do), rows(lse)[..., 0],
                              rows(delta)[..., 0])
    ours = fused_token_backward_scan(lay, block_starts(lay), *ut,
                                     strided_view(v.reshape(N, H, Dv)), gt,
                                     strided_view(do), lse, delta)
    _assert_grads_close(  # dv [N, H, Dv] per token
        ours, ref, dtype, {torch.float32: 1e-6, torch.float64: 1e-14}[dtype],
        lambda name, r: from_head_blocks(r, lay) if name == "dv" else r)


def test_token_scan_rejects_bad_values():
    lay, ut, vb, _, _ = _block_inputs(1, 64, 1, 1, 16, 16, 16, False, None, torch.float32)
    v = vb.new_zeros(64, 1, 16)
    args = [ut.qt, ut.kt, ut.pt, ut.s_diag, v, block_starts(lay), predecessors(lay), None]
    torch.ops.pathattn_cpu.scan_fwd_tokens(*args)  # the good arguments run
    bad = [(4, v[:, :, :1].expand(64, 1, 16), "v must have unit stride"),
           (4, v.view(64, 16), r"v must be \[N, H, Dv\]"),
           (4, v[:60], r"start\[0\] = 48: a block of 16 tokens must lie within the 60"),
           (5, torch.zeros(3, dtype=torch.long), "start must have 4 entries")]
    for i, x, message in bad:
        with pytest.raises(RuntimeError, match=message):
            torch.ops.pathattn_cpu.scan_fwd_tokens(*args[:i], x, *args[i + 1:])


@pytest.mark.parametrize("gates", [False, True], ids=["nogates", "gates"])
def test_token_opcheck(gates):
    lay, ut, vb, gt, _ = _block_inputs(1, 128, 2, 1, 16, 8, 32, gates, None, torch.float32)
    G = None if gt is None else gt.G.contiguous()
    v = make_inputs(1, 128, 2, 1, 16, 8, gates)[2].reshape(128, 1, 8)
    args = (ut.qt.contiguous(), ut.kt.contiguous(), ut.pt.contiguous(),
            ut.s_diag.contiguous(), v, block_starts(lay), predecessors(lay), G)
    torch.library.opcheck(torch.ops.pathattn_cpu.scan_fwd_tokens.default, args)
    o, lse = torch.ops.pathattn_cpu.scan_fwd_tokens(*args)
    do = torch.randn_like(o)
    torch.library.opcheck(torch.ops.pathattn_cpu.scan_bwd_tokens.default,
                          args + (do, lse, (do * o).sum(-1)))
