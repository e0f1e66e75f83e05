"""Forward scan of PaTH attention as a Triton kernel (paper section 3.3, boxed workflow).

One program per (query block a, query head). With the block's UT quantities (`ut.py`) it
forms the boundary-adjusted queries x = Q~ and the in-block logits S, then walks the key
blocks b = a-1, ..., 0 of its sequence right to left. Inside its own segment of blocks
(`segments.py`) it moves across every block:

    S_ab = x K~_b^T  (+ gate terms),   online softmax,   acc += P V_b,
    x <- x Pt_b = x - (x W_b^T) U_b        (the query moves across block b)

and then, for each earlier segment s (right to left), it meets the segment's blocks as
plain attention against the keys moved to the segment's end, S_ab = y Ks_b^T, and crosses
the whole segment with one product, y <- y M_s. With segments of about sqrt(blocks) blocks
most block pairs cost two products (S and P V) instead of four.

With R reflections per token W_b and U_b hold the block's BT * R reflections (`_common`);
everything else has one row per token. In the loops every product has 16-bit operands for
16-bit inputs and float32 accumulation: the logits and P V in the inputs' dtype, the
transitions in float16 (`_common.transition_dtype`); the state x stays float32.

Gate terms (PaTH-FoX): G is the per-sequence cumulative sum of g, kept in float64. Inside
the query block the kernel forms G_i - G_j in float64 and rounds it once. Against an earlier
key block b it adds three float32 terms, (G_i - G_a0) + (G_a0 - G_b1) - (G_j - G_b1), with
a0 the query block's first token and b1 the key block's last: the first and last come
rounded from `block_gate_offsets` (per token, relative to its block's first and last
token), the middle one is a float64 difference of two scalars, rounded once per block
pair. With g <= 0 (log forget gates) all three are <= 0, so their float32 sum is as exact
as the float64 difference rounded once, however large the gates between j and i, and no
float64 arithmetic runs per logit. The first term is the query's alone: it shifts the
row's running max instead of every logit.

Writes o [N, HQ, Dv] (q's dtype) and lse [N, HQ] (float32, natural log).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...common.triton_launch import launch_kernel
from ._common import (
    block_reflections,
    device_fn,
    exp_ftz,
    full_block_reflections,
    gate_ptrs,
    load_block,
    load_input,
    load_raw,
    load_tile,
    mm,
    mm_lp,
    reflection_tile,
    reflection_tokens,
    row_offsets,
    tile_ptrs,
    transition_dtype,
)
from .segments import times_e, times_e_stored

__all__ = ["fwd_scan"]


@device_fn
def query_block_start(q_ptr, k_ptr, wt_ptr, u_ptr, m_ptr, g_ptr, gs_ptr, rows, rmask, t0, s1,
                      hq, h, scale, HQ, H, D, NTOK, cols, cmask, HAS_G: tl.constexpr,
                      BT: tl.constexpr, PREC: tl.constexpr, R: tl.constexpr,
                      BTR: tl.constexpr):
    """Q~ (scaled), the masked in-block logits S [BT, BT] (gates included), and the
    queries' gates: gq = G_i - G_t0 ([BT] float32) and ga = G_t0 (float64; both zero
    without gates) of one query block (tokens t0 .. t0 + BT - 1, its sequence ending at
    s1). In-block gate terms G_i - G_j are formed in float64 and then cast."""
    cbt = tl.arange(0, BT)
    wrows, wmask = block_reflections(t0, s1, BT, R, BTR)
    Q = load_input(q_ptr, rows, rmask, HQ * D, hq * D, cols, cmask).to(tl.float32) * scale
    incl = cbt[:, None] >= reflection_tokens(R, BTR)[None, :]  # [BT, BTR]
    # each operand loaded just before its product: their shared-memory buffers never overlap
    W = load_tile(wt_ptr, wrows, wmask, H * D, h * D, cols, cmask)  # [BTR, BD]
    QW = tl.where(incl, mm(Q, tl.trans(W), PREC), 0.0)
    K = load_input(k_ptr, rows, rmask, H * D, h * D, cols, cmask).to(tl.float32)
    S = mm(Q, tl.trans(K), PREC)
    M = load_tile(m_ptr, wrows, wmask, H * BT, h * BT, cbt, cbt < BT)  # [BTR, BT]
    S -= mm(QW, M, PREC)
    U = load_tile(u_ptr, wrows, wmask, H * D, h * D, cols, cmask)  # [BTR, BD]
    x = Q - mm(QW, U, PREC)
    gq = tl.zeros([BT], dtype=tl.float32)
    ga = 0.0
    if HAS_G:
        g64 = tl.load(g_ptr + row_offsets(rows, HQ, hq), mask=rmask, other=0.0)
        S += (g64[:, None] - g64[None, :]).to(tl.float32)
        gq = tl.load(gate_ptrs(gs_ptr, hq, NTOK, t0, cbt), mask=rmask, other=0.0)
        ga = tl.load(g_ptr + row_offsets(t0, HQ, hq))
    keep = (cbt[:, None] >= cbt[None, :]) & rmask[None, :]
    S = tl.where(keep, S, float("-inf"))
    return x, S, gq, ga


@device_fn
def key_block_logits(x, kt_ptr, g_ptr, ge_ptr, kr, tb, hq, h, ga, HQ, H, D, NTOK, cols,
                     cmask, HAS_G: tl.constexpr, BT: tl.constexpr, DT: tl.constexpr,
                     PREC: tl.constexpr, EMULATE: tl.constexpr, HOIST: tl.constexpr,
                     KB: tl.constexpr):
    """Logits [rows of x, KB] of the query state x against the KB keys from token tb
    (tokens kr; KB / BT full blocks), and those keys K~ (in the inputs' dtype DT, the
    operand dtype of the product). Gates (ga of `query_block_start`): the module
    docstring's last two terms, one per key and one per key block; the queries' own term gq
    is the caller's, added per row to the running max (forward) or taken out of the
    log-sum-exp (backward). HOIST: load the keys through loop-invariant offsets
    (`load_block`; the forward), else per-element offsets (the backward, where the held
    offsets raised its register spills)."""
    if HOIST:
        Kt = load_block(kt_ptr, tb, KB, H * D, h * D, cols, cmask)
    else:
        Kt = load_raw(kt_ptr, kr, kr >= 0, H * D, h * D, cols, cmask)
    S = mm_lp(x, tl.trans(Kt), DT, PREC, EMULATE)
    if HAS_G:
        lk = tl.arange(0, KB)
        ge = tl.load(gate_ptrs(ge_ptr, hq, NTOK, tb, lk))  # G_j - G_b1
        if KB == BT:
            gab = (ga - tl.load(g_ptr + row_offsets(tb + BT - 1, HQ, hq))).to(tl.float32)
        else:  # b1, the last token of each key's own block
            b1 = tb + lk // BT * BT + BT - 1
            gab = (ga - tl.load(g_ptr + row_offsets(b1, HQ, hq))).to(tl.float32)
        S += (gab - ge)[None, :]
    return S, Kt


@device_fn
def apply_transition(x, wt_ptr, u_ptr, tb, h, H, D, cols, cmask, PREC: tl.constexpr,
                     BT: tl.constexpr, R: tl.constexpr, BTR: tl.constexpr,
                     TDT: tl.constexpr, EMULATE: tl.constexpr):
    """x Pt_b = x - (x W_b^T) U_b for the full block b starting at token tb: operands in
    TDT (`_common.transition_dtype`), float32 accumulation, x itself stays float32."""
    if BT * R == BTR:  # no padding rows: a whole block of reflections
        Wb = load_block(wt_ptr, tb * R, BTR, H * D, h * D, cols, cmask)  # [BTR, BD]
        Ub = load_block(u_ptr, tb * R, BTR, H * D, h * D, cols, cmask)
    else:
        wr, wmask = full_block_reflections(tb, BT, R, BTR)
        Wb = load_raw(wt_ptr, wr, wmask, H * D, h * D, cols, cmask)
        Ub = load_raw(u_ptr, wr, wmask, H * D, h * D, cols, cmask)
    xw = mm_lp(x, tl.trans(Wb), TDT, PREC, EMULATE)  # [BT, BTR]
    return x - mm_lp(xw, Ub, TDT, PREC, EMULATE)


@device_fn
def _attend(x, k_ptr, g_ptr, ge_ptr, tb, hq, h, ga, gq, m_i, l_i, acc, v_ptr, HQ, H, D, DV,
            NTOK, cols, cmask, vcols, vmask, HAS_G: tl.constexpr, BT: tl.constexpr,
            KB: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr, EMULATE: tl.constexpr):
    """Online softmax step of the query state x against the KB keys (full blocks) from
    token tb (`key_block_logits`): the running max m_i, sum l_i and acc [BT, BDV] after the
    logits S + gq [BT, KB] (gq [BT]: the queries' gate term, added per row, with gates
    only)."""
    S, _ = key_block_logits(x, k_ptr, g_ptr, ge_ptr, tb + tl.arange(0, KB), tb, hq, h, ga, HQ,
                            H, D, NTOK, cols, cmask, HAS_G, BT, DT, PREC, EMULATE, True, KB)
    if HAS_G:  # the row term shifts the max, not every logit
        m_new = tl.maximum(m_i, tl.max(S, axis=1) + gq)
        P = exp_ftz(S - (m_new - gq)[:, None])
    else:
        m_new = tl.maximum(m_i, tl.max(S, axis=1))
        P = exp_ftz(S - m_new[:, None])
    alpha = exp_ftz(m_i - m_new)
    l_i = l_i * alpha + tl.sum(P, axis=1)
    Vb = load_block(v_ptr, tb, KB, H * DV, h * DV, vcols, vmask)
    acc = acc * alpha[:, None] + mm_lp(P, Vb, DT, PREC, EMULATE)
    return m_new, l_i, acc


@triton.jit
def _fwd_kernel(q_ptr, k_ptr, v_ptr, wt_ptr, u_ptr, kt_ptr, m_ptr, g_ptr, gs_ptr, ge_ptr,
                ks_ptr, ms_ptr, slot_ptr, xsc_ptr, o_ptr, lse_ptr, table_ptr, scale, SEG, HQ, H,
                D, DV,
                NTOK, G: tl.constexpr, HAS_G: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
                BDV: tl.constexpr, BK: tl.constexpr, DT: tl.constexpr, TDT: tl.constexpr,
                PREC: tl.constexpr, EMULATE: tl.constexpr, R: tl.constexpr,
                BTR: tl.constexpr, PIPE: tl.constexpr = 1, KSTEP: tl.constexpr = 1):
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
    x, S, gq, ga = query_block_start(q_ptr, k_ptr, wt_ptr, u_ptr, m_ptr, g_ptr, gs_ptr, rows,
                                     rmask, t0, s1, hq, h, scale, HQ, H, D, NTOK, cols, cmask,
                                     HAS_G, BT, PREC, R, BTR)
    m_i = tl.max(S, axis=1)
    P = exp_ftz(S - m_i[:, None])
    l_i = tl.sum(P, axis=1)
    V = load_raw(v_ptr, rows, rmask, H * DV, h * DV, vcols, vmask)
    acc = mm_lp(P, V, DT, PREC, EMULATE)
    a = (t0 - s0) // BT  # local index of the query block
    sa = a // SEG  # its segment
    for ib in range(0, a - sa * SEG):  # own segment: blocks a-1, ..., its first
        tb = t0 - (ib + 1) * BT
        m_i, l_i, acc = _attend(x, kt_ptr, g_ptr, ge_ptr, tb, hq, h, ga, gq, m_i, l_i, acc,
                                v_ptr, HQ, H, D, DV, NTOK, cols, cmask, vcols, vmask, HAS_G,
                                BT, BT, DT, PREC, EMULATE)
        x = apply_transition(x, wt_ptr, u_ptr, tb, h, H, D, cols, cmask, PREC, BT, R, BTR, TDT,
                             EMULATE)
    for js in range(0, sa):  # earlier segments, right to left; x = y^(s)
        sc = sa - 1 - js
        # plain attention against the keys moved to the end of sc, KSTEP blocks a step (the
        # last SEG % KSTEP one at a time), PIPE loads in flight
        for j in tl.range(0, SEG - SEG % KSTEP, KSTEP, num_stages=PIPE):
            m_i, l_i, acc = _attend(x, ks_ptr, g_ptr, ge_ptr, s0 + (sc * SEG + j) * BT, hq, h,
                                    ga, gq, m_i, l_i, acc, v_ptr, HQ, H, D, DV, NTOK, cols,
                                    cmask, vcols, vmask, HAS_G, BT, KSTEP * BT, DT, PREC,
                                    EMULATE)
        if KSTEP > 1:
            for j in range(SEG - SEG % KSTEP, SEG):
                m_i, l_i, acc = _attend(x, ks_ptr, g_ptr, ge_ptr, s0 + (sc * SEG + j) * BT, hq,
                                        h, ga, gq, m_i, l_i, acc, v_ptr, HQ, H, D, DV, NTOK,
                                        cols, cmask, vcols, vmask, HAS_G, BT, BT, DT, PREC,
                                        EMULATE)
        if sc > 0:  # across the whole segment: y^(sc-1) = y^(sc) M_sc
            slot = tl.load(slot_ptr + blk) - sa + sc  # the slot of segment sc
            if BK == BD:
                x = times_e(x, ms_ptr, slot, h, H, cols, BD, PREC, TDT, EMULATE)
            else:  # x in TDT through memory, read back BK columns at a time
                x = times_e_stored(x, xsc_ptr, rows, rmask, HQ * D, hq * D, D, ms_ptr, slot,
                                   h, H, BT, BD, BK, PREC, TDT, EMULATE)
    o = acc / l_i[:, None]
    tl.store(tile_ptrs(o_ptr, rows, HQ * DV, hq * DV, vcols), o,
             mask=rmask[:, None] & vmask[None, :])
    tl.store(lse_ptr + row_offsets(rows, HQ, hq), m_i + tl.log(l_i), mask=rmask)


def fwd_scan(q, k, v, w, u, kt, m, G, ks, ms, slots, table, scale: float, seg: int, BT: int,
             BD: int, BDV: int, BK: int, dt, tdt, prec: str, emulate: bool,
             launch: dict | None = None):
    """q [N, HQ, D]; k, kt [N, H, D]; v [N, H, Dv]; w, u [N * R, H, D] and m [N * R, H, BT]
    (R reflections per token); G the gates of `op._cumulative_gates` or None; ks, ms, slots
    the segment keys, transitions and slots of `segments.segment_keys` for segments of
    `seg` blocks; BK the rows of a segment transition read at a time; dt, tdt the triton
    dtypes of the inputs and of the transitions' operands. Returns o [N, HQ, Dv] (q's
    dtype) and lse [N, HQ] float32."""
    N, HQ, D = q.shape
    H, Dv = k.shape[1], v.shape[-1]
    R = w.shape[0] // max(N, 1)
    o = torch.empty(N, HQ, Dv, dtype=q.dtype, device=q.device)
    lse = torch.empty(N, HQ, dtype=torch.float32, device=q.device)
    grid = (table.shape[0], HQ)
    g64, (gs, ge) = G if G is not None else (lse, (lse, lse))
    # the state crossing a segment, read back BK columns at a time (BK < BD)
    xsc = (torch.empty(N, HQ, D, dtype=transition_dtype(q.dtype), device=q.device)
           if BK < BD else u)
    launch_kernel(_fwd_kernel, grid)(
        q, k, v, w, u, kt, m, g64, gs, ge, ks, ms, slots, xsc, o, lse, table, scale, seg, HQ, H, D,
        Dv, N, G=HQ // H, HAS_G=G is not None, BT=BT, BD=BD, BDV=BDV, BK=BK, DT=dt,
        TDT=tdt, PREC=prec, EMULATE=emulate, R=R, BTR=reflection_tile(BT, R), **(launch or {}))
    return o, lse
