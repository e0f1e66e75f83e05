"""Blockwise PaTH attention in PyTorch: the right-to-left scan of paper section 3.3.

Inputs are the per-block UT quantities of `ut.block_ut` (Q~ scaled, K~, Pt, in-block logits)
and values in block layout. For query block a and key block b < a,

    logit(i, j) = k~_j^T P_{b+1} ... P_{a-1} q~_i   (+ gate terms, see `gates`).

Step d of the scan pairs every query block with the key block d places to its left, for all
query blocks at once: the Python loop runs O(T / C) steps, each a batch of C x C tiles. The
query rows carry their state q~ P_{a-1}^T ... (row form: state <- state @ Pt_b after key block
b), and an online softmax accumulates the output as in FlashAttention. Extra memory is one
query state, one tile batch and the accumulators: O(T * D) per head, never T x T.

The backward pass recomputes tiles from the saved log-sum-exp (FlashAttention-2) and runs
the state recursion in reverse. Reversing it needs the states in reverse order, so they are
recomputed from checkpoints kept every ~sqrt(n) steps (n = T / C): the backward holds about
2 sqrt(n) query states at a time. The state recursion

    state_{d+1} = state_d @ Pt_b,   dstate_d = dS_d @ K~_b + dstate_{d+1} @ Pt_b^T,
    dPt_b += state_d^T @ dstate_{d+1},

gives the gradients of Q~, K~ and Pt, which `function.py` maps back to q, k, w, beta by
re-running the UT transform under autograd.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..common.layout import BlockLayout
from .gates import BlockGates

__all__ = ["forward_scan", "backward_scan", "ScanGrads"]


def _causal_rows(C: int, Gr: int, device) -> torch.Tensor:
    """[Gr * C, C] bool: row r (head r // C, position r % C) may see key position j <= r % C."""
    return torch.ones(C, C, dtype=torch.bool, device=device).tril().repeat(Gr, 1)


# Probabilities below exp(-64) (1.6e-28) of the row's reference point are set to exactly 0:
# tiny probabilities make subnormal numbers in exp and in the GEMMs that follow (P V,
# dS = P * (...), dS K), 4-5x slower on x86 CPUs, and forget gates routinely push far keys'
# logits hundreds below the row max. The reference is a logit of the row (row sum >= 1), so
# the change is below T * 1.6e-28 relative: exact in float32 and float64 alike.
_EXP_CUTOFF = -64.0


def exp_cutoff_(x: torch.Tensor, above_cutoff: bool = False) -> torch.Tensor:
    """exp in place, with arguments below _EXP_CUTOFF (and -inf) giving exactly 0.
    above_cutoff=True: the caller proved every argument >= _EXP_CUTOFF (the cutoff pass,
    one read and write of the tile, is skipped)."""
    if not above_cutoff:
        F.threshold_(x, _EXP_CUTOFF, float("-inf"))
    return x.exp_()


def _gate_tile(Gq: torch.Tensor, Gk: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Gate terms G_i - G_j of a tile, formed in float64 and then cast (see `gates`):
    Gq [.., C] of the query rows, Gk [.., C] of the keys -> [.., C, C] in dtype."""
    return (Gq[..., :, None] - Gk[..., None, :]).to(dtype)


def _diag_logits(s_diag: torch.Tensor, gates: BlockGates | None, C: int,
                 inplace: bool = False) -> torch.Tensor:
    """Masked in-block logits with gate terms: [NB, H, R, C] (overwrites s_diag if inplace)."""
    NB, H, R, _ = s_diag.shape
    S = s_diag if inplace else s_diag.clone()
    if gates is not None:
        S.view(NB, H, R // C, C, C).add_(_gate_tile(gates.G, gates.G, S.dtype))
    return S.masked_fill_(~_causal_rows(C, R // C, S.device), float("-inf"))


def _cross_logits(Q, Ktt, d, lay: BlockLayout, gates: BlockGates | None):
    """Logits of the active query rows against their key blocks at step d, gate terms
    included. Q [cnt, H, R, D]; Ktt [NB, H, D, C] (K~ transposed, contiguous). Returns
    S [cnt, H, R, C]."""
    cnt = Q.shape[0]
    S = Q @ lay.take(Ktt, d, cnt)
    if gates is not None:
        _, H, R, C = S.shape
        S.view(cnt, H, R // C, C, C).add_(
            _gate_tile(gates.G[:cnt], lay.take(gates.G, d, cnt), S.dtype))
    return S


def _gate_bounds(gates: BlockGates | None, G_range, d: int, cnt: int, lay: BlockLayout):
    """(lowest, highest) gate term of every active query row's tile at step d, [cnt, H, R]
    each, or None without gates. G_range = (min, max) of G over each block [NB, H, Gr]."""
    if gates is None:
        return None
    Gq = gates.G[:cnt]  # [cnt, H, Gr, C]
    lo = Gq - lay.take(G_range[1], d, cnt)[..., None]
    hi = Gq - lay.take(G_range[0], d, cnt)[..., None]
    return lo.flatten(2), hi.flatten(2)


# Online-softmax shortcut: when no logit of a tile can exceed a row's running max by more
# than this margin, the tile is exponentiated against the running max as it is, with no row
# max and no rescaling of the accumulators (the result is the same; only the reference
# point differs). exp(40) * T * |v| stays far below the float32 range.
_HEADROOM = 40.0


def _row_bounds(qn, kmax, gate_range):
    """Upper and lower bounds of every row's logits in a tile, by Cauchy-Schwarz.

    qn [cnt, H, R] bound of the query-state norms; kmax [cnt, H] largest key norm of each
    key block; gate_range = (lowest, highest) gate term of each row [cnt, H, R] each, or
    None. Returns two [cnt, H, R] tensors.
    """
    reach = qn * kmax[..., None]  # |scaled q~ . k~| <= reach
    if gate_range is None:
        return reach, -reach
    lo, hi = (x.to(reach.dtype) for x in gate_range)
    return reach + hi, lo - reach


def block_growth(wb: torch.Tensor, bb: torch.Tensor) -> torch.Tensor:
    """Bound of the operator norm of each block transition: [NB, H].

    ||I - beta w w^T||_2 = max(1, |1 - beta |w|^2|) (eigenvalues 1 and 1 - beta |w|^2), so
    ||P_b|| <= prod_t max(1, |1 - beta_t |w_t|^2|): exactly 1 for unit w and beta in [0, 2].
    wb [NB, H, C, D]; bb [NB, H, C].
    """
    rho = (1 - bb * (wb * wb).sum(-1)).abs().clamp_min(1)  # [NB, H, C]
    return rho.prod(-1)


def forward_scan(lay: BlockLayout, qt: torch.Tensor, kt: torch.Tensor, pt: torch.Tensor,
                 s_diag: torch.Tensor, vb: torch.Tensor, gates: BlockGates | None,
                 growth: torch.Tensor | None = None):
    """Forward pass. qt [NB, H, R, D]; kt [NB, H, C, D]; pt [NB, H, D, D];
    s_diag [NB, H, R, C] (overwritten); vb [NB, H, C, Dv]; growth [NB, H] norm bounds of
    the block transitions (`block_growth`; None means unknown, disabling the shortcut);
    blocks in scan order (see `layout`).

    Returns o [NB, H, R, Dv] and lse [NB, H, R] (log-sum-exp of each row's logits).
    """
    C = lay.C
    NB, H, R, _ = qt.shape
    Dv = vb.shape[-1]
    # diagonal blocks (d = 0) initialise the online softmax
    S = _diag_logits(s_diag, gates, C, inplace=True)
    m = S.amax(-1)  # [NB, H, R] running max (or a reference point within _HEADROOM of it)
    exp_cutoff_(S.sub_(m[..., None]))
    den = S.sum(-1)  # [NB, H, R]
    acc = S @ vb  # [NB, H, R, Dv]
    del S
    Ktt = kt.transpose(-1, -2).contiguous()  # [NB, H, D, C]
    kmax = torch.linalg.vector_norm(kt, dim=-1).amax(-1)  # [NB, H]
    G_range = None if gates is None else gates.G.aminmax(dim=-1)  # 2 x [NB, H, Gr]
    # qn bounds the norm of every query state: |q~| times the growth of the blocks passed
    qn = torch.linalg.vector_norm(qt, dim=-1)  # [NB, H, R]
    if growth is None:
        qn.fill_(float("inf"))
    grows = growth is not None and bool((growth > 1).any())
    state = qt
    for d in range(1, lay.n_max):
        cnt = lay.counts[d]
        Q = state[:cnt]
        S = _cross_logits(Q, Ktt, d, lay, gates)
        m_old = m[:cnt]
        bound, low = _row_bounds(qn[:cnt], lay.take(kmax, d, cnt),
                                 _gate_bounds(gates, G_range, d, cnt, lay))
        a = acc[:cnt].view(cnt * H, R, Dv)
        short = bound <= m_old + _HEADROOM  # [cnt, H, R] rows that keep their reference
        if bool(short.all()):
            exp_cutoff_(S.sub_(m_old[..., None]),
                        above_cutoff=bool((low - m_old >= _EXP_CUTOFF).all()))
            den[:cnt] += S.sum(-1)
        else:  # decided per row, so that no sequence changes how another one rounds
            m_new = torch.where(short, m_old, torch.maximum(m_old, S.amax(-1)))
            exp_cutoff_(S.sub_(m_new[..., None]),
                        above_cutoff=bool((low - m_new >= _EXP_CUTOFF).all()))
            alpha = (m_old - m_new).exp_()  # [cnt, H, R]
            den[:cnt].mul_(alpha).add_(S.sum(-1))
            a.mul_(alpha.view(cnt * H, R, 1))
            m[:cnt] = m_new
        a.baddbmm_(S.view(cnt * H, R, C), lay.take(vb, d, cnt).view(cnt * H, C, Dv))
        del S
        cnt_next = lay.counts[d + 1] if d + 1 < lay.n_max else 0
        if cnt_next:
            state = Q[:cnt_next] @ lay.take(pt, d, cnt_next)
            if grows:
                qn[:cnt_next] *= lay.take(growth, d, cnt_next)[..., None]
    return acc / den[..., None], m + den.log()


class ScanGrads(NamedTuple):
    dqt: torch.Tensor  # [NB, H, R, D]
    dkt: torch.Tensor  # [NB, H, C, D]
    dpt: torch.Tensor  # [NB, H, D, D]
    ds_diag: torch.Tensor  # [NB, H, R, C]
    dv: torch.Tensor  # [NB, H, C, Dv]
    dgate_col: torch.Tensor | None  # [NB, H, Gr, C] column sums of dS at every key


def _tile_probs(S, lse):
    """Softmax probabilities of a tile, in place: S [.., R, C], lse [.., R]."""
    return exp_cutoff_(S.sub_(lse[..., None]))


def _tile_dS(P, delta, dO, Vt):
    """FlashAttention-2 tile backward: dS = P * (dO V^T - delta). P [.., R, C];
    delta [.., R]; dO [.., R, Dv]; Vt [.., Dv, C]."""
    return (dO @ Vt).sub_(delta[..., None]).mul_(P)


def backward_scan(lay: BlockLayout, qt, kt, pt, s_diag, vb, gates: BlockGates | None,
                  do: torch.Tensor, lse: torch.Tensor, delta: torch.Tensor) -> ScanGrads:
    """Backward pass. Arguments as `forward_scan` plus do [NB, H, R, Dv], lse and
    delta = rowsum(dO * O) [NB, H, R], all in scan order."""
    C = lay.C
    NB, H, R, D = qt.shape
    Gr = R // C
    Vt = vb.transpose(-1, -2).contiguous()  # [NB, H, Dv, C]
    # --- diagonal blocks
    # s_diag is not read again (autograd keeps no copy of it: its version check would raise)
    P = _tile_probs(_diag_logits(s_diag, gates, C, inplace=True), lse)
    dv = P.transpose(-1, -2) @ do  # [NB, H, C, Dv]
    ds_diag = _tile_dS(P, delta, do, Vt)
    del P
    dcol = ds_diag.view(NB, H, Gr, C, C).sum(-2) if gates is not None else None
    dkt = torch.zeros_like(kt)
    dpt = torch.zeros_like(pt)
    dqt = torch.zeros_like(qt)
    n = lay.n_max
    if n <= 1:
        return ScanGrads(dqt, dkt, dpt, ds_diag, dv, dcol)
    Ktt = kt.transpose(-1, -2).contiguous()  # [NB, H, D, C]
    Pm = pt.transpose(-1, -2).contiguous()  # [NB, H, D, D] = P

    def step_state(state, d):
        """state_{d+1} from state_d (rows still active at step d + 1)."""
        cnt_next = lay.counts[d + 1]
        return state[:cnt_next] @ lay.take(pt, d, cnt_next)

    # checkpoints of the query state every `seg` steps, then reverse segment by segment
    seg = max(1, math.isqrt(n - 1))
    checkpoints = {}
    state = qt[: lay.counts[1]]
    for d in range(1, n):
        if (d - 1) % seg == 0:
            checkpoints[d] = state
        if d + 1 < n:
            state = step_state(state, d)
    del state
    g_next = None  # gradient of state_{d+1}
    for start in sorted(checkpoints, reverse=True):
        stop = min(start + seg, n)
        states = [checkpoints.pop(start)]
        for d in range(start, stop - 1):
            states.append(step_state(states[-1], d))
        for d in range(stop - 1, start - 1, -1):
            Q = states.pop()
            cnt = Q.shape[0]
            P = _tile_probs(_cross_logits(Q, Ktt, d, lay, gates), lse[:cnt])
            lay.put_addmm(dv, d, P.transpose(-1, -2), do[:cnt])  # dV += P^T dO
            dS = _tile_dS(P, delta[:cnt], do[:cnt], lay.take(Vt, d, cnt))
            del P
            lay.put_addmm(dkt, d, dS.transpose(-1, -2), Q)  # dK~ += dS^T state
            if dcol is not None:
                lay.put_add(dcol, d, dS.view(cnt, H, Gr, C, C).sum(-2))
            g = dS @ lay.take(kt, d, cnt)  # [cnt, H, R, D] gradient of state_d
            del dS
            if g_next is not None:
                cnt_next = g_next.shape[0]
                g[:cnt_next].view(-1, R, D).baddbmm_(
                    g_next.view(-1, R, D), lay.take(Pm, d, cnt_next).view(-1, D, D))
                lay.put_addmm(dpt, d, Q[:cnt_next].transpose(-1, -2), g_next)
            g_next = g
            del Q
    dqt[: g_next.shape[0]] = g_next
    return ScanGrads(dqt, dkt, dpt, ds_diag, dv, dcol)
