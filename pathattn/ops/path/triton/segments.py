"""Segments of key blocks: the keys moved to their segment's end, and whole-segment
transitions, so that the scans meet most key blocks as plain attention.

A sequence's blocks are grouped into segments of SEG consecutive blocks (the last may be
shorter). In the row form of `fwd.py` (the query state x^(c) of query block a meets key
block c in S_ac = x^(c) K~_c^T, and x^(c-1) = x^(c) Pt_c), for a key block c of segment s
before the query's segment, with e the last block of s and f its first,

    E_c = Pt_e Pt_{e-1} ... Pt_{c+1}       (identity for c = e)
    x^(c) = y^(s) E_c,   y^(s) = x^(e)     (the state entering s from the right)
    S_ac = y^(s) Ks_c^T,  Ks_c = K~_c E_c^T            (the keys moved to their segment's end)
    y^(s-1) = y^(s) M_s,  M_s = E_f Pt_f               (the whole segment's transition)

so a query state crosses a segment with one D x D product and meets the segment's key
blocks without a transition in between. `_seg_kernel` computes per block E_c (stored when
the backward asks for it) and Ks_c, and per segment M_s: one program per block forming
its E_c from the segment's end, or (WALK, `config.SEG_WALK`) one program per segment
walking it right to left with E_c = E_{c+1} Pt_{c+1}, one transition product per block
in all. Both do the same operations in the same order: their results are bitwise equal.
M_s of every crossed segment is stored in a compact slot table (`segment_slots`); the last
segment of each sequence is never crossed and the first never needs its product, so neither
is stored.

Ks has the inputs' dtype (the operand dtype of the logits); E and M the transitions' operand
dtype (`_common.transition_dtype`).

Backward. The backward scan meets earlier segments the same way and leaves, per block, the
gradient dKs_c of its moved keys and, per crossed segment, the gradient dM_s of its whole
transition (float32, summed over the query heads of a key head). `_seg_bwd_kernel` then
carries them back through the definitions above, per segment, left to right:

    dK~_c += dKs_c E_c,   dE_c += dKs_c^T K~_c,   dE_f += dM_s Pt_f^T,  dPt_f += E_f^T dM_s,
    E_c = E_{c+1} Pt_{c+1}:   dPt_{c+1} += E_{c+1}^T dE_c,   dE_{c+1} += dE_c Pt_{c+1}^T,

and a transition's gradient reaches its reflections as dU = -W dPt, dW = -U dPt^T (added
to the backward's dU and direct dW buffers, which `ut.ut_bwd` consumes). Rows of E evolve
independently, so each program takes min(BD, BT) rows of E; their sums meet in relaxed
atomic adds, once per block.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...common.triton_launch import launch_kernel
from ._common import (
    block_ptrs,
    block_reflections,
    device_fn,
    e_offsets,
    e_ptrs,
    load_raw,
    mm_lp,
    reflection_tile,
    tile_ptrs,
)

__all__ = ["segment_slots", "segment_keys", "segment_grads", "times_e", "cross_back",
           "times_e_sliced", "times_e_stored", "cross_back_sliced"]


def segment_slots(table: torch.Tensor, seg: int, BT: int, n_seq: int
                  ) -> tuple[torch.Tensor, int]:
    """Slot of each block's segment in the table of whole-segment transitions: int32 [NB]
    (slot = slots before the sequence + local block // seg; the segments of a sequence have
    consecutive slots) and the number of slots to allocate (an upper bound: NB // seg +
    n_seq + 1). Built on the device from the block table, no host read."""
    t0, s0, s1 = table.long().unbind(1)
    c = (t0 - s0) // BT
    n_segments = ((s1 - s0 + BT - 1) // BT + seg - 1) // seg  # 0 on the table's empty rows
    first = (c == 0) & (t0 < s1)
    through = torch.where(first, n_segments, 0).cumsum(0)  # slots up to this sequence's end
    slots = through - n_segments + c // seg
    return slots.to(torch.int32), table.shape[0] // seg + n_seq + 1


@triton.jit
def _seg_kernel(wt_ptr, u_ptr, kt_ptr, e_ptr, ks_ptr, ms_ptr, slot_ptr, table_ptr, H, D, SEG,
                BT: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr, PREC: tl.constexpr,
                R: tl.constexpr, BTR: tl.constexpr, DT: tl.constexpr, TDT: tl.constexpr,
                STORE_E: tl.constexpr, EMULATE: tl.constexpr, WALK: tl.constexpr = False):
    blk = tl.program_id(0)
    h = tl.program_id(1)
    r0 = tl.program_id(2) * BR  # this program's rows r0 .. r0 + BR - 1 of E
    t0 = tl.load(table_ptr + blk * 3)
    s0 = tl.load(table_ptr + blk * 3 + 1)
    s1 = tl.load(table_ptr + blk * 3 + 2)
    if t0 >= s1:  # an empty row of the table
        return
    c = (t0 - s0) // BT
    if WALK:  # a segment's first block walks the segment, the others have nothing to do
        if c % SEG != 0:
            return
    last = (s1 - s0 + BT - 1) // BT - 1
    e = tl.minimum((c // SEG + 1) * SEG - 1, last)
    crossed = (c // SEG > 0) & (e < last)  # M_s = E_f Pt_f is needed
    cols = tl.arange(0, BD)
    cmask = cols < D
    rr = r0 + tl.arange(0, BR)
    # rows of a product of transitions evolve independently: E[rr] <- E[rr] - (E[rr] W^T) U
    E = tl.where(rr[:, None] == cols[None, :], 1.0, 0.0)  # [BR, BD]
    if WALK:  # right to left over the segment, E_b = E_{b+1} Pt_{b+1} from E_e = I; each
        # E is used in the step that forms it, so that the loop carries it in one layout
        _block_keys(E, kt_ptr, e_ptr, ks_ptr, blk + e - c, s0 + e * BT, s1, h, H, D, cols,
                    cmask, rr, BT, BD, PREC, DT, EMULATE, STORE_E)
        for i in range(0, e - c):  # blocks e - 1, ..., c (e may be partial)
            b = e - i
            E = _times_transition(E, wt_ptr, u_ptr, s0 + b * BT, s1, h, H, D, cols, cmask,
                                  BT, PREC, R, BTR, TDT, EMULATE)  # E_{b-1} = E_b Pt_b
            _block_keys(E, kt_ptr, e_ptr, ks_ptr, blk + b - 1 - c, s0 + (b - 1) * BT, s1, h,
                        H, D, cols, cmask, rr, BT, BD, PREC, DT, EMULATE, STORE_E)
        if crossed:  # M_s = E_f Pt_f
            E = _times_transition(E, wt_ptr, u_ptr, t0, s1, h, H, D, cols, cmask, BT, PREC,
                                  R, BTR, TDT, EMULATE)
    else:  # this block's E_c from the segment's end, one program per block
        for i in range(0, e - c):  # blocks e, e-1, ..., c+1 (e may be partial)
            E = _times_transition(E, wt_ptr, u_ptr, s0 + (e - i) * BT, s1, h, H, D, cols,
                                  cmask, BT, PREC, R, BTR, TDT, EMULATE)
        _block_keys(E, kt_ptr, e_ptr, ks_ptr, blk, t0, s1, h, H, D, cols, cmask, rr, BT, BD,
                    PREC, DT, EMULATE, STORE_E)
        if (c % SEG == 0) & crossed:  # a crossed segment's first block f
            M = _times_transition(E, wt_ptr, u_ptr, t0, s1, h, H, D, cols, cmask, BT, PREC, R,
                                  BTR, TDT, EMULATE)
            tl.store(ms_ptr + e_offsets(tl.load(slot_ptr + blk), h, H, rr, cols, BD), M)
    if WALK:
        if crossed:
            tl.store(ms_ptr + e_offsets(tl.load(slot_ptr + blk), h, H, rr, cols, BD), E)


@device_fn
def _times_transition(E, wt_ptr, u_ptr, tb, s1, h, H, D, cols, cmask, BT: tl.constexpr,
                      PREC: tl.constexpr, R: tl.constexpr, BTR: tl.constexpr,
                      TDT: tl.constexpr, EMULATE: tl.constexpr):
    """E Pt_b = E - (E W_b^T) U_b for the block from token tb (the sequence ending at s1);
    W_b and U_b through one int64 base and int32 offsets inside the block (`block_ptrs`)."""
    _, kmask = block_reflections(tb, s1, BT, R, BTR)  # [BTR]
    lr = tl.arange(0, BTR)
    m = kmask[:, None] & cmask[None, :]
    Wb = tl.load(block_ptrs(wt_ptr, tb * R, lr, H * D, h * D, cols), mask=m, other=0.0)
    Ub = tl.load(block_ptrs(u_ptr, tb * R, lr, H * D, h * D, cols), mask=m, other=0.0)
    return E - mm_lp(mm_lp(E, tl.trans(Wb), TDT, PREC, EMULATE), Ub, TDT, PREC, EMULATE)


@device_fn
def _block_keys(E, kt_ptr, e_ptr, ks_ptr, row, tb, s1, h, H, D, cols, cmask, rr,
                BT: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr, DT: tl.constexpr,
                EMULATE: tl.constexpr, STORE_E: tl.constexpr):
    """The block from token tb (table row `row`): Ks[:, rr] = K~ E[rr]^T, and E stored."""
    if STORE_E:
        tl.store(e_ptrs(e_ptr, row, h, H, rr, cols, BD), E)
    lt = tl.arange(0, BT)
    rmask = tb + lt < s1
    Kt = tl.load(block_ptrs(kt_ptr, tb, lt, H * D, h * D, cols),
                 mask=rmask[:, None] & cmask[None, :], other=0.0)  # [BT, BD]
    ks = mm_lp(Kt, tl.trans(E), DT, PREC, EMULATE)  # [BT, BR]
    tl.store(block_ptrs(ks_ptr, tb, lt, H * D, h * D, rr), ks,
             mask=rmask[:, None] & (rr < D)[None, :])


def segment_keys(w, u, kt, table, slots, n_slots: int, seg: int, BT: int, BD: int, prec: str,
                 dt, tdt, emulate: bool, R: int = 1, store_e: bool = False,
                 launch: dict | None = None, walk: bool = False):
    """Ks [N, H, D] (kt's dtype), M [n_slots, H, BD, BD] and, with store_e, E [NB, H, BD,
    BD] (u's dtype; else None) from w, u [N * R, H, D] (R reflections per token) and the
    block keys kt [N, H, D]; see the module docstring. One program per block, head and
    group of min(BD, BT) rows of E; with walk, per segment (`config.SEG_WALK`)."""
    N, H, D = kt.shape
    BR = min(BD, BT)
    ks = torch.empty_like(kt)
    ms = torch.empty(n_slots, H, BD, BD, dtype=u.dtype, device=u.device)
    e = (torch.empty(table.shape[0], H, BD, BD, dtype=u.dtype, device=u.device) if store_e
         else ms)
    launch_kernel(_seg_kernel, (table.shape[0], H, BD // BR))(
        w, u, kt, e, ks, ms, slots, table, H, D, seg, BT=BT, BD=BD, BR=BR, PREC=prec, R=R,
        BTR=reflection_tile(BT, R), DT=dt, TDT=tdt, STORE_E=store_e, EMULATE=emulate,
        WALK=walk, **(launch or {}))
    return ks, ms, (e if store_e else None)


@triton.jit
def _seg_bwd_kernel(wt_ptr, u_ptr, kt_ptr, e_ptr, dks_ptr, dms_ptr, slot_ptr, dkt_ptr, du_ptr,
                    dwp_ptr, table_ptr, H, D, SEG, BT: tl.constexpr, BD: tl.constexpr,
                    BR: tl.constexpr, PREC: tl.constexpr, R: tl.constexpr, BTR: tl.constexpr,
                    DT: tl.constexpr, TDT: tl.constexpr, EMULATE: tl.constexpr):
    blk = tl.program_id(0)  # a segment's first block, else nothing to do
    h = tl.program_id(1)
    r0 = tl.program_id(2) * BR  # this program's rows r0 .. r0 + BR - 1 of E
    t0 = tl.load(table_ptr + blk * 3)
    s0 = tl.load(table_ptr + blk * 3 + 1)
    s1 = tl.load(table_ptr + blk * 3 + 2)
    if t0 >= s1:  # an empty row of the table
        return
    f = (t0 - s0) // BT
    if f % SEG != 0:
        return
    last = (s1 - s0 + BT - 1) // BT - 1
    e = tl.minimum(f + SEG - 1, last)
    cols = tl.arange(0, BD)
    cmask = cols < D
    rr = r0 + tl.arange(0, BR)
    rmask_e = rr < D
    lt = tl.arange(0, BT)
    lw = tl.arange(0, BTR)
    G = tl.zeros([BR, BD], dtype=tl.float32)  # rows rr of dE, carried left to right
    for i in range(0, e - f + 1):  # blocks f .. e of the segment
        b = f + i
        tb = s0 + b * BT
        Eb = tl.load(e_ptr + e_offsets(blk + i, h, H, rr, cols, BD))  # [BR, BD]
        wr, wmask = block_reflections(tb, s1, BT, R, BTR)
        Wb = load_raw(wt_ptr, wr, wmask, H * D, h * D, cols, cmask)  # [BTR, BD]
        Ub = load_raw(u_ptr, wr, wmask, H * D, h * D, cols, cmask)
        crossed = (f > 0) & (e < last)  # M_s = E_f Pt_f exists and was crossed
        if (i == 0) & crossed:
            G = tl.load(dms_ptr + e_offsets(tl.load(slot_ptr + blk), h, H, rr, cols, BD))
        if (i > 0) | crossed:  # dPt_b = E_b^T G (G = dE_{b-1}, or dM at b = f); G <- G Pt_b^T
            amask = wmask[:, None] & cmask[None, :]
            we = mm_lp(Wb, tl.trans(Eb), TDT, PREC, EMULATE)  # [BTR, BR]
            tl.atomic_add(block_ptrs(du_ptr, tb * R, lw, H * D, h * D, cols),
                          -mm_lp(we, G, TDT, PREC, EMULATE), mask=amask, sem="relaxed")
            ug = mm_lp(Ub, tl.trans(G), TDT, PREC, EMULATE)  # [BTR, BR]
            tl.atomic_add(block_ptrs(dwp_ptr, tb * R, lw, H * D, h * D, cols),
                          -mm_lp(ug, Eb, TDT, PREC, EMULATE), mask=amask, sem="relaxed")
            G = G - mm_lp(tl.trans(ug), Wb, TDT, PREC, EMULATE)
        # the block's moved keys: dK~_b += dKs_b[:, rr] E_b[rr], dE_b[rr] += dKs_b[:, rr]^T K~_b
        rows = tb + lt
        kmask = rows < s1
        dKs = load_raw(dks_ptr, rows, kmask, H * D, h * D, rr, rmask_e)  # [BT, BR] float32
        Kt = load_raw(kt_ptr, rows, kmask, H * D, h * D, cols, cmask)  # [BT, BD]
        tl.atomic_add(block_ptrs(dkt_ptr, tb, lt, H * D, h * D, cols),
                      mm_lp(dKs, Eb, DT, PREC, EMULATE), mask=kmask[:, None] & cmask[None, :],
                      sem="relaxed")
        G += mm_lp(tl.trans(dKs), Kt, DT, PREC, EMULATE)


def segment_grads(w, u, kt, e, dks, dms, table, slots, seg: int, BT: int, BD: int,
                  prec: str, dt, tdt, emulate: bool, dkt, du, dwp, R: int = 1,
                  launch: dict | None = None, rows: int | None = None) -> None:
    """Adds the gradients that flow through the segment keys and transitions (dks [N, H, D]
    and dms [n_slots, H, BD, BD], float32) to dkt [N, H, D] and du, dwp [N * R, H, D]
    (float32, in place); E as `segment_keys(store_e=True)` returned it. One program per
    segment, head and group of `rows` rows of E (a power of two dividing BD; default
    min(BD, BT); module docstring)."""
    BR = rows or min(BD, BT)
    if BD % BR:
        raise ValueError(f"rows must divide the padded head dim {BD}, got {BR}")
    H = kt.shape[1]
    launch_kernel(_seg_bwd_kernel, (table.shape[0], H, BD // BR))(
        w, u, kt, e, dks, dms, slots, dkt, du, dwp, table, H, kt.shape[2], seg, BT=BT, BD=BD,
        BR=BR, PREC=prec, R=R, BTR=reflection_tile(BT, R), DT=dt, TDT=tdt, EMULATE=emulate,
        **(launch or {}))


@device_fn
def cross_back(y, g, ms_ptr, dms_ptr, slot, h, H, cols, BD: tl.constexpr, PREC: tl.constexpr,
               TDT: tl.constexpr, EMULATE: tl.constexpr):
    """The backward walk entering segment s across its transition M = M_s (table row slot,
    head h), M read whole: with y = y^(s) and g the adjoint of y^(s-1) = y^(s) M, adds
    y^T g to dM and returns g M^T (the adjoint's share of y^(s)). Past BD = 64,
    `cross_back_sliced`."""
    tl.atomic_add(dms_ptr + e_offsets(slot, h, H, cols, cols, BD),
                  mm_lp(tl.trans(y), g, TDT, PREC, EMULATE), sem="relaxed")
    M = tl.load(ms_ptr + e_offsets(slot, h, H, cols, cols, BD))
    return mm_lp(g, tl.trans(M), TDT, PREC, EMULATE)


@device_fn
def times_e(y, e_ptr, blk, h, H, cols, BD: tl.constexpr, PREC: tl.constexpr,
            TDT: tl.constexpr, EMULATE: tl.constexpr):
    """y E for E of row blk, head h of a [*, H, BD, BD] table of products (E or M), E read
    whole (up to BD = 64; past that a whole tile would hold BD * BD / 128 values per thread
    of 4 warps, so the kernels read it a slice at a time: `times_e_sliced`)."""
    return mm_lp(y, tl.load(e_ptr + e_offsets(blk, h, H, cols, cols, BD)), TDT, PREC, EMULATE)


@device_fn
def times_e_sliced(y_ptr, rows, rmask, stride, col0, D, e_ptr, blk, h, H, BT: tl.constexpr,
                   BD: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr,
                   TDT: tl.constexpr, EMULATE: tl.constexpr):
    """y E as `times_e` for y [BT, BD] held in memory (y_ptr's rows `rows`, columns col0 +
    0 .. D - 1, zero past rmask) and E read BK rows at a time: y E = sum_k y[:, k] E[k, :],
    y's column slices read from memory. The same roundings as `times_e`."""
    ck = tl.arange(0, BK)
    cols = tl.arange(0, BD)
    x = tl.zeros([BT, BD], dtype=tl.float32)
    for k0 in range(0, BD, BK):
        yk = load_raw(y_ptr, rows, rmask, stride, col0 + k0, ck, k0 + ck < D)  # [BT, BK]
        Ek = tl.load(e_ptr + e_offsets(blk, h, H, k0 + ck, cols, BD))  # [BK, BD]
        x += mm_lp(yk, Ek, TDT, PREC, EMULATE)
    return x


@device_fn
def times_e_stored(x, buf_ptr, rows, rmask, stride, col0, D, e_ptr, blk, h, H,
                   BT: tl.constexpr, BD: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr,
                   TDT: tl.constexpr, EMULATE: tl.constexpr):
    """`times_e_sliced` for x [BT, BD] held in registers: x is first written in TDT to its
    rows of buf_ptr (rows, columns col0 + 0 .. D - 1), between two barriers (every thread
    has read the buffer's last contents, then every thread's rows are written)."""
    cols = tl.arange(0, BD)
    tl.debug_barrier()
    tl.store(tile_ptrs(buf_ptr, rows, stride, col0, cols), x.to(TDT),
             mask=rmask[:, None] & (cols < D)[None, :])
    tl.debug_barrier()
    return times_e_sliced(buf_ptr, rows, rmask, stride, col0, D, e_ptr, blk, h, H, BT, BD,
                          BK, PREC, TDT, EMULATE)


@device_fn
def cross_back_sliced(y_ptr, g_ptr, rows, rmask, stride, col0, D, g, ms_ptr, dms_ptr, slot,
                      h, H, BT: tl.constexpr, BD: tl.constexpr, BK: tl.constexpr,
                      PREC: tl.constexpr, TDT: tl.constexpr, EMULATE: tl.constexpr):
    """`cross_back` past BD = 64, M read BK columns at a time, with y and g also held in
    memory in TDT (y_ptr, g_ptr; rows and columns as `times_e_sliced`): dM[k, :] +=
    y[:, k]^T g and g M^T = sum_k g[:, k] M[:, k]^T, accumulated in float32, with no
    selection products."""
    ck = tl.arange(0, BK)
    cols = tl.arange(0, BD)
    out = tl.zeros([BT, BD], dtype=tl.float32)
    for k0 in range(0, BD, BK):
        kmask = k0 + ck < D
        yk = load_raw(y_ptr, rows, rmask, stride, col0 + k0, ck, kmask)  # [BT, BK]
        tl.atomic_add(dms_ptr + e_offsets(slot, h, H, k0 + ck, cols, BD),
                      mm_lp(tl.trans(yk), g, TDT, PREC, EMULATE), sem="relaxed")
        gk = load_raw(g_ptr, rows, rmask, stride, col0 + k0, ck, kmask)
        Mk = tl.load(ms_ptr + e_offsets(slot, h, H, cols, k0 + ck, BD))  # M[:, k0 + ck]
        out += mm_lp(gk, tl.trans(Mk), TDT, PREC, EMULATE)
    return out
