"""The forward scan's no-rescale shortcut against the plain online softmax (same inputs)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pathattn.ops.common.layout import make_layout
from pathattn.ops.path import blockwise
from pathattn.ops.path.blockwise import block_growth, forward_scan
from pathattn.ops.path.gates import block_gates
from pathattn.ops.path.ut import block_ut


def _scan_inputs(q_scale: float, gates: bool, seed: int = 0):
    """Blocks of one B=2, T=300 batch, C=32: (layout, ut, vb, gates, growth)."""
    gen = torch.Generator().manual_seed(seed)
    B, T, H, Gr, C, D = 2, 300, 2, 2, 32, 16
    lay = make_layout(B, T, C, None, torch.device("cpu"))
    NB = lay.NB
    qb = torch.randn(NB, H, Gr, C, D, generator=gen) * q_scale
    kb = torch.randn(NB, H, C, D, generator=gen)
    wb = F.normalize(torch.randn(NB, H, C, D, generator=gen), dim=-1)
    bb = 2 * torch.rand(NB, H, C, generator=gen)
    vb = torch.randn(NB, H, C, D, generator=gen)
    g = F.logsigmoid(torch.randn(B * T, H * Gr, generator=gen) + 2) if gates else None
    gt = None if g is None else block_gates(g, lay, H)
    return lay, block_ut(qb, kb, wb, bb, D**-0.5), vb, gt, block_growth(wb, bb)


@pytest.mark.parametrize("gates", [False, True], ids=["nogates", "gates"])
@pytest.mark.parametrize("q_scale", [1.0, 30.0], ids=["mild", "sharp"])
def test_shortcut_equals_rescaling(q_scale, gates, monkeypatch):
    lay, ut, vb, gt, growth = _scan_inputs(q_scale, gates)
    bounds = []
    row_bounds = blockwise._row_bounds
    monkeypatch.setattr(blockwise, "_row_bounds",
                        lambda *a: bounds.append(row_bounds(*a)) or bounds[-1])
    fast = forward_scan(lay, ut.qt, ut.kt, ut.pt, ut.s_diag.clone(), vb, gt, growth=growth)
    plain = forward_scan(lay, ut.qt, ut.kt, ut.pt, ut.s_diag.clone(), vb, gt, growth=None)
    torch.testing.assert_close(fast[0], plain[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fast[1], plain[1], rtol=1e-5, atol=1e-5)
    # first scan: finite bounds (shortcut and skipped exp cutoff possible); second: unknown
    assert all(torch.isfinite(x).all() for b in bounds[: len(bounds) // 2] for x in b)
    assert all(torch.isinf(x).all() for b in bounds[len(bounds) // 2:] for x in b)


def test_growth_bounds_block_transition_norm():
    gen = torch.Generator().manual_seed(0)
    wb = torch.randn(6, 2, 8, 5, generator=gen)  # non-unit w: transforms may expand
    bb = 3 * torch.rand(6, 2, 8, generator=gen)
    kb = torch.randn(6, 2, 8, 5, generator=gen)
    ut = block_ut(torch.randn(6, 2, 1, 8, 5, generator=gen), kb, wb, bb, 1.0)
    norms = torch.linalg.matrix_norm(ut.pt, ord=2)  # [6, 2]
    assert (norms <= block_growth(wb, bb) * (1 + 1e-5)).all()
    unit = F.normalize(wb, dim=-1)  # |w|^2 = 1 up to rounding: growth 1 up to rounding
    torch.testing.assert_close(block_growth(unit, bb.clamp(0, 2)), torch.ones(6, 2),
                               rtol=0, atol=1e-5)


@pytest.mark.parametrize("gates", [False, True], ids=["nogates", "gates"])
def test_row_bounds_hold(gates):
    """Every cross-tile logit lies within `_row_bounds` (they decide the no-rescale shortcut
    and skipping the exp cutoff)."""
    lay, ut, vb, gt, growth = _scan_inputs(3.0, gates)
    Ktt = ut.kt.transpose(-1, -2).contiguous()
    kmax = torch.linalg.vector_norm(ut.kt, dim=-1).amax(-1)
    G_range = None if gt is None else gt.G.aminmax(dim=-1)
    qn = torch.linalg.vector_norm(ut.qt, dim=-1)
    state = ut.qt
    checked = 0
    for d in range(1, lay.n_max):
        cnt = lay.counts[d]
        Q = state[:cnt]
        full = blockwise._cross_logits(Q, Ktt, d, lay, gt)  # [cnt, H, R, C] with gates
        up, low = blockwise._row_bounds(qn[:cnt], lay.take(kmax, d, cnt),
                                        blockwise._gate_bounds(gt, G_range, d, cnt, lay))
        assert (full.amax(-1) <= up + 1e-4).all() and (full.amin(-1) >= low - 1e-4).all()
        checked += 1
        if d + 1 < lay.n_max:
            nxt = lay.counts[d + 1]
            state = Q[:nxt] @ lay.take(ut.pt, d, nxt)
            qn[:nxt] *= lay.take(growth, d, nxt)[..., None]
    assert checked > 0
