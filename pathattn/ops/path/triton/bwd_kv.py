"""Key-parallel part of the backward: the gradients that the block pairs of different
segments send to the keys and values, without atomics.

One program per (key tile, query head): BKT keys of a block, or BKT / BT whole blocks of
one segment (the segment's last blocks may fill a tile only partly; docs/ops.md, "Key
tiles over several blocks"). The query blocks of later segments meet key block c as
plain attention (`segments.py`): a query block of segment p with state ys entering segment
p - 1 (`bwd.py` stores it) sees c, of segment s < p, through the keys moved to the end of
segment p - 1, K' = Ks_c Pi_{p-1,s}^T (`crossings.py`), with logits S = ys K'^T. The
program walks the later segments left to right, forms K' once per segment, and for each
step of the segment's queries (BQ rows: part of a block or several whole blocks) runs
FlashAttention-2's key-side step on the transposed logits:

    S^T = K' ys^T,  P^T = exp(S^T - lse),  dV += P^T dO,  dP^T = V dO^T,
    dS^T = P^T * (dP^T - delta),  dK' += dS^T ys

(four products per block pair, dV and dK' in registers), then returns dK' to the segment
keys, dKs += dK' Pi_{p-1,s}. The M_s inside Pi get their gradient from the query side
(`bwd.py`), so nothing else flows back here. Gates: the logits hold G_i - G_j, and the
keys' share of dL/dG, minus the column sums of dS, is added to the program's own rows. The
gate term is made of the forward's three float32 terms (`fwd.py`), (G_i - G_a0) +
(G_a0 - G_b1) - (G_j - G_b1) with a0 the first token of the query's block and b1 the last
of the key block; the first depends on the query only and is subtracted from its
log-sum-exp on the host, so the loop adds one scalar and one per-key term. With several
blocks per tile or per step the references move to the tile's last token B and the step's
first token a0', (G_a0 - G_a0') + (G_a0' - G_B) + (G_B - G_b1): the per-key part is summed
once per program, the per-query part enters the log-sum-exp, every reference point still
between key and query.

Writes dks per query head ([N, HQ, D] float32, every row; `bwd_scan` sums a key head's
query heads) and subtracts the column sums from dG [N, HQ] in place. dV: without GQA a
program owns its rows, adds the query kernel's part and writes the finished gradient in v's
dtype (no float32 sum and conversion on the host); with GQA it writes its part per query
head ([N, HQ, Dv] float32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...common.triton_launch import launch_kernel
from ._common import block_ptrs, exp_ftz, gate_ptrs, load_raw, mm_lp, row_offsets, tile_ptrs
from .crossings import pair_index, times_et, times_et_sliced
from .segments import times_e, times_e_stored

__all__ = ["launch_bwd_kv"]


@triton.jit
def _bwd_kv_kernel(ks_ptr, v_ptr, pi_ptr, pbase_ptr, g_ptr, ge_ptr, ysd_ptr, do_ptr, lse_ptr,
                   delta_ptr, dks_ptr, dksc_ptr, dv_ptr, dvq_ptr, dgate_ptr, table_ptr, SEG, HQ,
                   H, D, DV,
                   NTOK, G: tl.constexpr, HAS_G: tl.constexpr, BT: tl.constexpr, BKT: tl.constexpr,
                   BQ: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, BK: tl.constexpr,
                   DT: tl.constexpr, PREC: tl.constexpr, EMULATE: tl.constexpr,
                   PIPE: tl.constexpr = 1):
    SUB: tl.constexpr = BT // BKT if BKT <= BT else 1  # programs per block
    NB: tl.constexpr = BKT // BT if BKT > BT else 1  # blocks per program
    blk = tl.program_id(0) // SUB
    hq = tl.program_id(1)
    h = hq // G
    t0 = tl.load(table_ptr + blk * 3)
    s0 = tl.load(table_ptr + blk * 3 + 1)
    s1 = tl.load(table_ptr + blk * 3 + 2)
    k0 = t0 + tl.program_id(0) % SUB * BKT
    if k0 >= s1:  # an empty row of the table, or past the sequence's end
        return
    s = (t0 - s0) // BT // SEG  # this key block's segment
    if NB > 1:  # the first block of NB of a segment takes them all
        if (t0 - s0) // BT % SEG % NB != 0:
            return
    rows = k0 + tl.arange(0, BKT)
    kend = s1
    if NB > 1:  # within the segment
        kend = tl.minimum(s1, s0 + (s + 1) * SEG * BT)
    rmask = rows < kend
    cq = tl.arange(0, BQ)
    cols = tl.arange(0, BD)
    cmask = cols < D
    vcols = tl.arange(0, BDV)
    vmask = vcols < DV
    n_blk = (s1 - s0 + BT - 1) // BT
    n_seg = (n_blk + SEG - 1) // SEG
    base = tl.load(pbase_ptr + blk)
    vtile = rmask[:, None] & vmask[None, :]
    if G == 1:  # this program owns its rows of dV: it starts from the query kernel's part
        dV = tl.load(tile_ptrs(dv_ptr, rows, H * DV, h * DV, vcols), mask=vtile, other=0.0)
    else:
        dV = tl.zeros([BKT, BDV], dtype=tl.float32)
    dcol = tl.zeros([BKT], dtype=tl.float32)
    ge = tl.zeros([BKT], dtype=tl.float32)  # the keys' gates, G_j - G_b1
    kb1 = t0 + BT - 1  # the last token of the keys' block
    if HAS_G:
        ge = tl.load(gate_ptrs(ge_ptr, hq, NTOK, k0, tl.arange(0, BKT)), mask=rmask,
                     other=0.0)
        if NB > 1:  # b1 of the tile's last block for all: G_j - G_b1 - (G_b1' - G_b1)
            kb1 = tl.minimum(t0 + BKT, kend) - 1
            b1 = tl.minimum(t0 + (tl.arange(0, BKT) // BT + 1) * BT - 1, kb1)
            ge -= (tl.load(g_ptr + row_offsets(kb1, HQ, hq))
                   - tl.load(g_ptr + row_offsets(b1, HQ, hq))).to(tl.float32)
    V = load_raw(v_ptr, rows, rmask, H * DV, h * DV, vcols, vmask)
    # dKs waits in its own rows of dks between segments (one fewer tile in registers)
    # (pointer and mask tiles formed where they are used: none is live across the loops)
    lk = tl.arange(0, BKT)
    tl.store(block_ptrs(dks_ptr, k0, lk, HQ * D, hq * D, cols),
             tl.zeros([BKT, BD], dtype=tl.float32), mask=rmask[:, None] & cmask[None, :])
    for p in range(s + 1, n_seg):  # later segments, left to right: K' = Ks Pi_{p-1,s}^T
        if p - 1 == s:
            Ks = load_raw(ks_ptr, rows, rmask, H * D, h * D, cols, cmask)
        elif BK == BD:  # K' in the operand dtype, as Ks (half the registers of float32)
            Ks = times_et(load_raw(ks_ptr, rows, rmask, H * D, h * D, cols, cmask), pi_ptr,
                          pair_index(base, p - 1, s), h, H, cols, BD, DT, PREC, EMULATE).to(DT)
        else:  # BK columns of Ks at a time, read from memory
            Ks = times_et_sliced(ks_ptr, rows, rmask, H * D, h * D, D, pi_ptr,
                                 pair_index(base, p - 1, s), h, H, BKT, BD, BK, DT, PREC,
                                 EMULATE).to(DT)
        if BK < BD:  # K' waits in dksc's rows
            tl.debug_barrier()  # every thread has read the last segment's dK from there
            tl.store(block_ptrs(dksc_ptr, k0, lk, HQ * D, hq * D, cols), Ks,
                     mask=rmask[:, None] & cmask[None, :])
            tl.debug_barrier()
            # read back, a plain load: the products take it from shared memory, not
            # registers
            Ks = tl.load(block_ptrs(dksc_ptr, k0, lk, HQ * D, hq * D, cols),
                         mask=rmask[:, None] & cmask[None, :], other=0.0)
        dK = tl.zeros([BKT, BD], dtype=tl.float32)
        q0 = s0 + p * SEG * BT  # the segment's queries, BQ at a time
        q1 = tl.minimum(q0 + SEG * BT, s1)  # the segment's end
        n_q = (q1 - q0 + BQ - 1) // BQ
        for j in tl.range(0, n_q, num_stages=PIPE):  # PIPE loads in flight
            ta = q0 + j * BQ
            qrows = ta + cq
            if BQ > BT:  # within the segment
                qmask = qrows < q1
            else:
                qmask = qrows < s1
            if BK == BD:
                y_ptrs = block_ptrs(ysd_ptr, ta, cq, HQ * D, hq * D, cols)
                do_ptrs = block_ptrs(do_ptr, ta, cq, HQ * DV, hq * DV, vcols)
            else:  # offsets formed per step: no [BQ, BD] offset tile live across the loop
                y_ptrs = tile_ptrs(ysd_ptr, qrows, HQ * D, hq * D, cols)
                do_ptrs = tile_ptrs(do_ptr, qrows, HQ * DV, hq * DV, vcols)
            Y = tl.load(y_ptrs, mask=qmask[:, None] & cmask[None, :], other=0.0)
            dO = tl.load(do_ptrs, mask=qmask[:, None] & vmask[None, :], other=0.0)
            lse = tl.load(lse_ptr + row_offsets(qrows, HQ, hq), mask=qmask,
                          other=float("inf"))  # P = 0 for the rows past the sequence
            delta = tl.load(delta_ptr + row_offsets(qrows, HQ, hq), mask=qmask, other=0.0)
            ST = mm_lp(Ks, tl.trans(Y), DT, PREC, EMULATE)  # [BKT keys, BQ queries]
            if HAS_G:  # (G_i - G_a0) + (G_a0 - G_b1) - (G_j - G_b1), the first one in lse
                a0 = s0 + (ta - s0) // BT * BT  # the first query's block
                ga0 = tl.load(g_ptr + row_offsets(a0, HQ, hq))
                ST -= (ge - (ga0 - tl.load(g_ptr + row_offsets(kb1, HQ, hq))).to(tl.float32)
                       )[:, None]
                # the step's later query blocks (BQ > BT): G_a0 - G_b1 = (G_a0 - G_a0') +
                # (G_a0' - G_b1) with a0' the first block's start, each difference formed
                # in float64 (all terms of one sign, as in the forward)
                for m in tl.static_range(1, BQ // BT):
                    gam = tl.load(g_ptr + row_offsets(tl.minimum(a0 + m * BT, q1 - 1), HQ, hq))
                    lse -= tl.where(cq // BT == m, (gam - ga0).to(tl.float32), 0.0)
            PT = exp_ftz(ST - lse[None, :])
            dV += mm_lp(PT, dO, DT, PREC, EMULATE)
            dST = PT * (mm_lp(V, tl.trans(dO), DT, PREC, EMULATE) - delta[None, :])
            dK += mm_lp(dST, Y, DT, PREC, EMULATE)
            if HAS_G:
                dcol += tl.sum(dST, axis=1)
        if p - 1 != s:
            if BK == BD:
                dK = times_e(dK, pi_ptr, pair_index(base, p - 1, s), h, H, cols, BD, PREC, DT,
                             EMULATE)
            else:  # dK in DT through memory, read back BK columns at a time
                dK = times_e_stored(dK, dksc_ptr, rows, rmask, HQ * D, hq * D, D, pi_ptr,
                                    pair_index(base, p - 1, s), h, H, BKT, BD, BK, PREC, DT,
                                    EMULATE)
        dks_ptrs = block_ptrs(dks_ptr, k0, lk, HQ * D, hq * D, cols)
        kmask = rmask[:, None] & cmask[None, :]
        tl.store(dks_ptrs, tl.load(dks_ptrs, mask=kmask, other=0.0) + dK, mask=kmask)
    if G == 1:  # the finished gradient, in v's dtype
        tl.store(tile_ptrs(dvq_ptr, rows, H * DV, h * DV, vcols), dV, mask=vtile)
    else:
        tl.store(tile_ptrs(dvq_ptr, rows, HQ * DV, hq * DV, vcols), dV, mask=vtile)
    if HAS_G:  # this program owns its rows of dG for hq: the query kernel's adds are done
        gptrs = dgate_ptr + row_offsets(rows, HQ, hq)
        tl.store(gptrs, tl.load(gptrs, mask=rmask, other=0.0) - dcol, mask=rmask)


def launch_bwd_kv(ks, v, pi, pbase, G, ys, do, lse, delta, dG, dv, table, seg: int, BT: int,
                  BD: int, BDV: int, BK: int, dt, prec: str, emulate: bool,
                  tiles: tuple[int, int] | None = None, launch: dict | None = None):
    """dks [N, HQ, D] (float32) of the module docstring and the values' gradient:
    without GQA (HQ == H) the finished dv [N, H, Dv] in v's dtype, the query kernel's part
    dv [N, H, Dv] (float32) added; with GQA this kernel's part per query head [N, HQ, Dv]
    (float32), for the caller to sum. Subtracts the keys' column sums from dG [N, HQ] in
    place (when G, the gates of `op._cumulative_gates`, is given). ks [N, H, D], v [N, H,
    Dv], ys [N, HQ, D] and do [N, HQ, Dv] (the inputs' dtype), lse and delta [N, HQ]
    float32; pi and pbase of `crossings`. tiles: (BKT, BQ), the keys per program and the
    queries per step (powers of two, each dividing BT or a multiple of it; default (BT,
    BT))."""
    N, H, D = ks.shape
    HQ, Dv = do.shape[1], v.shape[-1]
    dks = torch.empty(N, HQ, D, dtype=torch.float32, device=ks.device)
    dvq = (torch.empty(N, H, Dv, dtype=v.dtype, device=ks.device) if HQ == H
           else torch.empty(N, HQ, Dv, dtype=torch.float32, device=ks.device))
    BKT, BQ = tiles or (BT, BT)
    for name, x in (("keys", BKT), ("queries", BQ)):
        if x < 1 or x & (x - 1):  # then it divides the block length or is a multiple of it
            raise ValueError(f"tiles: {name} per tile must be a power of two, got {x}")
    # tiles of several blocks no longer than a segment (a given short one): no tile mostly
    # masked
    most = BT * (1 << (max(seg, 1).bit_length() - 1))
    BKT, BQ = (x if x <= BT else min(x, most) for x in (BKT, BQ))
    g64, (gs, ge) = G if G is not None else (lse, (lse, lse))
    if G is not None:  # each query row's own gate term, G_i - G_a0, taken out of its lse
        lse = (lse - gs.t()).contiguous()
    # dK crossing segments, read back BK columns at a time (BK < BD)
    dksc = torch.empty(N, HQ, D, dtype=ks.dtype, device=ks.device) if BK < BD else ys
    launch_kernel(_bwd_kv_kernel, (table.shape[0] * max(BT // BKT, 1), HQ))(
        ks, v, pi, pbase, g64, ge, ys, do, lse, delta, dks, dksc, dv, dvq,
        dG if dG is not None else lse, table, seg, HQ, H, D, Dv, N, G=HQ // H,
        HAS_G=G is not None, BT=BT, BKT=BKT, BQ=BQ, BD=BD, BDV=BDV, BK=BK, DT=dt, PREC=prec,
        EMULATE=emulate, **(launch or {}))
    return dks, dvq
