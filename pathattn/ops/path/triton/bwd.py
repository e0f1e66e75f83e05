"""Backward scan of PaTH attention as Triton kernels, in O(T) memory.

Notation of `fwd.py` (row form): for query block a the state x^(c) = Q~_a Pt_{a-1} ... Pt_{c+1}
meets key block c in S_ac = x^(c) K~_c^T. Reverse mode runs the state recursion backwards,
i.e. left to right over c, with the adjoint g^(c) = dL/dx^(c):

    g^(c) = g^(c-1) Pt_c^T + dS_ac K~_c,      dPt_c += x^(c)^T g^(c-1),      dQ~_a = g^(a-1)

(dS = P * (dO V^T - delta) as in FlashAttention-2, P rebuilt from the saved log-sum-exp).
The states are produced right to left, so the walk needs x^(c) for increasing c without
storing every state of every query block. It uses the forward's segments of SEG blocks
(`segments.py`: the keys moved to their segment's end Ks_c and the whole-segment
transitions M_s). For each earlier segment s, left to right, the program forms the state
y^(s) = ys Pi from ys, its state entering the segment before its own, with one product
(`crossings.py`: Pi the product of the M between them), and meets the segment's blocks as
plain attention, as the forward did (so P matches the saved log-sum-exp), with the adjoint
of y^(s):

    g <- g M_s^T, dM_s += y^(s)^T g    (entering s: y^(s-1) = y^(s) M_s)
    g <- g + dS Ks_c    (each block c of s)

Three products per block pair (S, dO V^T, dS Ks), no transition and no atomic: the block
pair's key side, dKs_c += dS^T y^(s) and dV_c += P^T dO, is `bwd_kv.py`'s, a key-parallel
kernel that reads ys (stored here, also in the inputs' dtype). Inside its own segment the
program recomputes x^(c) from Q~_a and runs the block recursion above (with the transition
terms dU = -W x^T g and dW = -U g^T x of Pt = I - W^T U, one row per reflection). dKs and
dM reach K~, W and U afterwards, per segment (`segments.segment_grads`). The extra memory
is O(T D) (Ks, dKs, the states per query row, which wait in memory rather than in
registers during the walk) and O(T D^2 / BT) for the E_c and Pi.

Gradients of key-side quantities inside the own segment (dV, dK~, the transition terms,
the gate terms) and dM, once per segment crossed, are accumulated with relaxed atomic adds
into float32 buffers (products with 16-bit operands as in `fwd.py`); dQ~ and the in-block
dS go to per-query-head buffers that `ut.ut_bwd` turns into dq, dk, dw, dbeta.

Gates: logit(i, j) holds G_i - G_j, so dL/dG_t = rowsum_t(dS) - colsum_t(dS). The row sum
is zero in exact arithmetic, but not with o rounded to 16 bits: each program keeps its
rows' sums over the walk (in bfloat16 this halves the error of dg). With 64-token blocks
the keys' column sums in the own segment are the product dS^T e_0, sharing the dK
product's operand (docs/ops.md, "Gate terms").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...common.triton_launch import launch_kernel
from ._common import (
    block_ptrs,
    device_fn,
    exp_ftz,
    full_block_reflections,
    load_block,
    load_raw,
    mm_lp,
    reflection_tile,
    row_offsets,
    tile_ptrs,
    transition_dtype,
)
from .bwd_kv import launch_bwd_kv
from .crossings import pair_index, segment_products
from .fwd import apply_transition, key_block_logits, query_block_start
from .segments import (
    cross_back,
    cross_back_sliced,
    segment_grads,
    segment_keys,
    times_e,
    times_e_sliced,
)

__all__ = ["bwd_scan"]


@device_fn
def _dlogits(S, tc, h, dO, lse, delta, rmask, v_ptr, H, DV, vcols, vmask, KB: tl.constexpr,
             DT: tl.constexpr, PREC: tl.constexpr, EMULATE: tl.constexpr,
             HOIST: tl.constexpr = False):
    """P and dS = P * (dO V^T - delta) of a query block against the KB keys (full blocks)
    from token tc, from the logits S formed as the forward formed them. HOIST: the values
    through loop-invariant offsets (`load_block`)."""
    kr = tc + tl.arange(0, KB)
    P = tl.where(rmask[:, None], exp_ftz(S - lse[:, None]), 0.0)
    if HOIST:
        Vb = load_block(v_ptr, tc, KB, H * DV, h * DV, vcols, vmask)
    else:
        Vb = load_raw(v_ptr, kr, kr >= 0, H * DV, h * DV, vcols, vmask)
    return P, P * (mm_lp(dO, tl.trans(Vb), DT, PREC, EMULATE) - delta[:, None])


@device_fn
def _pair_grads(x, S, drow, tc, hq, h, dO, lse, delta, rmask, v_ptr, dv_ptr, dk_ptr,
                dgate_ptr, HQ, H, D, DV, cols, cmask, vcols, vmask, HAS_G: tl.constexpr,
                BT: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
                EMULATE: tl.constexpr, HOIST: tl.constexpr):
    """The attention part of a block pair of the query's own segment: query state x against
    the full key block at token tc with logits S. Adds dV += P^T dO to dv_ptr and dS^T x
    to dk_ptr, the keys' column sums of dS to dgate_ptr (gates); returns dS (in DT, the
    dtype of its products) and drow plus its row sums. Every atomic is relaxed: the sums
    need no ordering, only atomicity. HOIST: the values through loop-invariant offsets."""
    P, dS = _dlogits(S, tc, h, dO, lse, delta, rmask, v_ptr, H, DV, vcols, vmask, BT, DT,
                     PREC, EMULATE, HOIST)
    if HAS_G:
        drow += tl.sum(dS, axis=1)
        if BT < 64:
            cs = tl.sum(dS, axis=0)
    # P and dS only as product operands from here: rounded once, their float32 tiles dead
    P = P.to(DT)
    dS = dS.to(DT)
    lk = tl.arange(0, BT)
    tl.atomic_add(block_ptrs(dv_ptr, tc, lk, H * DV, h * DV, vcols),
                  mm_lp(tl.trans(P), dO, DT, PREC, EMULATE), mask=vmask[None, :],
                  sem="relaxed")
    dSt = tl.trans(dS)
    tl.atomic_add(block_ptrs(dk_ptr, tc, lk, H * D, h * D, cols),
                  mm_lp(dSt, x, DT, PREC, EMULATE), mask=cmask[None, :], sem="relaxed")
    if HAS_G:
        if BT >= 64:  # the keys' column sums as dS^T e_0, sharing dS^T's operand with dK
            # e_0 as wide as x, so that this product has the dK product's shape
            e0 = tl.where(cols == 0, 1.0, 0.0)
            cs = tl.sum(mm_lp(dSt, tl.broadcast_to(e0[None, :], x.shape), DT, PREC, EMULATE),
                        axis=1)
        tl.atomic_add(dgate_ptr + row_offsets(tc + lk, HQ, hq), -cs, sem="relaxed")
    return dS, drow


@device_fn
def _key_block_grads(x, xt, S, g, drow, c, s0, hq, h, dO, lse, delta, rmask, kt_ptr, v_ptr,
                     wt_ptr, u_ptr, dv_ptr, dkt_ptr, du_ptr, dwp_ptr, dgate_ptr, HQ, H, D, DV,
                     cols, cmask, vcols, vmask, HAS_G: tl.constexpr, BT: tl.constexpr,
                     DT: tl.constexpr, TDT: tl.constexpr, PREC: tl.constexpr,
                     EMULATE: tl.constexpr, R: tl.constexpr, BTR: tl.constexpr,
                     HOIST: tl.constexpr):
    """One step of the left-to-right walk inside the query's own segment: query state
    x^(c), rounded to DT (x, the attention products' operand) and to TDT (xt, the
    transitions'), against key block c; returns the adjoint g^(c) from g = g^(c-1), and
    drow (`_pair_grads`). HOIST: keys, values and (without padding rows) reflections
    through loop-invariant offsets (`load_block`)."""
    tc = s0 + c * BT
    dS, drow = _pair_grads(x, S, drow, tc, hq, h, dO, lse, delta, rmask, v_ptr, dv_ptr,
                           dkt_ptr, dgate_ptr, HQ, H, D, DV, cols, cmask, vcols, vmask, HAS_G,
                           BT, DT, PREC, EMULATE, HOIST)
    if c > 0:  # Pt_c acted on x^(c) (g^(c-1) is zero for c == 0)
        wr, wmask = full_block_reflections(tc, BT, R, BTR)  # [BTR]
        if HOIST and BT * R == BTR:
            Wc = load_block(wt_ptr, tc * R, BTR, H * D, h * D, cols, cmask)
            Uc = load_block(u_ptr, tc * R, BTR, H * D, h * D, cols, cmask)
        else:
            Wc = load_raw(wt_ptr, wr, wmask, H * D, h * D, cols, cmask)
            Uc = load_raw(u_ptr, wr, wmask, H * D, h * D, cols, cmask)
        if BT * R == BTR:  # no padding rows
            amask = cmask[None, :]
        else:
            amask = wmask[:, None] & cmask[None, :]
        wx = mm_lp(Wc, tl.trans(xt), TDT, PREC, EMULATE)  # [BTR, BT]
        lw = tl.arange(0, BTR)
        tl.atomic_add(block_ptrs(du_ptr, tc * R, lw, H * D, h * D, cols),
                      -mm_lp(wx, g, TDT, PREC, EMULATE), mask=amask, sem="relaxed")
        ug = mm_lp(Uc, tl.trans(g), TDT, PREC, EMULATE)  # one [BTR, BT] temporary at a time
        tl.atomic_add(block_ptrs(dwp_ptr, tc * R, lw, H * D, h * D, cols),
                      -mm_lp(ug, xt, TDT, PREC, EMULATE), mask=amask, sem="relaxed")
        g = g - mm_lp(tl.trans(ug), Wc, TDT, PREC, EMULATE)
    kr = tc + tl.arange(0, BT)
    if HOIST:
        Kt = load_block(kt_ptr, tc, BT, H * D, h * D, cols, cmask)
    else:
        Kt = load_raw(kt_ptr, kr, kr >= 0, H * D, h * D, cols, cmask)
    return g + mm_lp(dS, Kt, DT, PREC, EMULATE), drow


@device_fn
def _segment_block_grads(yc_ptrs, smask, g, drow, tc, hq, h, ga, dO, lse, delta, rmask,
                         ks_ptr, v_ptr, g_ptr, ge_ptr, HQ, H, D, DV, NTOK, cols, cmask, vcols,
                         vmask, HAS_G: tl.constexpr, BT: tl.constexpr, KB: tl.constexpr,
                         DT: tl.constexpr, PREC: tl.constexpr, EMULATE: tl.constexpr,
                         HOIST: tl.constexpr):
    """The KB keys (full blocks) from token tc of an earlier segment, met as plain
    attention, as the forward met them, with logits S = y Ks^T (y the query state at the
    blocks' segment, read back from yc_ptrs): returns the adjoint of y with their term,
    g + dS Ks, and drow plus dS's row sums. The keys' and values' side is `bwd_kv.py`'s.
    HOIST: keys and values through loop-invariant offsets (`load_block`), else
    per-element ones."""
    yb = tl.load(yc_ptrs, mask=smask, other=0.0)
    kr = tc + tl.arange(0, KB)
    S, _ = key_block_logits(yb, ks_ptr, g_ptr, ge_ptr, kr, tc, hq, h, ga, HQ, H, D, NTOK,
                            cols, cmask, HAS_G, BT, DT, PREC, EMULATE, HOIST, KB)
    _, dS = _dlogits(S, tc, h, dO, lse, delta, rmask, v_ptr, H, DV, vcols, vmask, KB, DT,
                     PREC, EMULATE, HOIST)
    if HAS_G:
        drow += tl.sum(dS, axis=1)
    if HOIST:  # read again rather than held over the logits' gradient
        Ks = load_block(ks_ptr, tc, KB, H * D, h * D, cols, cmask)
    else:
        Ks = load_raw(ks_ptr, kr, kr >= 0, H * D, h * D, cols, cmask)
    return g + mm_lp(dS, Ks, DT, PREC, EMULATE), drow


@triton.jit
def _bwd_kernel(q_ptr, k_ptr, v_ptr, wt_ptr, u_ptr, kt_ptr, m_ptr, g_ptr, gs_ptr, ge_ptr,
                ks_ptr, ms_ptr,
                pi_ptr, dms_ptr, slot_ptr, pbase_ptr, do_ptr, lse_ptr, delta_ptr, dqt_ptr,
                ys_ptr, ysd_ptr, yc_ptr, ysc_ptr, gsc_ptr, dsd_ptr, dv_ptr, dkt_ptr, du_ptr,
                dwp_ptr, dgate_ptr,
                table_ptr, scale, SEG, HQ, H, D, DV, NTOK, G: tl.constexpr,
                HAS_G: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
                BK: tl.constexpr, DT: tl.constexpr, TDT: tl.constexpr, PREC: tl.constexpr,
                EMULATE: tl.constexpr, R: tl.constexpr, BTR: tl.constexpr,
                PIPE: tl.constexpr = 1, KSTEP: tl.constexpr = 1, HOIST: tl.constexpr = False,
                HOIST_OWN: tl.constexpr = False):
    blk = tl.num_programs(0) - 1 - tl.program_id(0)  # last blocks (the longest walks) first
    hq = tl.program_id(1)
    h = hq // G
    t0 = tl.load(table_ptr + blk * 3)
    s0 = tl.load(table_ptr + blk * 3 + 1)
    s1 = tl.load(table_ptr + blk * 3 + 2)
    if t0 >= s1:  # an empty row of the table
        return
    cbt = tl.arange(0, BT)
    rows = t0 + cbt
    rmask = rows < s1
    cols = tl.arange(0, BD)
    cmask = cols < D
    vcols = tl.arange(0, BDV)
    vmask = vcols < DV
    xa, S, gq, ga = query_block_start(q_ptr, k_ptr, wt_ptr, u_ptr, m_ptr, g_ptr, gs_ptr, rows,
                                      rmask, t0, s1, hq, h, scale, HQ, H, D, NTOK, cols,
                                      cmask, HAS_G, BT, PREC, R, BTR)
    dO = load_raw(do_ptr, rows, rmask, HQ * DV, hq * DV, vcols, vmask)
    lse = tl.load(lse_ptr + row_offsets(rows, HQ, hq), mask=rmask, other=0.0)
    delta = tl.load(delta_ptr + row_offsets(rows, HQ, hq), mask=rmask, other=0.0)
    # the query block's own keys first, so that S is dead before the walk
    P = tl.where(rmask[:, None], exp_ftz(S - lse[:, None]), 0.0)
    V = load_raw(v_ptr, rows, rmask, H * DV, h * DV, vcols, vmask)
    dS = P * (mm_lp(dO, tl.trans(V), DT, PREC, EMULATE) - delta[:, None])
    tl.atomic_add(tile_ptrs(dv_ptr, rows, H * DV, h * DV, vcols),
                  mm_lp(tl.trans(P), dO, DT, PREC, EMULATE), mask=rmask[:, None] & vmask[None, :],
                  sem="relaxed")
    tl.store(tile_ptrs(dsd_ptr, rows, HQ * BT, hq * BT, cbt), dS, mask=rmask[:, None])
    drow = tl.sum(dS, axis=1)  # row sums of dS over the key blocks walked (gates)
    dcol = tl.sum(dS, axis=0)  # this block's tokens' in-block column sums
    if HAS_G:  # earlier blocks: the query's gate term G_i - G_t0 moves into lse
        lse = lse - gq
    a = (t0 - s0) // BT  # local index of the query block
    sa = a // SEG  # its segment
    g = tl.zeros([BT, BD], dtype=tl.float32)
    # state at the last block of segment sa - 1: x^(sa*SEG - 1)
    ytop = xa
    for i in range(0, a - sa * SEG):
        ytop = apply_transition(ytop, wt_ptr, u_ptr, s0 + (a - 1 - i) * BT, h, H, D, cols,
                                cmask, PREC, BT, R, BTR, TDT, EMULATE)
    # the states wait in memory (xa in this block's own rows of dqt, written last; ytop and
    # the state y of the segment walked): the walk keeps g and dO in registers
    smask = rmask[:, None] & cmask[None, :]
    xa_ptrs = tile_ptrs(dqt_ptr, rows, HQ * D, hq * D, cols)
    ytop_ptrs = tile_ptrs(ys_ptr, rows, HQ * D, hq * D, cols)
    yc_ptrs = tile_ptrs(yc_ptr, rows, HQ * D, hq * D, cols)
    if BK < BD:  # y and g in the transitions' dtype, read back BK columns at a time
        ysc_ptrs = tile_ptrs(ysc_ptr, rows, HQ * D, hq * D, cols)
        gsc_ptrs = tile_ptrs(gsc_ptr, rows, HQ * D, hq * D, cols)
    tl.store(xa_ptrs, xa, mask=smask)
    tl.store(ytop_ptrs, ytop, mask=smask)
    tl.store(tile_ptrs(ysd_ptr, rows, HQ * D, hq * D, cols), ytop, mask=smask)  # for bwd_kv
    tl.debug_barrier()
    slot = tl.load(slot_ptr + blk) - sa  # slot of the sequence's segment 0
    base = tl.load(pbase_ptr + blk)
    for sc in range(0, sa):  # earlier segments, left to right
        tl.debug_barrier()  # every thread has read the last segment's y before it is replaced
        if BK == BD:
            y = tl.load(ytop_ptrs, mask=smask, other=0.0)
            if sc < sa - 1:  # across segments sa - 1, ..., sc + 1 at once: y Pi_{sa-1,sc}
                y = times_e(y, pi_ptr, pair_index(base, sa - 1, sc), h, H, cols, BD,
                            PREC, TDT, EMULATE)
            if sc > 0:  # entering segment sc across M_sc: dM_sc += y^T g, g <- g M_sc^T
                g = cross_back(y, g, ms_ptr, dms_ptr, slot + sc, h, H, cols, BD, PREC, TDT,
                               EMULATE)
        else:  # BK columns of y and g at a time, read from memory (no selection products)
            if sc < sa - 1:
                y = times_e_sliced(ys_ptr, rows, rmask, HQ * D, hq * D, D, pi_ptr,
                                   pair_index(base, sa - 1, sc), h, H, BT, BD, BK, PREC, TDT,
                                   EMULATE)
            else:
                y = tl.load(ytop_ptrs, mask=smask, other=0.0)
            if sc > 0:
                tl.store(ysc_ptrs, y.to(TDT), mask=smask)
                tl.store(gsc_ptrs, g.to(TDT), mask=smask)
                tl.debug_barrier()
                g = cross_back_sliced(ysc_ptr, gsc_ptr, rows, rmask, HQ * D, hq * D, D, g,
                                      ms_ptr, dms_ptr, slot + sc, h, H, BT, BD, BK, PREC, TDT,
                                      EMULATE)
        tl.store(yc_ptrs, y.to(DT), mask=smask)  # only an operand of S = y Ks^T below
        tl.debug_barrier()
        # plain attention, KSTEP blocks a step (the last SEG % KSTEP one at a time), PIPE
        # loads in flight
        for j in tl.range(0, SEG - SEG % KSTEP, KSTEP, num_stages=PIPE):
            g, drow = _segment_block_grads(yc_ptrs, smask, g, drow, s0 + (sc * SEG + j) * BT,
                                           hq, h, ga, dO, lse, delta, rmask, ks_ptr, v_ptr,
                                           g_ptr, ge_ptr, HQ, H, D, DV, NTOK, cols, cmask,
                                           vcols, vmask, HAS_G, BT, KSTEP * BT, DT, PREC,
                                           EMULATE, HOIST)
        if KSTEP > 1:
            for j in range(SEG - SEG % KSTEP, SEG):
                g, drow = _segment_block_grads(yc_ptrs, smask, g, drow,
                                               s0 + (sc * SEG + j) * BT, hq, h, ga, dO, lse,
                                               delta, rmask, ks_ptr, v_ptr, g_ptr, ge_ptr, HQ,
                                               H, D, DV, NTOK, cols, cmask, vcols, vmask,
                                               HAS_G, BT, BT, DT, PREC, EMULATE, HOIST)
    for c in range(sa * SEG, a):  # own segment: x^(c) recomputed from Q~_a
        # dO reloaded per block (from L2): its operand buffers live one block pair only
        # (sm_90, D 64: 8 KiB less shared memory, no spill traffic in this loop with
        # Triton 3.6, 2 spill loads / stores per pair without the reload)
        dO = load_raw(do_ptr, rows, rmask, HQ * DV, hq * DV, vcols, vmask)
        x = tl.load(xa_ptrs, mask=smask, other=0.0)
        for i in range(0, a - 1 - c):
            x = apply_transition(x, wt_ptr, u_ptr, s0 + (a - 1 - i) * BT, h, H, D, cols,
                                 cmask, PREC, BT, R, BTR, TDT, EMULATE)
        tc = s0 + c * BT
        # the state only as product operands from here: rounded once, its float32 tile dead
        xt = x.to(TDT)
        x = x.to(DT)
        S, _ = key_block_logits(x, kt_ptr, g_ptr, ge_ptr, tc + cbt, tc, hq, h, ga, HQ, H, D,
                                NTOK, cols, cmask, HAS_G, BT, DT, PREC, EMULATE, HOIST_OWN,
                                BT)
        g, drow = _key_block_grads(x, xt, S, g, drow, c, s0, hq, h, dO, lse, delta, rmask,
                                   kt_ptr, v_ptr, wt_ptr, u_ptr, dv_ptr, dkt_ptr, du_ptr,
                                   dwp_ptr, dgate_ptr, HQ, H, D, DV, cols, cmask, vcols, vmask,
                                   HAS_G, BT, DT, TDT, PREC, EMULATE, R, BTR, HOIST_OWN)
    if HAS_G:  # dL/dG: this block's rows as queries, minus its tokens' in-block columns
        tl.atomic_add(dgate_ptr + row_offsets(rows, HQ, hq), drow - dcol, mask=rmask,
                      sem="relaxed")
    tl.debug_barrier()  # every thread has read xa before g takes its place
    tl.store(xa_ptrs, g, mask=smask)


def _group_sum(x: torch.Tensor, H: int) -> torch.Tensor:
    """[N, HQ, F] per query head -> [N, H, F] summed over each key head's query heads (a
    view, no copy, when HQ == H)."""
    N, HQ, F = x.shape
    return x if HQ == H else x.view(N, H, HQ // H, F).sum(2)


def bwd_scan(q, k, v, w, u, kt, m, G, do, lse, delta, table, slots, n_slots: int, pairs,
             scale: float, seg: int, BT: int, BD: int, BDV: int, dt, tdt, prec: str,
             emulate: bool, BK: int, BKV: int, launch: dict | None = None,
             seg_launch: dict | None = None, kv_launch: dict | None = None,
             kv_tiles: tuple[int, int] | None = None, seg_rows: int | None = None,
             seg_bwd_launch: dict | None = None, seg_walk: bool = False,
             pi_launch: dict | None = None):
    """Scan gradients. Inputs as `fwd.fwd_scan` plus do [N, HQ, Dv] (q's dtype), lse and
    delta = rowsum(dO * O) [N, HQ] (float32), the segment slots of
    `segments.segment_slots` and pairs = (pair bases, rows) of `crossings.segment_pairs`
    (the segment keys and transitions are recomputed, as the forward computed them).

    Returns dqt [N, HQ, D] and dsd [N, HQ, BT] (gradients of Q~ and of the in-block logits
    per query head), dv [N, H, Dv] in v's dtype, dkt, du, dwp (float32, [N, H, D], and
    [N * R, H, D] for du, dwp) and dG = dL/dG [N, HQ], the gradient of the cumulative gates
    G: row sums of dS minus column sums (None without gates). BK, BKV: rows of a segment
    product read at a time (divisors of BD) by the query-parallel and the key-parallel
    kernel; launch /
    seg_launch / kv_launch: num_warps / num_stages of the query-parallel scan, of the
    segment kernels (`segments`, `crossings`) and of the key-parallel kernel (`bwd_kv`);
    kv_tiles: the latter's (BKT, BQ); seg_rows and seg_bwd_launch: the rows of E per
    program and num_warps / num_stages of `segments.segment_grads` (default: seg_launch);
    seg_walk: `segments.segment_keys`' walk; pi_launch: num_warps / num_stages of
    `crossings.segment_products` (default: seg_launch).
    """
    N, HQ, D = q.shape
    H, Dv = k.shape[1], v.shape[-1]
    R = w.shape[0] // max(N, 1)
    f32 = {"dtype": torch.float32, "device": q.device}
    ks, ms, e = segment_keys(w, u, kt, table, slots, n_slots, seg, BT, BD, prec, dt, tdt,
                             emulate, R, store_e=True, launch=seg_launch, walk=seg_walk)
    pbase, n_pairs = pairs
    pi = segment_products(ms, table, slots, pbase, n_pairs, seg, BT, BD, BK, prec, tdt,
                          emulate, seg_launch if pi_launch is None else pi_launch)
    dqt = torch.empty(N, HQ, D, **f32)
    # per query block: its state at its own segment's start and at the segment walked
    ys = torch.empty(N, HQ, D, **f32)
    yc = torch.empty(N, HQ, D, dtype=q.dtype, device=q.device)  # in the products' dtype
    ysd = torch.empty(N, HQ, D, dtype=q.dtype, device=q.device)  # ys in the inputs' dtype
    dsd = torch.empty(N, HQ, BT, **f32)
    dv = torch.zeros(N, H, Dv, **f32)
    dkt = torch.zeros(N, H, D, **f32)
    du, dwp = (torch.zeros(N * R, H, D, **f32) for _ in range(2))
    dG = torch.zeros(N, HQ, **f32) if G is not None else None
    dms = torch.zeros(ms.shape, **f32)  # gradients of the segment transitions
    g64, (gs, ge) = G if G is not None else (lse, (lse, lse))
    # y and g crossing a segment, read back BK columns at a time (BK < BD)
    ysc, gsc = ((torch.empty(N, HQ, D, dtype=transition_dtype(q.dtype), device=q.device)
                 for _ in range(2))
                if BK < BD else (u, u))
    launch_kernel(_bwd_kernel, (table.shape[0], HQ))(
        q, k, v, w, u, kt, m, g64, gs, ge, ks, ms, pi, dms, slots, pbase, do,
        lse, delta, dqt, ys, ysd, yc, ysc, gsc, dsd, dv, dkt, du, dwp,
        dG if dG is not None else lse, table,
        scale, seg, HQ, H, D, Dv, N, G=HQ // H, HAS_G=G is not None, BT=BT, BD=BD, BDV=BDV,
        BK=BK, DT=dt, TDT=tdt, PREC=prec, EMULATE=emulate, R=R, BTR=reflection_tile(BT, R),
        **(launch or {}))
    del ysc, gsc, yc, ys  # the query kernel's work buffers, free for the key kernel's
    dks, dvq = launch_bwd_kv(ks, v, pi, pbase, G, ysd, do, lse, delta, dG, dv, table, seg, BT,
                             BD, BDV, BKV, dt, prec, emulate, kv_tiles, kv_launch)
    # without GQA the key kernel finished dv (v's dtype); else sum a key head's query heads
    dv = dvq if HQ == H else (dv + _group_sum(dvq, H)).to(v.dtype)
    dks = _group_sum(dks, H)
    segment_grads(w, u, kt, e, dks, dms, table, slots, seg, BT, BD, prec, dt, tdt, emulate,
                  dkt, du, dwp, R, seg_bwd_launch or seg_launch, seg_rows)
    return dqt, dsd, dv, dkt, du, dwp, dG
